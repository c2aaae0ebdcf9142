"""Model glue with fixed-order gradients: the embedding gather and the MoE per-row gate scaling.

Both forwards are exact (a gather, an elementwise product), but PyTorch's
backwards reduce: the embedding's is an index_put accumulate (atomic adds in
thread order unless deterministic algorithms are on), and a broadcast product's
gradient for the broadcast operand is a `torch.sum` whose order depends on the
CPU's SIMD width. Here those reductions are numba loops in a fixed order, so
they are used with every kernel set (forward bits are unchanged).
"""

from __future__ import annotations

import torch

from . import numba_grad as ng
from .exact_kernels import _back, _np32


class _Embed(torch.autograd.Function):
    @staticmethod
    def forward(ctx, weight, ids):
        ctx.vocab, ctx.dtype = weight.shape[0], weight.dtype
        ctx.save_for_backward(ids)
        return weight[ids]

    @staticmethod
    def backward(ctx, grad):
        (ids,) = ctx.saved_tensors
        d = grad.shape[-1]
        dw = ng.embedding_bwd(ids.reshape(-1).contiguous().numpy(), _np32(grad.reshape(-1, d)), ctx.vocab)
        return _back(dw, ctx.dtype), None


def embed(weight: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """weight[ids]; the gradient sums each id's rows in position order (fp32, rounded once to weight's dtype)."""
    if torch.is_grad_enabled() and weight.requires_grad:
        return _Embed.apply(weight, ids)
    return weight[ids]


class _ScaleRows(torch.autograd.Function):
    @staticmethod
    def forward(ctx, y, w):
        ctx.save_for_backward(y, w)
        return y * w[:, None]

    @staticmethod
    def backward(ctx, grad):
        y, w = ctx.saved_tensors
        dy = grad * w[:, None] if ctx.needs_input_grad[0] else None
        dw = _back(ng.rowdot(_np32(grad), _np32(y)), w.dtype) if ctx.needs_input_grad[1] else None
        return dy, dw


def scale_rows(y: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """y[N, D] * w[N, None]; w's gradient is sum_j grad_ij y_ij in float64, j ascending, rounded once."""
    if torch.is_grad_enabled() and (y.requires_grad or w.requires_grad):
        return _ScaleRows.apply(y, w)
    return y * w[:, None]


__all__ = ["embed", "scale_rows"]
