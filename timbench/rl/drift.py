"""Effective-objective drift between the trainer's and the engine's old policy (arXiv 2605.14220, Eq. 5).

Each token contributes C(r) = -(r - 1) * A to the zero-centred surrogate, with
r_train = pi_theta / pi_old^train (the trainer's recomputed old logprob) and
r_rollout = pi_theta / pi_old^rollout (the engine's). With no mismatch the two coincide and every
difference is exactly 0; under a mismatched engine they separate, and the paper reports that
recompute skews them by the sign of A rather than adding zero-mean noise, hence the split by sign.
"""

from __future__ import annotations

import torch

from ..kernels.pointwise import fexp
from ..metrics.ratios import log_ratio, masked_mean


def objective_drift(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    rollout_logprobs: torch.Tensor,
    adv: torch.Tensor,
    mask: torch.Tensor | None = None,
) -> dict[str, float]:
    """Token statistics of C(r_train) - C(r_rollout), C(r) = -(r - 1) * A.

    logprobs (pi_theta), old_logprobs (the trainer's pi_old), rollout_logprobs (the engine's mu): [N, T];
    adv: [N] (broadcast over tokens) or [N, T]; mask: [N, T] bool (default all ones).
    r_train = exp(log_ratio(logprobs, old_logprobs)), r_rollout = exp(log_ratio(logprobs, rollout_logprobs))
    (timbench.metrics.ratios: clamped at +-20); computed in float64, detached. Means run over unmasked tokens:
      drift/c_train_mean, drift/c_rollout_mean, drift/diff_mean, drift/diff_abs_mean,
      drift/diff_pos_adv_mean, drift/diff_neg_adv_mean (tokens with A > 0 / A < 0; 0.0 if none),
      drift/frac_pos_adv (fraction of tokens with A > 0).
    diff = -A * (r_train - r_rollout) = -A * pi_theta * (1/pi_old - 1/mu): the "-1" of C cancels, and
    diff is exactly 0.0 wherever old_logprobs == rollout_logprobs.
    """
    lp = logprobs.detach().double()
    a = adv.detach().double()
    a = (a[:, None] if a.dim() == 1 else a).expand_as(lp)
    m = torch.ones_like(lp, dtype=torch.bool) if mask is None else mask.detach().bool()

    def contribution(old: torch.Tensor) -> torch.Tensor:
        return -(fexp(log_ratio(lp, old.detach().double())) - 1) * a

    c_train, c_rollout = contribution(old_logprobs), contribution(rollout_logprobs)
    diff = c_train - c_rollout
    pos, neg = m & (a > 0), m & (a < 0)
    stat = lambda x, where: float(masked_mean(x, where))  # noqa: E731
    return {
        "drift/c_train_mean": stat(c_train, m),
        "drift/c_rollout_mean": stat(c_rollout, m),
        "drift/diff_mean": stat(diff, m),
        "drift/diff_abs_mean": stat(diff.abs(), m),
        "drift/diff_pos_adv_mean": stat(diff, pos),
        "drift/diff_neg_adv_mean": stat(diff, neg),
        "drift/frac_pos_adv": stat(pos.double(), m),
    }
