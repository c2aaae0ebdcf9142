"""CPU-independent exp for the loss and metric path (ratios, entropy, chi-square, drift).

`torch.exp` on CPU runs SLEEF vector code chosen per CPU (different polynomials
and FMA use on AVX2 and AVX-512), so the same log-ratio exponentiates to
different last bits on different machines: measured, the PPO ratio's gradient
differed at the first step where the ratio left 1 under an emulated AVX2 CPU.
Here every element is one scalar libm call from numba (no fastmath, no SVML),
the same calls the exact kernels' softmax makes, so the bits depend on the
value alone. The gradient reuses the output (d exp(x) = exp(x) dx), exactly.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from numba import njit, prange

_JIT = dict(parallel=True, cache=True, fastmath=False, nogil=True)


@njit(**_JIT)
def _exp64(x):
    out = np.empty_like(x)
    for i in prange(x.size):
        out[i] = math.exp(x[i])
    return out


@njit(**_JIT)
def _exp32(x):
    out = np.empty_like(x)
    for i in prange(x.size):
        out[i] = np.float32(math.exp(x[i]))
    return out


_KERNEL = {torch.float64: _exp64, torch.float32: _exp32}


class _Exp(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        flat = x.detach().contiguous().reshape(-1)
        out = torch.from_numpy(_KERNEL[x.dtype](flat.numpy()) if flat.numel() else flat.numpy().copy())
        out = out.reshape(x.shape)
        ctx.save_for_backward(out)
        return out

    @staticmethod
    def backward(ctx, grad):
        (out,) = ctx.saved_tensors
        return grad * out


def fexp(x: torch.Tensor) -> torch.Tensor:
    """exp(x) elementwise, bitwise the same on every x86-64 CPU; float32 or float64, differentiable."""
    if x.dtype not in _KERNEL:
        raise TypeError(f"fexp takes float32 or float64 tensors, got {x.dtype}")
    return _Exp.apply(x)


__all__ = ["fexp"]
