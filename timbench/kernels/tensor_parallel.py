"""Simulated tensor parallelism with the real arithmetic, in one process: the `tp=K` condition.

Megatron-style TP splits each attention block and MLP in two: column-parallel
q/k/v and gate/up projections (each rank owns whole output columns, so every
output element is the same dot product as without TP: with the exact kernels
that is bitwise the tp=1 value, and it is simulated as such), then row-parallel
o_proj and down_proj, where rank r multiplies its slice of the input features
by its slice of the weight and the K partial outputs are summed by an
all-reduce. That sum is where TP changes the bits: the tp=1 matmul adds all
features in one ascending chain, TP adds K partial chains, each rounded to the
activation dtype (NCCL reduces in the tensor's dtype), in the all-reduce's order.

Orders (arXiv 2511.17826 removes exactly this difference with TP-invariant kernels):
- ring: reduce-scatter over a ring; the output is cut into K chunks and chunk c
  accumulates p_c + p_{c+1} + ... + p_{c-1} (indices mod K), so neighbouring
  output columns are summed in different orders.
- tree: pairwise, (p_0 + p_1) + (p_2 + p_3), ..., the same for every column.
"""

from __future__ import annotations

import torch


def all_reduce(parts: list[torch.Tensor], order: str) -> torch.Tensor:
    """Sum K same-shaped partial outputs in ring or tree order (elementwise, in their dtype)."""
    k = len(parts)
    if k == 1:
        return parts[0]
    if order == "tree":
        while len(parts) > 1:
            parts = [parts[i] + parts[i + 1] if i + 1 < len(parts) else parts[i] for i in range(0, len(parts), 2)]
        return parts[0]
    if order != "ring":
        raise ValueError(f"unknown all-reduce order {order!r}; valid: ring, tree")
    chunks = [p.tensor_split(k, dim=-1) for p in parts]
    out = []
    for c in range(k):
        acc = chunks[c][c]
        for i in range(1, k):
            acc = acc + chunks[(c + i) % k][c]
        out.append(acc)
    return torch.cat(out, dim=-1)


def row_parallel_linear(kernels, x: torch.Tensor, w: torch.Tensor, tp: int, order: str) -> torch.Tensor:
    """x[..., K] @ w[N, K].T computed as `tp` ranks' partial products over K slices, then all-reduced."""
    if tp == 1:
        return kernels.linear(x, w)
    k = x.shape[-1]
    if k % tp:
        raise ValueError(f"tp={tp} does not divide the row-parallel input width {k}")
    s = k // tp
    parts = [kernels.linear(x[..., r * s : (r + 1) * s], w[:, r * s : (r + 1) * s]) for r in range(tp)]
    return all_reduce(parts, order)
