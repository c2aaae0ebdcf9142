"""mma_accum=: the exact linear's K reduction in blocks, against a hand-written loop, and as a mismatch condition."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from timbench.align import align
from timbench.kernels import get_kernels
from timbench.kernels import numba_ops as nb
from timbench.kernels.mma_accum import blocked_matmul
from timbench.model import Compute, load_model
from timbench.spec.keys import SpecError, parse_spec
from timbench.spec.mma import MmaAccum, parse_mma_accum


def _data(m=5, k=64, n=7, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32))


def _by_hand(x, wt, block, mantissa=None):
    """The definition, one scalar fp32 operation at a time (numpy float32 scalars round every step)."""
    m, k = x.shape
    out = np.zeros((m, wt.shape[1]), dtype=np.float32)
    for i in range(m):
        for j in range(wt.shape[1]):
            acc = None
            for s in range(0, k, block):
                part = np.float32(0)
                for t in range(s, s + block):
                    part = np.float32(part + np.float32(x[i, t] * wt[t, j]))
                acc = part if acc is None else np.float32(acc + part)
                if mantissa is not None:
                    bits = np.array([acc], dtype=np.float32).view(np.uint32)[0]
                    acc = np.array([bits & ~np.uint32((1 << (23 - mantissa)) - 1)], dtype=np.uint32).view(np.float32)[0]
            out[i, j] = acc
    return out


@pytest.mark.parametrize("block,mantissa", [(16, None), (8, None), (32, 13), (4, 10)])
def test_blocked_matmul_is_the_definition_bitwise(block, mantissa):
    x, wt = _data()
    got = blocked_matmul(x, wt, MmaAccum(block, mantissa))
    assert np.array_equal(got.view(np.uint32), _by_hand(x, wt, block, mantissa).view(np.uint32))


def test_one_chain_is_block_1_and_block_k_and_other_widths_differ():
    x, wt = _data(k=128, seed=1)
    chain = nb.matmul(x, wt)
    for b in (1, 128):
        assert np.array_equal(blocked_matmul(x, wt, MmaAccum(b)), chain)
    assert not np.array_equal(blocked_matmul(x, wt, MmaAccum(16)), chain)  # the order is visible
    exact = x.astype(np.float64) @ wt.astype(np.float64)
    assert np.abs(blocked_matmul(x, wt, MmaAccum(16)) - exact).max() < 1e-4  # and still a matmul
    chopped = blocked_matmul(x, wt, MmaAccum(16, 8))
    assert np.all(chopped.view(np.uint32) & np.uint32((1 << 15) - 1) == 0)  # only 8 mantissa bits left
    assert np.abs(chopped - exact).max() > np.abs(blocked_matmul(x, wt, MmaAccum(16)) - exact).max()


def test_a_block_that_does_not_divide_k_is_a_one_line_error():
    x, wt = _data(k=64)
    for b in (48, 65):
        with pytest.raises(ValueError, match=f"block width {b} must divide the matmul's K=64.*valid widths"):
            blocked_matmul(x, wt, MmaAccum(b))


@pytest.mark.parametrize("bad", ["0", "-16", "x", "16:e0", "16:e23", "16:13", "16:e"])
def test_bad_values_are_spec_errors(bad):
    with pytest.raises(SpecError, match=f"invalid value '{bad}' for mma_accum; valid: none\\|B\\|B:eM"):
        parse_spec(f"mma_accum={bad}")


def test_spec_round_trip_and_kernel_checks():
    s = parse_spec("mma_accum=32:e13")
    assert s.mma_accum == MmaAccum(32, 13) and str(s) == "kernels=exact,dtype=fp32,mma_accum=32:e13"
    assert parse_spec(str(s)) == s and parse_mma_accum("none") == MmaAccum()
    assert str(parse_spec("mma_accum=none")) == "kernels=exact,dtype=fp32"  # the default stays out of the string
    with pytest.raises(SpecError, match="mma_accum=16 needs kernels=exact"):
        parse_spec("kernels=torch,mma_accum=16")
    with pytest.raises(ValueError, match="needs kernels=exact"):
        Compute(get_kernels("torch"), s)
    assert Compute.from_spec(s).kernels.mma_accum == MmaAccum(32, 13)


def test_trainer_gradients_flow_through_the_blocked_forward():
    kn = Compute.from_spec(parse_spec("mma_accum=16")).kernels
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(0), requires_grad=True)
    w = torch.randn(5, 64, generator=torch.Generator().manual_seed(1), requires_grad=True)
    out = kn.linear(x, w)
    out.sum().backward()
    plain = get_kernels("exact").linear(x.detach(), w.detach())
    assert not torch.equal(out.detach(), plain) and torch.allclose(out.detach(), plain, atol=1e-5)
    assert torch.allclose(x.grad, w.sum(0).expand(3, 64), atol=1e-5)  # d(sum xW^T)/dx = column sums of W


def test_same_value_on_both_sides_is_zero_mismatch_and_different_values_are_not():
    model = load_model("tiny-moe", seed=0)
    batches = [2, 3]
    same = align(model, "mma_accum=16:e13", "mma_accum=16:e13", batches=batches)
    assert same["max_abs_diff"] == 0.0
    other = align(model, "mma_accum=16", "kernels=exact", batches=batches)
    assert other["max_abs_diff"] > 0.0


def test_committed_accumulation_table():
    """results/align/align_mma.json: zero rows exactly 0.0; a fp32 block order sits far below bf16, the
    14-bit accumulator between them (the README's reading of the table)."""
    import json
    from pathlib import Path

    rows = json.loads((Path(__file__).resolve().parents[1] / "results/align/align_mma.json").read_text())
    assert len(rows) == 16
    for model in {r["model_name"] for r in rows}:
        by = {r["condition"]: r for r in rows if r["model_name"] == model}
        assert all(r["max_abs_diff"] == 0.0 for c, r in by.items() if c.startswith("zero:"))
        k16 = by["K blocks of 16 (bf16 mma.sync k16), fp32 accumulator"]["mean_abs_diff"]
        e13 = by["K blocks of 32, 14-bit accumulator (FP8 wgmma, 32:e13)"]["mean_abs_diff"]
        assert 0 < 100 * k16 < e13 < by["bf16 engine"]["mean_abs_diff"]


def test_an_rl_run_with_the_same_accumulation_on_both_sides_has_zero_mismatch(tmp_path):
    import json

    from timbench.metrics.schema import MAX_ABS_DELTA
    from timbench.rl.config import load_config
    from timbench.rl.loop import run

    sets = ["steps=2", "prompts_per_step=2", "group_size=4", "eval_every=2", "eval_n=8", "engine.mma_accum=16:e13"]
    run(load_config(None, sets + ["trainer.mma_accum=16:e13"]), tmp_path / "same", progress=False)
    run(load_config(None, sets), tmp_path / "engine-only", progress=False)
    same = [json.loads(line) for line in (tmp_path / "same/metrics.jsonl").read_text().splitlines()]
    other = [json.loads(line) for line in (tmp_path / "engine-only/metrics.jsonl").read_text().splitlines()]
    assert [r[MAX_ABS_DELTA] for r in same] == [0.0, 0.0]
    assert all(r[MAX_ABS_DELTA] > 0.0 for r in other)
