"""Kernel sets by name: the one place that picks the arithmetic of a forward pass."""

from __future__ import annotations

from ..util.registry import Registry
from ..util.threads import start_numba_pool
from .base import KernelSet
from .exact_kernels import ExactKernels
from .torch_kernels import TorchKernels

# numba's pool starts with the kernels, so its nested-OpenMP side effect is undone before any kernel runs.
start_numba_pool()

KERNELS: Registry[type[KernelSet]] = Registry("kernel set", {"exact": ExactKernels, "torch": TorchKernels})


def get_kernels(name: str) -> KernelSet:
    return KERNELS.lookup(name)()


__all__ = ["KERNELS", "KernelSet", "get_kernels"]
