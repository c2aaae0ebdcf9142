"""timbench.rl.drift: C(r) = -(r - 1) A under the trainer's and the engine's old policy."""

import math

import pytest
import torch

from timbench.rl import objective_drift

pytestmark = pytest.mark.unit  # builds no model (make test-unit)

D = torch.float64
KEYS = [
    "drift/c_train_mean",
    "drift/c_rollout_mean",
    "drift/diff_mean",
    "drift/diff_abs_mean",
    "drift/diff_pos_adv_mean",
    "drift/diff_neg_adv_mean",
    "drift/frac_pos_adv",
]


def test_hand_computed_drift_by_sign_of_advantage_with_poisoned_padding():
    # Trainer (pi_old) and engine (mu) logprobs differ on every real token; probabilities are powers of 2.
    ln = lambda p: math.log(p)  # noqa: E731
    nan, inf = math.nan, math.inf
    logprobs = torch.tensor([[ln(0.5), ln(0.25), -inf], [ln(0.5), ln(0.5), nan]], dtype=D)
    old = torch.tensor([[ln(0.25), ln(0.5), nan], [ln(0.5), ln(0.125), -inf]], dtype=D)
    roll = torch.tensor([[ln(0.5), ln(0.125), -inf], [ln(0.25), ln(0.5), nan]], dtype=D)
    adv = torch.tensor([2.0, -1.0], dtype=D)
    mask = torch.tensor([[True, True, False], [True, True, False]])  # column 2 is padding (NaN / -inf)
    d = objective_drift(logprobs, old, roll, adv, mask)
    # row 0 (A = +2): r_train = [2, .5] -> C_train = -(r - 1) A = [-2, 1]; r_rollout = [1, 2] -> C_rollout = [0, -2]
    # row 1 (A = -1): r_train = [1, 4] -> C_train = [0, 3];               r_rollout = [2, 1] -> C_rollout = [1, 0]
    # diff = C_train - C_rollout = [[-2, 3], [-1, 3]]
    want = {
        "drift/c_train_mean": (-2 + 1 + 0 + 3) / 4,
        "drift/c_rollout_mean": (0 - 2 + 1 + 0) / 4,
        "drift/diff_mean": (-2 + 3 - 1 + 3) / 4,
        "drift/diff_abs_mean": (2 + 3 + 1 + 3) / 4,
        "drift/diff_pos_adv_mean": (-2 + 3) / 2,
        "drift/diff_neg_adv_mean": (-1 + 3) / 2,
        "drift/frac_pos_adv": 0.5,
    }
    assert set(d) == set(KEYS)
    for k, v in want.items():
        assert d[k] == pytest.approx(v, rel=1e-12, abs=1e-12), k
    # Tokens where trainer and engine agree contribute exactly 0 to diff: make row 1 agree everywhere.
    agree = objective_drift(logprobs, old, torch.where(torch.arange(2)[:, None] == 1, old, roll), adv, mask)
    assert agree["drift/diff_neg_adv_mean"] == 0.0 and agree["drift/diff_pos_adv_mean"] == d["drift/diff_pos_adv_mean"]


def test_drift_sign_split_hand_example():
    logp = torch.zeros(2, 2, dtype=D)
    old_train = torch.zeros(2, 2, dtype=D)  # r_train = 1 -> C_train = 0
    ln2 = math.log(2)
    old_rollout = torch.tensor([[ln2, -ln2], [-ln2, 0.0]], dtype=D)  # r_rollout = [[.5, 2], [2, 1]]
    adv = torch.tensor([1.0, -1.0], dtype=D)
    d = objective_drift(logp, old_train, old_rollout, adv)
    # C_rollout = -(r - 1) A: row 0 (A = +1): [.5, -1]; row 1 (A = -1): [1, 0]
    # diff = 0 - C_rollout = [[-.5, 1], [-1, 0]]
    want = {
        "drift/c_train_mean": 0.0,
        "drift/c_rollout_mean": (0.5 - 1 + 1 + 0) / 4,
        "drift/diff_mean": (-0.5 + 1 - 1 + 0) / 4,
        "drift/diff_abs_mean": (0.5 + 1 + 1 + 0) / 4,
        "drift/diff_pos_adv_mean": (-0.5 + 1) / 2,
        "drift/diff_neg_adv_mean": (-1 + 0) / 2,
        "drift/frac_pos_adv": 0.5,
    }
    for k, v in want.items():
        assert d[k] == pytest.approx(v, abs=1e-12), k


def test_mask_token_advantages_and_missing_sign():
    ln2 = math.log(2)
    logp = torch.zeros(1, 3, dtype=D)
    old_rollout = torch.tensor([[ln2, ln2, 5.0]], dtype=D)  # last token masked out
    adv = torch.tensor([[2.0, 0.0, 2.0]], dtype=D)  # per-token advantages; A = 0 is neither sign
    d = objective_drift(logp, torch.zeros(1, 3, dtype=D), old_rollout, adv, torch.tensor([[1, 1, 0]]))
    # r_rollout = .5: C_rollout = [1, 0]; diff = [-1, 0]
    assert d["drift/diff_mean"] == pytest.approx(-0.5)
    assert d["drift/diff_pos_adv_mean"] == pytest.approx(-1.0)
    assert d["drift/diff_neg_adv_mean"] == 0.0  # no A < 0 tokens
    assert d["drift/frac_pos_adv"] == pytest.approx(0.5)


def test_empty_mask_is_all_zero():
    x = torch.zeros(2, 3)
    d = objective_drift(x, x, x + 1, torch.ones(2), torch.zeros(2, 3, dtype=torch.bool))
    assert all(v == 0.0 for v in d.values())
