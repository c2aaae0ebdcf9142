"""The exact kernels' bf16 <-> fp32 conversions (`timbench.kernels.bf16`) against torch's, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from timbench.kernels import bf16
from timbench.kernels.exact_kernels import _back, _np32

pytestmark = pytest.mark.unit

needs_lib = pytest.mark.skipif(bf16.library() is None, reason="native bf16 library unavailable (TIMBENCH_NATIVE=0)")


def _bits16(t: torch.Tensor) -> np.ndarray:
    return t.contiguous().view(torch.int16).numpy().view(np.uint16)


def _rounding_cases() -> np.ndarray:
    """Non-NaN fp32 bit patterns: random ones, ties and near-ties around random bf16 values, and the edges."""
    rng = np.random.default_rng(0)
    rand = rng.integers(0, 2**32, size=1 << 22, dtype=np.uint64).astype(np.uint32)
    hi = rng.integers(0, 2**16, size=1 << 16, dtype=np.uint64).astype(np.uint32) << 16
    near = np.concatenate([hi | low for low in (0x7FFF, 0x8000, 0x8001, 0x0001, 0xFFFF)]).astype(np.uint32)
    edges = np.array(
        [
            0x00000000,  # +0
            0x80000000,  # -0
            0x00000001,  # smallest subnormal
            0x80008000,  # a negative subnormal tie (rounds to even: -0)
            0x00018000,  # a subnormal tie to odd: rounds up
            0x007FFFFF,  # largest subnormal: rounds to the smallest normal
            0x00800000,  # smallest normal
            0x7F7F7FFF,  # just below the overflow tie: largest finite bf16
            0x7F7F8000,  # the overflow tie: rounds to inf
            0x7F7FFFFF,  # largest finite fp32: rounds to inf
            0xFF7FFFFF,  # ... and -inf
            0x7F800000,  # inf
            0xFF800000,  # -inf
            0x3F808000,  # 1 + half an ulp: the tie goes to even (1)
            0x3F818000,  # the tie goes to even (up)
        ],
        dtype=np.uint32,
    )
    cases = np.concatenate([rand, near, edges])
    return cases[~np.isnan(cases.view(np.float32))]  # NaNs: test_an_output_with_a_nan_is_rounded_by_torch


@needs_lib
def test_widening_equals_torch_on_every_bf16_value():
    bits = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    t = torch.from_numpy(bits.view(np.int16)).view(torch.bfloat16)
    got = bf16.widened(t)
    assert got is not None and np.array_equal(got.view(np.uint32), t.float().numpy().view(np.uint32))
    # The transposed widening (a weight's layout for the matmul), on a shape no block divides.
    w = t[: 37 * 53].reshape(37, 53)
    got_t = bf16.widened(w.t())
    assert got_t.shape == (53, 37)
    assert np.array_equal(got_t.view(np.uint32), w.t().float().contiguous().numpy().view(np.uint32))


@needs_lib
def test_rounding_equals_torch_and_writes_back_the_widening():
    bits = _rounding_cases()
    a = bits.view(np.float32).copy()
    want = torch.from_numpy(a.copy()).to(torch.bfloat16)
    got = bf16.store(a)
    assert got is not None and np.array_equal(_bits16(got), _bits16(want))
    assert np.array_equal(a.view(np.uint32), want.float().numpy().view(np.uint32))
    assert np.array_equal(bf16.widened(got).view(np.uint32), a.view(np.uint32))  # remembered: the same array
    assert bf16.widened(got) is not None and np.shares_memory(bf16.widened(got), a)


@needs_lib
@pytest.mark.parametrize("nan", [0x7FC00000, 0xFFC00000, 0x7F800001, 0xFFC12345, 0x7FBFFFFF])
def test_an_output_with_a_nan_is_rounded_by_torch(nan):
    a = np.array([1.0, -2.5, 3.0e38, 1e-40, 0.0, 0.0, 7.0], dtype=np.float32)
    a.view(np.uint32)[4] = nan
    want = torch.from_numpy(a.copy()).to(torch.bfloat16)
    got = bf16.store(a)
    assert np.array_equal(_bits16(got), _bits16(want))
    assert bf16.widened(got) is None or not np.shares_memory(bf16.widened(got), a)  # not remembered


@needs_lib
def test_a_remembered_widening_is_dropped_by_an_in_place_change():
    a = np.linspace(-3, 3, 64, dtype=np.float32).reshape(8, 8)
    out = bf16.store(a)
    assert np.shares_memory(bf16.widened(out.reshape(4, 16)), a)  # a view of the same memory hits
    out.add_(1)
    again = bf16.widened(out)
    assert not np.shares_memory(again, a)
    assert np.array_equal(again.view(np.uint32), out.float().numpy().view(np.uint32))


@pytest.mark.parametrize("shape", [(5, 7), (3, 4, 6), (0, 3)])
def test_exact_kernels_conversions_equal_torch(shape):
    rng = np.random.default_rng(1)
    a = rng.standard_normal(shape).astype(np.float32) * 1e3
    want = torch.from_numpy(a.copy()).to(torch.bfloat16)
    got = _back(a.copy(), torch.bfloat16)
    assert (
        got.dtype == torch.bfloat16
        and got.shape == want.shape
        and torch.equal(got.view(torch.int16), want.view(torch.int16))
    )
    assert np.array_equal(_np32(got).view(np.uint32), want.float().numpy().view(np.uint32))
    if len(shape) == 2:  # a weight's transpose, as the linear reads it
        assert np.array_equal(_np32(want.t()).view(np.uint32), want.t().float().contiguous().numpy().view(np.uint32))


@needs_lib
def test_inference_mode_outputs_are_rounded_and_not_remembered():
    a = np.linspace(-3, 3, 64, dtype=np.float32)
    want = torch.from_numpy(a.copy()).to(torch.bfloat16)
    with torch.inference_mode():
        out = bf16.store(a)
        again = bf16.widened(out)
    assert torch.equal(out.view(torch.int16), want.view(torch.int16))
    assert not np.shares_memory(again, a) and np.array_equal(again.view(np.uint32), a.view(np.uint32))
