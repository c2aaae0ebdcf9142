"""rounding_aligned (TRACE): the trainer's quantized weights round toward the rollout's codewords."""

from __future__ import annotations

import json

import pytest
import torch

from timbench.quant import WEIGHT_QUANT, fake_quant, quantize_weight
from timbench.quant.aligned import SPLITS, codewords, quantize_aligned
from timbench.remedies import load_remedy
from timbench.rl.config import load_config
from timbench.rl.loop import run

BASE = ["steps=2", "prompts_per_step=2", "group_size=4", "eval_every=2", "eval_n=8", "engine.weight_quant=nvfp4"]


def _row(values):
    return torch.tensor([values], dtype=torch.float32)


def test_int_grid_rounds_toward_the_rollout_codeword_by_hand():
    # int4: one group, scale = amax / 7 = 0.125 (exact), so y = w / 0.125.
    w_roll = _row([0.875, 0.195, 0.18, -0.32, 0.4375, 0.3875])  # y 7, 1.56, 1.44, -2.56, 3.5, 3.1
    w_now = _row([0.875, 0.18, 0.195, -0.30, 0.4375, 0.05])  # y 7, 1.44, 1.56, -2.4, 3.5, 0.4
    codes = codewords(w_roll, "int4")
    assert codes[0, 0, :6].tolist() == [7, 2, 1, -3, 4, 3]  # round half to even: 3.5 -> 4
    # nearest (unified_precision) rounds the trainer's own y; aligned takes the rollout's neighbour,
    # and the last codeword (3) is no neighbour of 0.4 any more: clamp -> 1, nearest -> 0.
    assert quantize_weight(w_now, "int4")[0].tolist() == [0.875, 0.125, 0.25, -0.25, 0.5, 0.0]
    assert quantize_aligned(w_now, "int4", codes)[0].tolist() == [0.875, 0.25, 0.125, -0.375, 0.5, 0.125]
    assert quantize_aligned(w_now, "int4", codes, "nearest")[0].tolist() == [0.875, 0.25, 0.125, -0.375, 0.5, 0.0]


def test_float_grid_rounds_toward_the_rollout_codeword_by_hand():
    # mxfp4: block amax 4 -> E8M0 scale 2^(2 - 2) = 1, so y = w on the E2M1 grid 0 .5 1 1.5 2 3 4 6.
    w_roll = _row([4.0, 2.6, 2.4, 0.8, -1.2, -0.2])
    w_now = _row([4.0, 2.4, 2.6, 0.7, -1.3, 0.2])
    codes = codewords(w_roll, "mxfp4")
    assert codes[0, 0, :6].tolist() == [4.0, 3.0, 2.0, 1.0, -1.0, -0.0]
    assert quantize_weight(w_now, "mxfp4")[0].tolist() == [4.0, 2.0, 3.0, 0.5, -1.5, 0.0]
    # 0.2 lies in [0, 0.5]: the rollout's -0 clamps to the neighbour 0
    assert quantize_aligned(w_now, "mxfp4", codes)[0].tolist() == [4.0, 3.0, 2.0, 1.0, -1.0, 0.0]


@pytest.mark.parametrize("name", sorted(SPLITS))
def test_own_codewords_reproduce_the_scheme_bitwise(name):
    g = torch.Generator().manual_seed(1)
    differ = 0
    for shape in [(48, 160), (130, 200), (3, 17)]:
        w = torch.randn(*shape, generator=g) * 0.05
        w[0, :6] = torch.tensor([0.0, -0.0, 1e-9, -1e-9, 3.0, -3.0])  # signed zeros, underflow, saturation
        want = quantize_weight(w, name)
        got = quantize_aligned(w, name, codewords(w, name))
        assert torch.equal(got.view(torch.int32), want.view(torch.int32))
        moved = w + torch.randn(*shape, generator=g) * 1e-3  # later weights: some codewords differ
        differ += int((quantize_aligned(moved, name, codewords(w, name)) != quantize_weight(moved, name)).sum())
    assert differ > 0


def test_every_weight_scheme_but_awq_is_supported():
    assert set(WEIGHT_QUANT) - set(SPLITS) == {"int4_awq"}


def test_gradient_is_straight_through():
    w = (torch.randn(8, 32, generator=torch.Generator().manual_seed(2)) * 0.1).requires_grad_(True)
    codes = codewords(w.detach() + 0.01, "nvfp4")
    g = torch.linspace(-1, 1, 256).reshape(8, 32)
    (fake_quant(w, lambda t: quantize_aligned(t, "nvfp4", codes)) * g).sum().backward()
    assert torch.equal(w.grad, g)


def _metrics(path):
    return (path / "metrics.jsonl").read_bytes()


def test_equals_unified_precision_where_the_weights_are_the_rollouts_and_differs_after_an_update(tmp_path):
    one = BASE + ["mini_batches=1"]
    run(load_config(None, one + ["remedy=unified_precision"]), tmp_path / "up1", progress=False)
    run(load_config(None, one + ["remedy=rounding_aligned"]), tmp_path / "ra1", progress=False)
    assert _metrics(tmp_path / "up1") == _metrics(tmp_path / "ra1")
    two = BASE + ["mini_batches=2"]
    run(load_config(None, two + ["remedy=unified_precision"]), tmp_path / "up2", progress=False)
    run(load_config(None, two + ["remedy=rounding_aligned"]), tmp_path / "ra2", progress=False)
    up, ra = ([json.loads(x) for x in _metrics(tmp_path / d).splitlines()] for d in ("up2", "ra2"))
    assert up[0]["critic/rewards/mean"] == ra[0]["critic/rewards/mean"]  # same rollouts at step 0
    assert all(r["rollout_corr/k3_kl"] == 0.0 for r in up + ra)  # the recompute matches either way
    assert up[0]["actor/loss"] != ra[0]["actor/loss"]  # the second mini-batch's pass differs


def test_bad_values_are_one_line_errors():
    with pytest.raises(ValueError, match="outside 'up' is invalid; valid: clamp, nearest"):
        load_remedy("rounding_aligned", {"outside": "up"})
    with pytest.raises(ValueError, match="unknown parameter"):
        load_remedy("rounding_aligned", {"C": 2})
    with pytest.raises(ValueError, match="does not support weight_quant=int4_awq; supported: fp8, "):
        load_config(None, ["remedy=rounding_aligned", "engine.weight_quant=int4_awq"])
    with pytest.raises(ValueError, match="rollout codewords have shape"):
        quantize_aligned(torch.zeros(2, 32), "mxfp4", torch.zeros(2, 2, 32))
