"""The `mma_accum=` arithmetic: the exact linear's K reduction in blocks (what it stands for: timbench.spec.mma)."""

from __future__ import annotations

import numpy as np

from ..spec.mma import MmaAccum
from . import native


def _chop(a: np.ndarray, mantissa: int) -> np.ndarray:
    """fp32 values with all but the top `mantissa` mantissa bits cleared (toward zero; integer ops only)."""
    mask = np.uint32((0xFFFFFFFF << (23 - mantissa)) & 0xFFFFFFFF)
    return (a.view(np.uint32) & mask).view(np.float32)


def blocked_matmul(x: np.ndarray, wt: np.ndarray, accum: MmaAccum) -> np.ndarray:
    """x [M, K] @ wt [K, N] (fp32) with K summed as `accum` says; every step an IEEE fp32 operation."""
    k = x.shape[1]
    b = accum.block
    if b is None:
        return native.matmul(x, wt)
    if b > k or k % b:
        raise ValueError(
            f"mma_accum={accum}: the block width {b} must divide the matmul's K={k} (and not exceed "
            f"it); valid widths here: {', '.join(str(d) for d in range(1, k + 1) if k % d == 0)}"
        )
    if b == k and accum.mantissa is None:
        return native.matmul(x, wt)  # one block is one chain
    acc = None
    for s in range(0, k, b):
        part = native.matmul(np.ascontiguousarray(x[:, s : s + b]), np.ascontiguousarray(wt[s : s + b]))
        acc = part if acc is None else acc + part  # ascending block order, one fp32 rounding per addition
        if accum.mantissa is not None:
            acc = _chop(acc, accum.mantissa)
    return acc


__all__ = ["blocked_matmul"]
