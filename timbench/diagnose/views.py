"""Where the gap sits: by reference probability, by position, argmax or not, argmax flips, MoE routing by layer.

Pure functions of per-token tensors (float64 errors, probabilities, positions,
argmax flags). Buckets are log-spaced in the reference probability of the
sampled token; each bucket reports its token count, mean |gap| and mean |e| of
each side, and its share of the total squared gap (k3_kl ~ gap^2 / 2 per token,
so that share is the bucket's share of the measured KL). Means use `kernels.reduce`.
"""

from __future__ import annotations

import torch

from ..kernels.reduce import fmean, fsum

PROB_EDGES = (1e-4, 1e-3, 1e-2, 1e-1, 0.5, 0.9)
POS_EDGES = (1, 2, 4, 8, 16, 32)


def _labels(edges, fmt) -> list[str]:
    lo = [None, *edges]
    hi = [*edges, None]
    return [
        f"<{fmt(h)}" if a is None else (f">={fmt(a)}" if h is None else f"{fmt(a)}..{fmt(h)}") for a, h in zip(lo, hi)
    ]


def bucketed(errs: dict[str, torch.Tensor], key: torch.Tensor, edges, labels) -> list[dict]:
    """Per bucket of `key` (bucket i: edges[i-1] <= key < edges[i]): count, mean |err| of each, share of gap^2."""
    idx = torch.bucketize(key.double(), torch.tensor(edges, dtype=torch.float64), right=True)
    g2 = errs["gap"] * errs["gap"]
    total = float(fsum(g2)) if g2.numel() else 0.0
    out = []
    for b, label in enumerate(labels):
        m = idx == b
        row = {"bucket": label, "tokens": int(m.sum())}
        for name, e in errs.items():
            row[f"mean_abs_{name}"] = float(fmean(e[m].abs())) if row["tokens"] else None
        row["gap_sq_share"] = (
            float(fsum(g2[m])) / total if total > 0 and row["tokens"] else (0.0 if total > 0 else None)
        )
        out.append(row)
    return out


def by_probability(errs, p_ref: torch.Tensor) -> list[dict]:
    return bucketed(errs, p_ref, PROB_EDGES, _labels(PROB_EDGES, lambda x: f"{x:g}"))


def by_position(errs, position: torch.Tensor) -> list[dict]:
    """Position of the token in its response (0 = first sampled token), log2 buckets."""
    labels = ["0", "1", "2..3", "4..7", "8..15", "16..31", ">=32"]
    return bucketed(errs, position.double(), POS_EDGES, labels)


def by_argmax(errs, is_argmax: torch.Tensor) -> list[dict]:
    """Tokens that are / are not the argmax of the reference distribution."""
    return bucketed(errs, is_argmax.double(), (0.5,), ["not argmax", "argmax"])


def flip_rate(argmax_a: torch.Tensor, argmax_b: torch.Tensor) -> float:
    """Fraction of scored positions where the two sides' argmax tokens differ."""
    return float(fmean((argmax_a != argmax_b).double())) if argmax_a.numel() else 0.0


def routing_by_layer(experts_a: torch.Tensor, experts_b: torch.Tensor) -> list[float]:
    """Per layer: fraction of tokens whose top-k expert sets differ; inputs [tokens, layers, k]."""
    a = torch.sort(experts_a, dim=-1).values
    b = torch.sort(experts_b, dim=-1).values
    differ = (a != b).any(-1).double()  # [tokens, layers]
    return [float(fmean(differ[:, i])) for i in range(differ.shape[1])] if differ.shape[0] else []
