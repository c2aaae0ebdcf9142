"""Training-inference mismatch metrics between trainer logprobs (pi) and engine logprobs (mu).

Pure functions over per-token tensors. Names follow verl's `rollout_corr/*` and
`training/rollout_probs_diff_*` (see shared/reference/tim-literature.md), with
delta = log pi - log mu and rho = pi / mu. Log-ratios are clamped at +-20
before exponentiating, as verl does.
"""

from __future__ import annotations

import torch

_CLAMP = 20.0

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


def _masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (x * mask).sum() / mask.sum().clamp(min=1)


def mismatch_metrics(lp_train: torch.Tensor, lp_rollout: torch.Tensor, mask: torch.Tensor | None = None,
                     taus: tuple[float, ...] = (1.5, 2.0, 5.0)) -> dict[str, float]:
    """All per-token and per-sequence mismatch statistics for a [B, T] (or flat) batch.

    lp_train: trainer logprobs of the sampled tokens (pi); lp_rollout: the engine's (mu).
    """
    lp_train = lp_train.detach().double()
    lp_rollout = lp_rollout.detach().double()
    if mask is None:
        mask = torch.ones_like(lp_train, dtype=torch.bool)
    if lp_train.dim() == 1:
        lp_train, lp_rollout, mask = lp_train[None], lp_rollout[None], mask[None]
    m = mask.double()
    n_tok = int(mask.sum())
    delta = torch.where(mask, lp_train - lp_rollout, torch.zeros_like(lp_train))
    log_rho = delta.clamp(-_CLAMP, _CLAMP)
    rho = log_rho.exp()
    absd = delta.abs()[mask]
    seq_n = m.sum(-1).clamp(min=1)
    seq_rows = mask.any(-1)
    log_rho_seq = (log_rho * m).sum(-1).clamp(-_CLAMP, _CLAMP)
    mean_lp_train = (lp_train * m).sum(-1) / seq_n
    mean_lp_roll = (lp_rollout * m).sum(-1) / seq_n
    log_ppl_diff = (mean_lp_roll - mean_lp_train)[seq_rows]
    w = rho[mask]
    probs_diff = (lp_train.exp() - lp_rollout.exp()).abs()[mask]
    out = {
        "tokens": n_tok,
        "rollout_corr/kl": float(_masked_mean(lp_rollout - lp_train, m)),
        "rollout_corr/k3_kl": float(_masked_mean(rho - 1 - log_rho, m)),
        "rollout_corr/chi2_token": float(_masked_mean(rho ** 2, m) - 1),
        "rollout_corr/chi2_seq": float((log_rho_seq[seq_rows] * 2).exp().mean() - 1) if seq_rows.any() else 0.0,
        "rollout_corr/log_ppl_diff": float(log_ppl_diff.mean()) if len(log_ppl_diff) else 0.0,
        "rollout_corr/log_ppl_abs_diff": float(log_ppl_diff.abs().mean()) if len(log_ppl_diff) else 0.0,
        "rollout_corr/ppl_ratio": float(log_ppl_diff.exp().mean()) if len(log_ppl_diff) else 1.0,
        "rollout_corr/eff_sample_size": float(1.0 / ((w / w.mean()) ** 2).mean()) if n_tok else 1.0,
        "training/rollout_probs_diff_max": float(probs_diff.max()) if n_tok else 0.0,
        "training/rollout_probs_diff_mean": float(probs_diff.mean()) if n_tok else 0.0,
        "mismatch/max_abs_delta": float(absd.max()) if n_tok else 0.0,
        "mismatch/mean_abs_delta": float(absd.mean()) if n_tok else 0.0,
        "mismatch/p99_abs_delta": float(torch.quantile(absd, 0.99)) if n_tok else 0.0,
        "mismatch/frac_tokens_differ": float((absd != 0).double().mean()) if n_tok else 0.0,
    }
    ext = torch.maximum(rho, 1 / rho)[mask]
    for tau in taus:
        out[f"mismatch/extreme_frac_{tau:g}"] = float((ext > tau).double().mean()) if n_tok else 0.0
    return out


def abs_delta_histogram(lp_train: torch.Tensor, lp_rollout: torch.Tensor,
                        mask: torch.Tensor | None = None) -> list[int]:
    """Counts of |log pi - log mu| over unmasked tokens in the fixed bins of `ABS_DELTA_BINS`.

    Returns len(ABS_DELTA_BINS) == 12 integers summing to the number of unmasked tokens. Computed
    in float64 without clamping, so a delta of exactly 0 lands in bin 0 and nothing else does.
    Raises ValueError on NaN deltas (a NaN logprob is a bug upstream, not a large mismatch).
    """
    delta = lp_train.detach().double() - lp_rollout.detach().double()
    if mask is not None:
        if mask.shape != delta.shape:
            raise ValueError(f"abs_delta_histogram: mask shape {tuple(mask.shape)} != logprob shape "
                             f"{tuple(delta.shape)}")
        delta = delta[mask.bool()]
    absd = delta.abs().flatten()
    if torch.isnan(absd).any():
        raise ValueError("abs_delta_histogram: NaN in lp_train - lp_rollout (a NaN logprob, or -inf on both sides)")
    counts = [int((absd == 0).sum())]
    nonzero = absd[absd != 0]
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
    return float(same.double().mean()) if same.numel() else 1.0
