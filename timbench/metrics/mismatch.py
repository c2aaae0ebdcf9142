"""Training-inference mismatch metrics between the trainer's old_logprobs (pi_old) and the engine's rollout_logprobs
(mu).

Pure functions over per-token tensors. Names follow verl's `rollout_corr/*` and
`training/rollout_probs_diff_*` (see shared/reference/tim-literature.md); the ratio quantities
(delta, log_rho, rho, k3, the +-20 clamp, masked means) are those of `timbench.metrics.ratios`. Every mean is
fixed-order (timbench.kernels.reduce), so the logged bits do not depend on the CPU or thread count.
"""

from __future__ import annotations

import torch

from ..kernels.pointwise import fexp
from ..kernels.reduce import fmean
from .ratios import k1, k3, log_rho, masked_mean, select, seq_log_ratio, seq_mean
from .schema import K3_KL, MAX_ABS_DELTA, MEAN_ABS_DELTA, P99_ABS_DELTA, PROBS_DIFF_MAX, PROBS_DIFF_MEAN

# Fixed |delta| histogram bins, shared by every run so histograms add across steps and cells.
# Bin 0 holds |delta| == 0 exactly (the zero-mismatch signature); bin 1 is (0, 1e-9); bins 2..10
# are the half-open decades [1e-9, 1e-8), ..., [1e-1, 1); bin 11 is [1, inf) (the ~1.0 outliers
# arXiv 2605.14220 reports). Each entry is (low, high).
ABS_DELTA_EDGES: tuple[float, ...] = tuple(float(f"1e{e}") for e in range(-9, 1))  # exact decimal literals
ABS_DELTA_BINS: tuple[tuple[float, float], ...] = (
    ((0.0, 0.0), (0.0, ABS_DELTA_EDGES[0]))
    + tuple(zip(ABS_DELTA_EDGES[:-1], ABS_DELTA_EDGES[1:]))
    + ((ABS_DELTA_EDGES[-1], float("inf")),)
)


def mismatch_metrics(
    old_logprobs: torch.Tensor,
    rollout_logprobs: torch.Tensor,
    mask: torch.Tensor | None = None,
    taus: tuple[float, ...] = (1.5, 2.0, 5.0),
) -> dict[str, float]:
    """All per-token and per-sequence mismatch statistics for a [B, T] (or flat) batch.

    old_logprobs: the trainer's logprobs of the sampled tokens (pi_old); rollout_logprobs: the engine's (mu).
    Masked-out positions are selected away, never multiplied by 0, so NaN or -inf padding cannot leak in;
    an empty mask gives every metric its zero-mismatch value (0, or 1 for ratios and the sample size).
    """
    old = old_logprobs.detach().double()
    roll = rollout_logprobs.detach().double()
    mask = torch.ones_like(old, dtype=torch.bool) if mask is None else mask.bool()
    if old.dim() == 1:
        old, roll, mask = old[None], roll[None], mask[None]
    n_tok = int(mask.sum())
    delta = select(old - roll, mask)
    lr = log_rho(old, roll, mask)
    rho = fexp(lr)
    abs_delta = delta.abs()[mask]
    seq_rows = mask.any(-1)
    log_rho_seq = seq_log_ratio(lr, mask)
    log_ppl_diff = (seq_mean(roll, mask) - seq_mean(old, mask))[seq_rows]
    w = rho[mask]
    probs_diff = (fexp(old) - fexp(roll)).abs()[mask]
    out = {
        "tokens": n_tok,
        "rollout_corr/kl": float(masked_mean(k1(delta), mask)),
        # Unclamped, as verl logs it: the +-20 clamp guards weights, not a divergence estimate.
        K3_KL: float(masked_mean(k3(delta), mask)),
        "rollout_corr/chi2_token": float(masked_mean(rho**2, mask) - 1) if n_tok else 0.0,
        "rollout_corr/chi2_seq": float(fmean(fexp(log_rho_seq[seq_rows] * 2)) - 1) if seq_rows.any() else 0.0,
        "rollout_corr/log_ppl_diff": float(fmean(log_ppl_diff)) if len(log_ppl_diff) else 0.0,
        "rollout_corr/log_ppl_abs_diff": float(fmean(log_ppl_diff.abs())) if len(log_ppl_diff) else 0.0,
        "rollout_corr/ppl_ratio": float(fmean(fexp(log_ppl_diff))) if len(log_ppl_diff) else 1.0,
        "rollout_corr/eff_sample_size": float(1.0 / fmean((w / fmean(w)) ** 2)) if n_tok else 1.0,
        PROBS_DIFF_MAX: float(probs_diff.max()) if n_tok else 0.0,
        PROBS_DIFF_MEAN: float(fmean(probs_diff)) if n_tok else 0.0,
        MAX_ABS_DELTA: float(abs_delta.max()) if n_tok else 0.0,
        MEAN_ABS_DELTA: float(fmean(abs_delta)) if n_tok else 0.0,
        P99_ABS_DELTA: float(torch.quantile(abs_delta, 0.99)) if n_tok else 0.0,
        "mismatch/frac_tokens_differ": float(fmean((abs_delta != 0).double())) if n_tok else 0.0,
    }
    ext = torch.maximum(rho, 1 / rho)[mask]
    for tau in taus:
        out[f"mismatch/extreme_frac_{tau:g}"] = float(fmean((ext > tau).double())) if n_tok else 0.0
    return out


def abs_delta_histogram(
    old_logprobs: torch.Tensor, rollout_logprobs: torch.Tensor, mask: torch.Tensor | None = None
) -> list[int]:
    """Counts of |log pi - log mu| over unmasked tokens in the fixed bins of `ABS_DELTA_BINS`.

    Returns len(ABS_DELTA_BINS) == 12 integers summing to the number of unmasked tokens. Computed
    in float64 without clamping, so a delta of exactly 0 lands in bin 0 and nothing else does.
    Raises ValueError on NaN deltas (a NaN logprob is a bug upstream, not a large mismatch).
    """
    delta = old_logprobs.detach().double() - rollout_logprobs.detach().double()
    if mask is not None:
        if mask.shape != delta.shape:
            raise ValueError(
                f"abs_delta_histogram: mask shape {tuple(mask.shape)} != logprob shape {tuple(delta.shape)}"
            )
        delta = delta[mask.bool()]
    abs_delta = delta.abs().flatten()
    if torch.isnan(abs_delta).any():
        raise ValueError(
            "abs_delta_histogram: NaN in old_logprobs - rollout_logprobs (a NaN logprob, or -inf on both sides)"
        )
    counts = [int((abs_delta == 0).sum())]
    nonzero = abs_delta[abs_delta != 0]
    edges = torch.tensor(ABS_DELTA_EDGES, dtype=torch.float64)
    # right=True: index i means edges[i-1] <= x < edges[i]; 0 means x < 1e-9, len(edges) means x >= 1.
    idx = torch.bucketize(nonzero, edges, right=True)
    counts += [int(c) for c in torch.bincount(idx, minlength=len(edges) + 1)]
    return counts


def routing_agreement(experts_a: torch.Tensor, experts_b: torch.Tensor) -> float:
    """Fraction of (token, layer) top-k expert sets that match; inputs [..., k] of expert ids."""
    a = torch.sort(experts_a, dim=-1).values
    b = torch.sort(experts_b, dim=-1).values
    same = (a == b).all(-1)
    return float(fmean(same.double())) if same.numel() else 1.0
