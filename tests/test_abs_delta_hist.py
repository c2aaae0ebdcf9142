"""abs_delta_histogram: fixed log10 bins with an exact-zero bin (timbench.metrics.mismatch.ABS_DELTA_BINS)."""

import pytest
import torch

from timbench.metrics.mismatch import ABS_DELTA_BINS, abs_delta_histogram

pytestmark = pytest.mark.unit  # builds no model (make test-unit)


def test_bins_are_documented_and_contiguous():
    assert len(ABS_DELTA_BINS) == 12 and ABS_DELTA_BINS[0] == (0.0, 0.0) and ABS_DELTA_BINS[1] == (0.0, 1e-9)
    assert ABS_DELTA_BINS[-1] == (1.0, float("inf"))
    for (_, hi), (lo, _) in zip(ABS_DELTA_BINS[1:], ABS_DELTA_BINS[2:]):
        assert hi == lo


def test_each_value_lands_in_its_bin_and_the_mask_is_honoured():
    d = torch.tensor([0.0, 5e-10, 1e-9, 3e-8, -0.05, 0.1, 0.99, 1.0, -7.0, 123.0], dtype=torch.float64)
    lp_rollout = torch.full_like(d, -2.0)
    counts = abs_delta_histogram(lp_rollout + d, lp_rollout)
    #         0  <1e-9 [-9,-8) [-8,-7) ... [-2,-1) [-1,0) >=1
    assert counts == [1, 1, 1, 1, 0, 0, 0, 0, 0, 1, 2, 3]
    mask = torch.tensor([True] * 5 + [False] * 5)
    assert abs_delta_histogram(lp_rollout + d, lp_rollout, mask) == [1, 1, 1, 1, 0, 0, 0, 0, 0, 1, 0, 0]
    # [B, T] with padding: only unmasked tokens count, and identical logprobs are all exact zeros
    lp = torch.randn(3, 5, dtype=torch.float64)
    m = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]], dtype=torch.bool)
    assert abs_delta_histogram(lp, lp.clone(), m) == [9] + [0] * 11


def test_bad_input_raises():
    with pytest.raises(ValueError, match="NaN"):
        abs_delta_histogram(torch.tensor([float("nan")]), torch.tensor([0.0]))
    with pytest.raises(ValueError, match="mask shape"):
        abs_delta_histogram(torch.zeros(2, 3), torch.zeros(2, 3), torch.ones(3, dtype=torch.bool))
