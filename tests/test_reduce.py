"""Fixed-order reductions: exact left-to-right float64 sums, differentiable, mask-safe."""

import math

import pytest
import torch

from timbench.kernels.reduce import fmean, fsum, masked_mean, masked_sum

pytestmark = pytest.mark.unit  # builds no model (make test-unit)


def test_fsum_is_left_to_right_float64():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, 37, generator=g, dtype=torch.float64) * 1e3
    want = [math.fsum([0.0]) for _ in range(5)]
    for i in range(5):
        s = 0.0
        for v in x[i].tolist():
            s += v
        want[i] = s
    assert fsum(x, -1).tolist() == want


def test_fsum_float32_rounds_once_and_keeps_dtype():
    x = torch.tensor([1.0, 2.0**-30, 2.0**-30, -1.0], dtype=torch.float32)
    # float32 left-to-right would give 0.0 (1 + 2^-30 == 1 in fp32); float64 accumulation keeps 2^-29
    out = fsum(x)
    assert out.dtype == torch.float32 and float(out) == 2.0**-29


def test_fsum_dims_keepdim_and_grad():
    x = torch.randn(3, 4, 5, dtype=torch.float64, requires_grad=True)
    for d in (0, 1, 2, -1, None):
        ref = x.sum() if d is None else x.sum(d)
        assert torch.allclose(fsum(x, d), ref)
    assert fsum(x, 1, keepdim=True).shape == (3, 1, 5)
    fsum(x, 1).pow(2).sum().backward()
    assert torch.equal(x.grad, 2 * x.detach().sum(1, keepdim=True).expand_as(x))


def test_masked_mean_selects_padding_away_and_empty_is_zero():
    x = torch.tensor([[1.0, float("nan")], [float("-inf"), 3.0]])
    m = torch.tensor([[True, False], [False, True]])
    assert float(masked_mean(x, m)) == 2.0
    assert masked_sum(x, m, -1).tolist() == [1.0, 3.0]
    assert float(masked_mean(x, torch.zeros_like(m))) == 0.0
    assert float(fmean(torch.ones(7))) == 1.0


def test_fsum_independent_of_batch_rows():
    x = torch.randn(9, 333)
    full = fsum(x, -1)
    for i in range(9):
        assert fsum(x[i : i + 1], -1)[0].item() == full[i].item()


def test_empty_sums_are_zero():
    assert fsum(torch.zeros(0)).item() == 0.0
    assert fsum(torch.zeros(3, 0), -1).tolist() == [0.0, 0.0, 0.0]


def test_fstd_is_the_two_pass_unbiased_std():
    from timbench.kernels.reduce import fstd

    g = torch.Generator().manual_seed(1)
    x = torch.randn(4, 9, generator=g, dtype=torch.float64)
    for i in range(4):
        row = x[i].tolist()
        mean = 0.0
        for v in row:
            mean += v
        mean /= len(row)
        ss = 0.0
        for v in row:
            ss += (v - mean) * (v - mean)
        assert float(fstd(x, 1)[i]) == math.sqrt(ss / (len(row) - 1))
    assert torch.allclose(fstd(x, 1, keepdim=True), x.std(1, keepdim=True), rtol=1e-14, atol=0)
    assert math.isnan(float(fstd(torch.ones(1))))  # one element, unbiased: 0 / 0, as torch.std


def test_fexp_matches_libm_per_element_and_differentiates():
    from timbench.kernels.pointwise import fexp

    x64 = torch.linspace(-30, 5, 257, dtype=torch.float64)
    assert fexp(x64).tolist() == [math.exp(v) for v in x64.tolist()]
    x = torch.randn(3, 7, requires_grad=True)
    y = fexp(x)
    assert y.dtype == torch.float32 and torch.allclose(y, x.detach().exp())
    y.sum().backward()
    assert torch.equal(x.grad, y.detach())
    assert fexp(torch.zeros(0)).shape == (0,)
    import pytest

    with pytest.raises(TypeError, match="float32 or float64"):
        fexp(torch.zeros(2, dtype=torch.bfloat16))
