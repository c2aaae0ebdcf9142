"""bf16 <-> fp32 for the exact kernels with no conversion pass of its own where it can be folded away.

The exact kernels compute in fp32, so a bf16 run widened every input (`Tensor.float`) and rounded every
output (`Tensor.to(torch.bfloat16)`), each a separate pass over the tensor; most outputs were widened again
at once by the next exact kernel (a linear's output by rmsnorm or silu_mul, rmsnorm's by the next linears,
a gradient by the backward below it). Here (C, `native_bf16.c`):

- `store` rounds a kernel's fp32 output to bf16 and, in the same pass, overwrites the output with the rounded
  values widened back: exactly what `Tensor.float()` of the bf16 result gives. That array is remembered for the
  bf16 tensor (a few most recent ones), so `widened` of the same memory returns it with no pass at all;
- `widened` otherwise widens in one pass, a weight's transpose included (torch needed two: widen, then
  `contiguous`).

Bits are torch's: widening is exact, and rounding is round-to-nearest-even on the bit pattern, which is
torch's fp32 -> bf16 copy on every non-NaN value (tests/test_bf16.py: all 2^16 widenings, ties, -0,
subnormals, inf, overflow, random patterns). Which NaN torch writes depends on the ISA its copy runs, so an
output holding a NaN is left to torch whole. A remembered array is used only while its tensor is alive and
unchanged (the same memory, shape-compatible, contiguous, the same version counter; inference-mode tensors,
which have none, are not remembered), and it is never written
after it is returned: every exact kernel only reads its inputs (on fp32 runs they are the tensors' own memory).
Where the library cannot be built (or `TIMBENCH_NATIVE=0`) both return None and the callers use torch.
"""

from __future__ import annotations

import ctypes
from collections import OrderedDict
from pathlib import Path

import numba
import numpy as np
import torch

from . import native

SOURCE = Path(__file__).with_name("native_bf16.c")
REMEMBER = 8
"""How many stored outputs keep their widened array: enough for every reuse in a layer's forward (one
normed input read by three linears, gate and up read by silu_mul) and for the backward's next node."""


class _Lib:
    def __init__(self, path: Path):
        lib = ctypes.CDLL(str(path))
        p, l_, i_ = ctypes.c_void_p, ctypes.c_long, ctypes.c_int
        self.widen = lib.timbench_bf16_widen
        self.widen.restype, self.widen.argtypes = None, [p, p, l_, i_]
        self.widen_t = lib.timbench_bf16_widen_t
        self.widen_t.restype, self.widen_t.argtypes = None, [p, l_, l_, p, i_]
        self.round = lib.timbench_bf16_round
        self.round.restype, self.round.argtypes = l_, [p, p, l_, i_]


_lib: _Lib | None | bool = None  # None: not tried yet; False: unavailable (torch converts)
# data_ptr -> (bf16 tensor, its version when stored, fp32 array of its widened values)
_recent: OrderedDict[int, tuple[torch.Tensor, int, np.ndarray]] = OrderedDict()


def _threads() -> int:
    """The exact kernels' thread count (numba's, as the matmul tiles take it); conversions are elementwise, so the
    split never changes a bit."""
    return numba.get_num_threads()


def library() -> _Lib | None:
    """The conversion library, or None where native code is off or cannot be built (torch converts)."""
    global _lib
    if _lib is None:
        _lib = native.open_library(
            lambda: _Lib(native.build((SOURCE,))),
            "native bf16 conversions unavailable ({e}); torch converts (the same bits)",
        )
    return _lib or None


def store(a: np.ndarray) -> torch.Tensor | None:
    """`torch.from_numpy(a).to(torch.bfloat16)`, bit for bit; `a` (fp32, C-contiguous, the caller's own: it is
    overwritten with the rounded values) is remembered as the result's widening. None where not applicable."""
    lib = library()
    if lib is None or a.dtype != np.float32 or not a.flags.c_contiguous or not a.flags.writeable:
        return None
    out = torch.empty(a.shape, dtype=torch.bfloat16)
    if a.size == 0:
        return out
    if lib.round(a.ctypes.data, out.data_ptr(), a.size, _threads()):
        # NaNs: the rounded values are their own rounding and the NaNs are untouched, so torch's copy of the
        # array now is its copy of the original.
        return torch.from_numpy(a).to(torch.bfloat16)
    if not out.is_inference():  # an inference tensor has no version counter to tell an in-place change by
        _recent[out.data_ptr()] = (out, out._version, a)
        if len(_recent) > REMEMBER:
            _recent.popitem(last=False)
    return out


def widened(t: torch.Tensor) -> np.ndarray | None:
    """`t.float().contiguous().numpy()` of a bf16 tensor, bit for bit: the remembered array of a stored output,
    else one widening pass (contiguous or a 2-D transpose). None where not applicable (torch converts)."""
    if t.dtype != torch.bfloat16 or t.numel() == 0:
        return None
    if t.is_contiguous():
        hit = None if t.is_inference() else _recent.get(t.data_ptr())
        if hit is not None and hit[1] == t._version and hit[2].size == t.numel():
            return hit[2].reshape(t.shape)
        lib = library()
        if lib is None:
            return None
        out = np.empty(t.shape, dtype=np.float32)
        lib.widen(t.data_ptr(), out.ctypes.data, t.numel(), _threads())
        return out
    if t.dim() == 2 and t.t().is_contiguous():  # a weight's transpose, the layout the matmul reads
        lib = library()
        if lib is None:
            return None
        cols, rows = t.shape
        out = np.empty((cols, rows), dtype=np.float32)
        lib.widen_t(t.data_ptr(), rows, cols, out.ctypes.data, _threads())
        return out
    return None


def forget() -> None:
    """Drop every remembered array (tests; memory is otherwise bounded by `REMEMBER`)."""
    _recent.clear()
