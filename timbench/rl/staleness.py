"""Asynchronous RL's policy staleness: the engine samples with the policy of K updates ago (`staleness=K`).

In an asynchronous pipeline (AReaL, PipelineRL, Laminar) the rollouts of a
step come from weights that are K versions old, so the ratio the update needs
factors into a mismatch and a staleness factor (arXiv 2512.01374):

    pi_theta / mu_old = (pi_old^behav / mu_old) x (pi_theta / pi_old^behav)

where mu_old is the engine's logprob under the stale weights and
pi_old^behav the trainer's own logprob under those same weights. The
frameworks recompute pi_old in one of two ways, both offered by the trainer
key `stale_old`:

  current   the trainer's current weights (AReaL's decoupled PPO "proximal
            policy", verl's one-step-off-policy recompute): pi_old / mu then
            carries both factors, so a remedy on rho corrects their product;
  behavior  the weights that sampled: pi_old / mu is the mismatch alone and
            the staleness enters the PPO ratio pi_theta / pi_old.

In bypass mode pi_old is mu itself (PipelineRL; verl's separate async trainer
forces it). Either way the step logs both factors (`staleness/*`). K = 0 is
the synchronous loop, byte for byte: nothing here runs.
"""

from __future__ import annotations

from collections import deque

import torch

from ..metrics.ratios import k3, masked_mean, select

STALE_OLD = ("current", "behavior")


class PolicyHistory:
    """The last K+1 policy versions (parameter copies); the oldest is the one the engine samples with."""

    def __init__(self, staleness: int, model: torch.nn.Module):
        self.staleness = staleness
        self.versions: deque = deque(maxlen=staleness + 1)
        self.first = 0
        """Version number of versions[0] (the number of updates behind it)."""
        self.push(model)

    def push(self, model: torch.nn.Module) -> None:
        """Record the model's weights as the newest version (after an update, or the initial weights)."""
        if len(self.versions) == self.versions.maxlen:
            self.first += 1
        self.versions.append({k: v.detach().clone() for k, v in model.state_dict().items()})

    @property
    def behavior(self) -> dict:
        """The weights the engine samples with: min(K, updates done) versions old."""
        return self.versions[0]

    @property
    def lag(self) -> int:
        """How many updates old the behavior policy is now."""
        return len(self.versions) - 1

    def state(self) -> dict:
        return {"first": self.first, "versions": list(self.versions)}

    def restore(self, state: dict) -> None:
        self.versions = deque(state["versions"], maxlen=self.staleness + 1)
        self.first = state["first"]


def split_metrics(
    current: torch.Tensor, behavior: torch.Tensor, rollout: torch.Tensor, mask: torch.Tensor, lag: int
) -> dict[str, float]:
    """The ratio's two factors per token: mismatch log(pi_behav / mu) and staleness log(pi_cur / pi_behav).

    current, behavior: the trainer's logprobs under its current and the behavior weights; rollout: the
    engine's (mu); all [N, T] with the response mask. k3 is verl's rollout_corr/k3_kl estimator.
    """
    m = mask.bool()
    cur, beh, roll = current.double(), behavior.double(), rollout.double()
    d_mis, d_st = select(beh - roll, m), select(cur - beh, m)
    return {
        "staleness/lag": float(lag),
        "staleness/mismatch_k3": float(masked_mean(k3(d_mis), m)),
        "staleness/staleness_k3": float(masked_mean(k3(d_st), m)),
        "staleness/total_k3": float(masked_mean(k3(d_mis + d_st), m)),
        "staleness/mismatch_log_ratio_mean": float(masked_mean(d_mis, m)),
        "staleness/staleness_log_ratio_mean": float(masked_mean(d_st, m)),
    }
