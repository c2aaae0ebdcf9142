"""timbench.ratios: the one definition of each ratio quantity, checked against plain Python."""

import math

import torch

from timbench.ratios import (LOG_RATIO_BOUND, k1, k2, k3, log_ratio, log_rho, masked_mean, select, seq_log_ratio,
                             seq_max, seq_mean, seq_sum)

D = torch.float64


def test_log_ratio_clamps_at_20_both_ways():
    assert LOG_RATIO_BOUND == 20.0
    got = log_ratio(torch.tensor([30.0, -30.0, 0.5], dtype=D), torch.tensor([0.0, 0.0, 1.5], dtype=D))
    assert got.tolist() == [20.0, -20.0, -1.0]


def test_k_estimators_by_hand():
    lr = torch.tensor([math.log(2), 0.0, -math.log(4)], dtype=D)
    assert k1(lr).tolist() == [-math.log(2), -0.0, math.log(4)]
    assert k2(lr).tolist() == [0.5 * math.log(2) ** 2, 0.0, 0.5 * math.log(4) ** 2]
    want = [2 - 1 - math.log(2), 0.0, 0.25 - 1 + math.log(4)]
    assert all(math.isclose(a, b, rel_tol=1e-15) for a, b in zip(k3(lr).tolist(), want))
    assert float(k3(torch.linspace(-5, 5, 101, dtype=D)).min()) >= -1e-15  # >= 0 up to rounding near log r = 0


def test_log_rho_is_zero_outside_the_mask_even_for_nan():
    old = torch.tensor([[-1.0, math.nan, 50.0]], dtype=torch.float32)
    roll = torch.tensor([[-1.5, -2.0, 0.0]], dtype=torch.float32)
    lr = log_rho(old, roll, torch.tensor([[True, False, True]]))
    assert lr.dtype == D and lr.tolist() == [[0.5, 0.0, 20.0]]
    assert select(torch.tensor([math.nan, 1.0]), torch.tensor([False, True])).tolist() == [0.0, 1.0]


def test_sequence_forms_over_masked_in_tokens():
    x = torch.tensor([[1.0, 2.0, 100.0], [-3.0, math.nan, 4.0], [7.0, 7.0, 7.0]], dtype=D)
    mask = torch.tensor([[True, True, False], [True, False, True], [False, False, False]])
    assert seq_sum(x, mask).tolist() == [3.0, 1.0, 0.0]
    assert seq_mean(x, mask).tolist() == [1.5, 0.5, 0.0]  # an empty row gives 0, not NaN
    assert seq_max(x, mask).tolist() == [2.0, 4.0, -math.inf]
    assert float(masked_mean(x, mask)) == (1 + 2 - 3 + 4) / 4
    big = torch.full((1, 3), 9.0, dtype=D)  # sum 27 -> clamped to 20, as verl clamps the raw sum
    assert seq_log_ratio(big, torch.ones(1, 3, dtype=torch.bool)).tolist() == [20.0]
