"""Thread pinning: one call sets the threads of both arithmetic back ends (torch intra-op and numba)."""

from __future__ import annotations

import torch


def set_threads(n: int) -> None:
    """Pin torch intra-op and numba (exact kernels) threads to `n` (numba: at most its pool size)."""
    if n < 1:
        raise ValueError(f"threads must be >= 1, got {n}")
    torch.set_num_threads(n)
    import numba
    numba.set_num_threads(min(n, numba.config.NUMBA_NUM_THREADS))
