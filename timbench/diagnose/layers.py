"""Per-layer localisation: at which level of the forward do two computations of the same token part?

Levels are the residual stream after each decoder layer, the final norm, the
logits (from `forward.score` / `replay.replay`, float64 copies), and last the
token's logprob (which also carries the sampler's logit noise). For each token
the first level whose values differ at all is where the mismatch enters: a
kernel that rounds differently shows up in the first layer that uses it, a
precision difference at layer 0, a TP all-reduce in the first layer, router
disagreement in the layer whose expert choice flips, sampler noise only at the
logprob. Sizes are reported per level as max and mean |diff| (fixed-order means).
"""

from __future__ import annotations

import torch

from ..kernels.reduce import fmean


def stack_levels(per_seq: list[list[torch.Tensor]]) -> list[torch.Tensor]:
    """Per sequence per level [R, w] -> per level [tokens, w] (sequences concatenated in order)."""
    return [torch.cat([s[lv] for s in per_seq]) for lv in range(len(per_seq[0]))]


def localise(
    a: list[torch.Tensor], b: list[torch.Tensor], lp_a: torch.Tensor, lp_b: torch.Tensor, names: list[str]
) -> dict:
    """Compare per-level values a vs b ([tokens, w] each) plus the token logprobs; see module doc."""
    names = [*names, "logprob"]
    diffs = [(x.double() - y.double()).abs() for x, y in zip(a, b)] + [(lp_a.double() - lp_b.double()).abs()[:, None]]
    n = diffs[0].shape[0]
    per_token_max = torch.stack([d.max(-1).values for d in diffs], dim=1) if n else torch.zeros(0, len(names))
    differs = per_token_max > 0
    # First differing level per token (len(names) = never differs).
    first = torch.where(differs.any(1), differs.double().argmax(1), torch.full((n,), len(names)))
    levels = []
    for i, name in enumerate(names):
        d = diffs[i]
        levels.append(
            {
                "level": name,
                "max_abs_diff": float(d.max()) if n else 0.0,
                "mean_abs_diff": float(fmean(d)) if n else 0.0,
                "frac_tokens_differ": float(fmean(differs[:, i].double())) if n else 0.0,
                "first_differ_frac": float(fmean((first == i).double())) if n else 0.0,
            }
        )
    never = float(fmean((first == len(names)).double())) if n else 1.0
    firsts = [lv["level"] for lv in levels if lv["first_differ_frac"] > 0]
    return {
        "levels": levels,
        "identical_frac": never,
        "first_level": firsts[0] if firsts else None,
        "most_common_first_level": max(levels, key=lambda lv: lv["first_differ_frac"])["level"] if firsts else None,
    }


def error_by_level(a: list[torch.Tensor], ref: list[torch.Tensor], names: list[str]) -> list[dict]:
    """rms of (a - ref) per level, and relative to the reference's rms: where a side's error grows."""
    out = []
    for name, x, r in zip(names, a, ref):
        d = x.double() - r
        rms = float(fmean(d * d)) ** 0.5 if d.numel() else 0.0
        scale = float(fmean(r * r)) ** 0.5 if r.numel() else 0.0
        out.append({"level": name, "rms": rms, "rel_rms": rms / scale if scale > 0 else None})
    return out
