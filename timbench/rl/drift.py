"""Effective-objective drift between the trainer's and the engine's old policy (arXiv 2605.14220, Eq. 5).

Each token contributes C(r) = -(r - 1) * A to the zero-centred surrogate, with
r_train = pi_theta / pi_old^train (the trainer's recomputed old logprob) and
r_rollout = pi_theta / pi_old^rollout (the engine's). With no mismatch the two coincide and every
difference is exactly 0; under a mismatched engine they separate, and the paper reports that
recompute skews them by the sign of A rather than adding zero-mean noise, hence the split by sign.
"""

from __future__ import annotations

import torch

_CLAMP = 20.0  # log-ratio clamp before exp, as verl and timbench.rl.algorithms


def _masked_mean(x: torch.Tensor, m: torch.Tensor) -> float:
    n = m.sum()
    return float((x * m).sum() / n) if n > 0 else 0.0


def objective_drift(logp: torch.Tensor, old_logp_train: torch.Tensor, old_logp_rollout: torch.Tensor,
                    adv: torch.Tensor, mask: torch.Tensor | None = None) -> dict[str, float]:
    """Token statistics of C(r_train) - C(r_rollout), C(r) = -(r - 1) * A.

    logp, old_logp_train, old_logp_rollout: [N, T]; adv: [N] (broadcast over tokens) or [N, T];
    mask: [N, T] (default all ones). r = exp(clamp(logp - old_logp, -20, 20)); computed in float64,
    detached. Means run over unmasked tokens:
      drift/c_train_mean, drift/c_rollout_mean, drift/diff_mean, drift/diff_abs_mean,
      drift/diff_pos_adv_mean, drift/diff_neg_adv_mean (tokens with A > 0 / A < 0; 0.0 if none),
      drift/frac_pos_adv (fraction of tokens with A > 0).
    diff = -A * (r_train - r_rollout) = -A * pi_theta * (1/pi_old^train - 1/pi_old^rollout): the
    "-1" of C cancels, and diff is exactly 0.0 wherever old_logp_train == old_logp_rollout.
    """
    lp = logp.detach().double()
    a = adv.detach().double()
    a = (a[:, None] if a.dim() == 1 else a).expand_as(lp)
    m = torch.ones_like(lp) if mask is None else mask.detach().to(torch.float64)

    def contribution(old: torch.Tensor) -> torch.Tensor:
        r = (lp - old.detach().double()).clamp(-_CLAMP, _CLAMP).exp()
        return -(r - 1) * a

    c_train, c_rollout = contribution(old_logp_train), contribution(old_logp_rollout)
    diff = c_train - c_rollout
    pos, neg = m * (a > 0), m * (a < 0)
    return {
        "drift/c_train_mean": _masked_mean(c_train, m),
        "drift/c_rollout_mean": _masked_mean(c_rollout, m),
        "drift/diff_mean": _masked_mean(diff, m),
        "drift/diff_abs_mean": _masked_mean(diff.abs(), m),
        "drift/diff_pos_adv_mean": _masked_mean(diff, pos),
        "drift/diff_neg_adv_mean": _masked_mean(diff, neg),
        "drift/frac_pos_adv": _masked_mean(pos, m),
    }
