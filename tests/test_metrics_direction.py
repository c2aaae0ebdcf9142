"""The direction-aware metrics (TRIAGE, arXiv 2610.07043): quadrant shares, imbalance ratios and the tail's
segment concentration, against hand-computed values, and their zero-mismatch values in a real run."""

from __future__ import annotations

import json

import pytest
import torch

from timbench.metrics.direction import (
    IMBALANCE_CAP,
    QUADRANTS,
    direction_metrics,
    quadrant_metrics,
    tail_segment_concentration,
)
from timbench.rl.config import load_config
from timbench.rl.loop import run

NAN = float("nan")
# Two responses (A = +1, A = -2), three positions; the last position of row 1 is padding (NaN must not leak).
DELTA = torch.tensor([[0.2, -0.1, 0.0], [-0.3, 0.4, NAN]], dtype=torch.float64)
ADV = torch.tensor([1.0, -2.0])
MASK = torch.tensor([[True, True, True], [True, True, False]])


def test_quadrant_shares_and_imbalance_by_hand():
    # |A| |delta|: row 0 -> 0.2 (A>0, d>0), 0.1 (A>0, d<0), 0; row 1 -> 0.6 (A<0, d<0), 0.8 (A<0, d>0). Total 1.7.
    m = quadrant_metrics(DELTA, ADV, MASK)
    want = {
        "pos_adv_pos_delta": 0.2 / 1.7,
        "pos_adv_neg_delta": 0.1 / 1.7,
        "neg_adv_pos_delta": 0.8 / 1.7,
        "neg_adv_neg_delta": 0.6 / 1.7,
    }
    for q in QUADRANTS:
        assert m[f"tim/quadrant_mass/{q}"] == pytest.approx(want[q], rel=1e-12)
    assert m["tim/neg_adv_imbalance"] == pytest.approx(0.6 / 0.8, rel=1e-12)
    assert m["tim/pos_adv_imbalance"] == pytest.approx(0.1 / 0.2, rel=1e-12)


def test_imbalance_conventions_at_empty_quadrants():
    zero = quadrant_metrics(torch.zeros(2, 3, dtype=torch.float64), ADV, MASK)
    assert all(zero[f"tim/quadrant_mass/{q}"] == 0.0 for q in QUADRANTS)
    assert zero["tim/neg_adv_imbalance"] == zero["tim/pos_adv_imbalance"] == 1.0
    only_neg = quadrant_metrics(torch.tensor([[0.0, 0, 0], [-0.5, -0.1, 0]], dtype=torch.float64), ADV, MASK)
    assert only_neg["tim/neg_adv_imbalance"] == IMBALANCE_CAP
    assert only_neg["tim/quadrant_mass/neg_adv_neg_delta"] == 1.0


def test_tail_segment_concentration_by_hand():
    # Segments of 2: row 0 -> (0.2, 0.1), (0.0, pad); row 1 -> (0.3, 0.4), (pad, pad: dropped). Live |delta|
    # [0.2, 0.1, 0, 0.3, 0.4]: median 0.2, so the tail is {0.2, 0.3, 0.4} with per-segment counts 1, 0, 2.
    assert tail_segment_concentration(DELTA, MASK, segment=2, quantile=0.5, worst=0.1) == pytest.approx(2 / 3)
    assert tail_segment_concentration(DELTA, MASK, segment=2, quantile=0.5, worst=0.5) == 1.0
    # One segment per row (64 tokens): the tail tokens of row 1 (2 of 3) are in the worst of 2 segments.
    assert tail_segment_concentration(DELTA, MASK, quantile=0.5, worst=0.5) == pytest.approx(2 / 3)
    assert tail_segment_concentration(torch.zeros(2, 3), MASK) == 0.0
    assert tail_segment_concentration(DELTA, torch.zeros(2, 3, dtype=torch.bool)) == 0.0


@pytest.mark.parametrize("kw", [{"segment": 0}, {"segment": 2.5}, {"quantile": 1.0}, {"worst": 0.0}])
def test_bad_parameters_are_one_line_errors(kw):
    with pytest.raises(ValueError, match="must be"):
        tail_segment_concentration(DELTA, MASK, **kw)


def test_direction_metrics_sign_convention():
    """delta = log pi_old - log mu: pi_old below mu on an A < 0 response is the (A < 0, delta < 0) quadrant."""
    old = torch.tensor([[-1.0, -2.0]])
    roll = torch.tensor([[-0.5, -2.0]])
    m = direction_metrics(old, roll, torch.tensor([-1.0]), torch.ones(1, 2, dtype=torch.bool))
    assert m["tim/quadrant_mass/neg_adv_neg_delta"] == 1.0 and m["tim/neg_adv_imbalance"] == IMBALANCE_CAP


def test_logged_every_step_zero_at_zero_mismatch_and_summing_to_one_under_nvfp4(tmp_path):
    base = ["steps=2", "prompts_per_step=2", "group_size=4", "eval_every=2", "eval_n=8"]
    run(load_config(None, base), tmp_path / "zero", progress=False)
    run(load_config(None, base + ["engine.weight_quant=nvfp4"]), tmp_path / "nvfp4", progress=False)
    rows = lambda d: [json.loads(x) for x in (tmp_path / d / "metrics.jsonl").read_text().splitlines()]
    for r in rows("zero"):
        assert all(r[f"tim/quadrant_mass/{q}"] == 0.0 for q in QUADRANTS)
        assert r["tim/neg_adv_imbalance"] == 1.0 and r["tim/tail_seg_concentration"] == 0.0
    for r in rows("nvfp4"):
        assert sum(r[f"tim/quadrant_mass/{q}"] for q in QUADRANTS) == pytest.approx(1.0, rel=1e-12)
        assert 0.0 < r["tim/tail_seg_concentration"] <= 1.0
