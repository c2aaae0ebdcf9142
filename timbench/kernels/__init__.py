"""Kernel sets by name: the one place that picks the arithmetic of a forward pass."""

from __future__ import annotations

from ..util.threads import start_numba_pool
from .base import KernelSet
from .exact_kernels import ExactKernels
from .torch_kernels import TorchKernels

# numba's pool starts with the kernels, so its nested-OpenMP side effect is undone before any kernel runs.
start_numba_pool()

KERNELS: dict[str, type] = {"exact": ExactKernels, "torch": TorchKernels}


def get_kernels(name: str) -> KernelSet:
    try:
        return KERNELS[name]()
    except KeyError:
        raise ValueError(f"unknown kernel set {name!r}; valid: {', '.join(KERNELS)}") from None


__all__ = ["KERNELS", "KernelSet", "get_kernels"]
