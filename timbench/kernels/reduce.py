"""Fixed-order reductions: sums whose bits do not depend on the CPU or the thread count.

`torch.sum` splits a reduction into SIMD lanes whose width ATen picks per CPU
(8 fp32 lanes on AVX2, 16 on AVX-512) and across threads by grain size, so the
same tensor sums to different last bits on different machines; RL amplifies
that into different runs. Every reduction whose result reaches training or a
logged metric goes through here instead: each output element is one loop over
its inputs in ascending index order, accumulated in float64 and rounded once to
the input's floating dtype. Rows are split across threads with `prange`, which
changes who sums a row, not how. The gradient of a sum is a broadcast, which is
exact, so these are differentiable at no cost to determinism.
"""

from __future__ import annotations

import numpy as np
import torch
from numba import njit, prange

from .pointwise import fsqrt


@njit(parallel=True, cache=True, fastmath=False, nogil=True)
def _rowsum(x):
    """out[i] = x[i, 0] + x[i, 1] + ... left to right, in float64. x: [M, N] float64."""
    m, n = x.shape
    out = np.empty(m, dtype=np.float64)
    for i in prange(m):
        s = 0.0
        for j in range(n):
            s += x[i, j]
        out[i] = s
    return out


def _out_dtype(x: torch.Tensor) -> torch.dtype:
    return x.dtype if x.is_floating_point() else torch.float32


class _FixedSum(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dim):
        ctx.shape, ctx.dim = x.shape, dim
        moved = x.detach().movedim(dim, -1)
        if moved.numel() == 0:  # an empty sum is 0 (numba's reshape cannot infer an empty row count)
            return torch.zeros(moved.shape[:-1], dtype=_out_dtype(x))
        rows = moved.reshape(-1, moved.shape[-1]).to(torch.float64).contiguous()
        return torch.from_numpy(_rowsum(rows.numpy())).reshape(moved.shape[:-1]).to(_out_dtype(x))

    @staticmethod
    def backward(ctx, grad):
        return grad.unsqueeze(ctx.dim).expand(ctx.shape), None


def fsum(x: torch.Tensor, dim: int | None = None, keepdim: bool = False) -> torch.Tensor:
    """Sum over `dim` (all elements when None) in fixed ascending order; float dtypes keep theirs.

    Differentiable. Integer and bool inputs sum to float32 (exact below 2**24).
    """
    if dim is None:
        out = _FixedSum.apply(x.reshape(1, -1), 1)[0]
        return out.reshape([1] * x.dim()) if keepdim else out
    dim = dim % max(x.dim(), 1)
    out = _FixedSum.apply(x, dim)
    return out.unsqueeze(dim) if keepdim else out


def fmean(x: torch.Tensor, dim: int | None = None, keepdim: bool = False) -> torch.Tensor:
    """Fixed-order mean: `fsum` divided by the element count (one IEEE division)."""
    n = x.numel() if dim is None else x.shape[dim]
    return fsum(x, dim, keepdim) / max(n, 1)


def fstd(x: torch.Tensor, dim: int | None = None, keepdim: bool = False, correction: int = 1) -> torch.Tensor:
    """Fixed-order standard deviation: sqrt(fsum((x - fmean)^2) / (n - correction)), two passes, IEEE sqrt.

    correction=1 is torch.std's default (unbiased, divides by n - 1).
    """
    n = x.numel() if dim is None else x.shape[dim]
    centred = x - fmean(x, dim, keepdim=True)
    return fsqrt(fsum(centred * centred, dim, keepdim) / (n - correction))  # a 0 / 0 gives NaN, as torch


def masked_sum(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Sum of x where mask is True; masked-out entries are *selected away*, so NaN/inf there never leak."""
    return fsum(torch.where(mask, x, torch.zeros((), dtype=_out_dtype(x))), dim)


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """masked_sum / number of True entries (at least 1, so an empty mask gives 0, not NaN)."""
    count = fsum(mask.to(_out_dtype(x)), dim).clamp(min=1)
    return masked_sum(x, mask, dim) / count


__all__ = ["fmean", "fstd", "fsum", "masked_mean", "masked_sum"]
