"""Rotary position embedding (HF's rotate-half form) in one numba pass, for forwards without autograd.

The model's rope is `x * cos + rotate_half(x) * sin` in torch: a gather of each table, a cat, a negation, two
multiplies and an add, whose dispatch costs more than their arithmetic at the engine's decode sizes (one token
per sequence). Here each output element is the same three fp32 operations in the same order,
round(x[j] * cos[j]) + round(r[j] * sin[j]) with r[j] = -x[j + D/2] (j < D/2) or x[j - D/2]: negation is
exact, and without fastmath LLVM neither contracts the multiply-add into an FMA nor reorders it, so the result
is torch's bit for bit (tests/test_rope.py), on every CPU. Autograd passes keep the torch ops (their backward).
"""

from __future__ import annotations

import numpy as np
import torch
from numba import njit, prange

_JIT = dict(parallel=True, cache=True, fastmath=False, error_model="numpy", nogil=True)


@njit(**_JIT)
def _rope(x, cos, sin, pos):
    """x [N, H, D] fp32 at positions pos [N] of the tables cos, sin [P, D]: the rotated [N, H, D]."""
    n, h, d = x.shape
    half = d // 2
    out = np.empty_like(x)
    for i in prange(n):
        p = pos[i]
        for k in range(h):
            for j in range(half):
                out[i, k, j] = x[i, k, j] * cos[p, j] + (-x[i, k, j + half]) * sin[p, j]
            for j in range(half, d):
                out[i, k, j] = x[i, k, j] * cos[p, j] + x[i, k, j - half] * sin[p, j]
    return out


def applies(x: torch.Tensor, table: torch.Tensor) -> bool:
    """Whether `rope` serves: fp32 on the CPU (a narrower dtype rounds each op to it), no autograd through x."""
    return (
        x.dtype == torch.float32
        and table.dtype == torch.float32
        and x.device.type == "cpu"
        and not (x.requires_grad and torch.is_grad_enabled())
        and x.shape[-1] % 2 == 0
    )


def rope(x: torch.Tensor, pos: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [*lead, H, D] rotated by the table rows cos, sin [P, D] at positions pos [*lead] (see `applies`)."""
    h, d = x.shape[-2:]
    flat = x.detach().reshape(-1, h, d).contiguous().numpy()
    p = pos.reshape(-1).contiguous().numpy()
    return torch.from_numpy(_rope(flat, cos.contiguous().numpy(), sin.contiguous().numpy(), p)).reshape(x.shape)
