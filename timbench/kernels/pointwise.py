"""CPU-independent exp and sqrt for the loss and metric path (ratios, entropy, advantages, grad norm).

`torch.exp` on CPU runs SLEEF vector code chosen per CPU (different polynomials
and FMA use on AVX2 and AVX-512), so the same log-ratio exponentiates to
different last bits on different machines: measured, the PPO ratio's gradient
differed at the first step where the ratio left 1 under an emulated AVX2 CPU.
Here every element is one scalar libm call from numba (no fastmath, no SVML),
the same calls the exact kernels' softmax makes, so the bits depend on the
value alone. The gradient reuses the output (d exp(x) = exp(x) dx), exactly.

`torch.sqrt` is not the IEEE square root either: the CPU build of torch 2.13
sends it to MKL's vector math (VML), which picks its code path by CPU vendor
and ISA and is not correctly rounded (measured on an AMD EPYC, AVX2: 1.3% of
1M float64 and 16% of 1M float32 inputs differ from IEEE sqrt, among them the
fp32 std of a GRPO group with 4 of 8 rewards; the Intel that made results/
quick returned sqrt(2^-7) one ulp low where this AMD is exact). No
environment flag moves it and CPU emulation cannot show it, which is how it
survived every emulated test. `fsqrt` is numba's `math.sqrt`, which LLVM
lowers to the hardware square root (sqrtsd/sqrtss, IEEE 754 correctly
rounded on every x86-64 CPU, no library code): the bits depend on the value
alone.
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
        out = _apply(_KERNEL, x)
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


@njit(**_JIT)
def _sqrt64(x):
    out = np.empty_like(x)
    for i in prange(x.size):
        out[i] = math.sqrt(x[i])
    return out


@njit(**_JIT)
def _sqrt32(x):
    out = np.empty_like(x)
    for i in prange(x.size):
        # sqrt in float64 rounded once to float32 is the correctly rounded float32 sqrt
        # (53 >= 2 * 24 + 2 bits), so this is IEEE sqrtss whatever LLVM picks.
        out[i] = np.float32(math.sqrt(np.float64(x[i])))
    return out


_SQRT = {torch.float64: _sqrt64, torch.float32: _sqrt32}


def _apply(kernels: dict, x: torch.Tensor) -> torch.Tensor:
    """Run an elementwise numba kernel over x's elements (any shape, empty too)."""
    flat = x.detach().contiguous().reshape(-1)
    out = kernels[x.dtype](flat.numpy()) if flat.numel() else flat.numpy().copy()
    return torch.from_numpy(out).reshape(x.shape)


class _Sqrt(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        out = _apply(_SQRT, x)
        ctx.save_for_backward(out)
        return out

    @staticmethod
    def backward(ctx, grad):
        (out,) = ctx.saved_tensors
        return grad / (2 * out)  # d sqrt(x) = dx / (2 sqrt(x)): IEEE products and quotients only


def fsqrt(x: torch.Tensor) -> torch.Tensor:
    """IEEE (correctly rounded) sqrt(x) elementwise, bitwise the same on every x86-64 CPU; differentiable.

    float32 or float64; negative inputs give NaN, as torch.sqrt.
    """
    if x.dtype not in _SQRT:
        raise TypeError(f"fsqrt takes float32 or float64 tensors, got {x.dtype}")
    return _Sqrt.apply(x)


__all__ = ["fexp", "fsqrt"]
