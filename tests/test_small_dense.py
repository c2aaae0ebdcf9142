"""The small-dense preset (the dense proxy-fidelity check's larger model): shapes every kernel and condition accepts,
exact engine = exact trainer bit for bit, quantized rollouts that run and bite, a bitwise-reproducible RL
step from its shipped warm start, and the proxy_dense grid that plans with it."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from timbench.engine import Engine, Request, SamplingParams
from timbench.grid.cost import CELL_OVERHEAD_S, MODEL_FACTOR, MOE_FACTOR, cell_seconds, model_factor
from timbench.grid.spec import expand, load_grid
from timbench.kernels import get_kernels
from timbench.model import PRESETS, Compute, ModelConfig, Qwen3ForCausalLM
from timbench.rl.config import load_config
from timbench.rl.loop import run
from timbench.spec.keys import Spec
from timbench.trainer import sequence_logprobs

ROOT = Path(__file__).resolve().parents[1]
SMALL, TINY = PRESETS["small-dense"], PRESETS["tiny-dense"]


@pytest.fixture(scope="module")
def small():
    return Qwen3ForCausalLM(SMALL, seed=4)


def _requests(n, seed=0):
    rng = random.Random(seed)
    return [
        Request(tuple(rng.randrange(3, 99) for _ in range(rng.randint(1, 16))), rng.randint(4, 16), i) for i in range(n)
    ]


def test_small_dense_is_a_wider_deeper_tiny_dense_that_every_condition_can_shard():
    assert SMALL.model_type == "qwen3" and not SMALL.is_moe
    assert SMALL.hidden_size > TINY.hidden_size and SMALL.num_hidden_layers > TINY.num_hidden_layers
    assert 3 <= SMALL.num_parameters() / TINY.num_parameters() <= 4
    # tiny-dense's shape kept: heads x head_dim = hidden, intermediate = 2 x hidden, GQA
    assert SMALL.num_attention_heads * SMALL.head_dim == SMALL.hidden_size and SMALL.head_dim == TINY.head_dim
    assert SMALL.intermediate_size == 2 * SMALL.hidden_size
    # the reduction widths (K) of every linear: NVFP4 (16) and MX (32) blocks tile them, simulated tp 2 and 4
    # (row-parallel o_proj / down_proj) split them evenly
    widths = {SMALL.hidden_size, SMALL.num_attention_heads * SMALL.head_dim, SMALL.intermediate_size}
    assert all(k % 32 == 0 and k % 4 == 0 for k in widths)
    assert SMALL.num_key_value_heads in (1, 2) and SMALL.num_attention_heads % SMALL.num_key_value_heads == 0


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_exact_engine_and_trainer_agree_bitwise_on_small_dense(small, dtype):
    engine = Engine(small.config, f"kernels=exact,dtype={dtype}", max_num_seqs=8)
    engine.load_weights(small)
    comps = engine.generate(_requests(12), SamplingParams(seed=1))  # 12 > 8 slots: requests join mid-decode
    c = Compute(get_kernels("exact"), Spec(dtype=dtype))
    with torch.no_grad():
        res = sequence_logprobs(small, c, [(x.prompt_ids, x.token_ids) for x in comps[::-1]])
    for r, x in enumerate(comps[::-1]):
        assert (res.logprobs[r][res.mask[r]] - x.logprobs).abs().max().item() == 0.0


@pytest.fixture(scope="module")
def exact_rollouts(small):
    engine = Engine(small.config, "kernels=exact", max_num_seqs=8)
    engine.load_weights(small)
    return engine.generate(_requests(6, seed=2), SamplingParams(seed=3))


@pytest.mark.parametrize("wq", ["nvfp4", "mxfp4", "int4"])
def test_four_bit_rollouts_run_on_small_dense_and_change_the_logprobs(small, exact_rollouts, wq):
    quant = Engine(small.config, f"kernels=exact,weight_quant={wq}", max_num_seqs=8)
    quant.load_weights(small)
    got = quant.generate(_requests(6, seed=2), SamplingParams(seed=3))
    assert all(torch.isfinite(x.logprobs).all() for x in got)
    # the first sampled token's logprob (same prompt, same sampling noise): the format's rounding moves it
    assert all((x.logprobs[0] - y.logprobs[0]).abs().item() > 0.0 for x, y in zip(exact_rollouts, got))


def _cfg(threads: int):
    return load_config(
        None,
        [
            "preset=small-dense",
            "steps=1",
            "prompts_per_step=4",
            "group_size=4",
            "mini_batches=2",
            "eval_every=1",
            "eval_n=8",
            "lr=1e-4",
            f"threads={threads}",
            "engine.weight_quant=nvfp4",
        ],
    )


def test_one_rl_step_from_the_shipped_small_dense_warm_start_is_bitwise_reproducible(tmp_path):
    import numba

    before = torch.get_num_threads(), numba.get_num_threads()
    try:  # the second run on two threads: the same bytes on any thread count
        a = run(_cfg(1), tmp_path / "a", progress=False)
        b = run(_cfg(2), tmp_path / "b", progress=False)
    finally:  # the runs set torch's and numba's threads; the tests after this one keep conftest's
        torch.set_num_threads(before[0])
        numba.set_num_threads(before[1])
    assert a["status"] == b["status"] == "finished"
    for name in ("metrics.jsonl", "eval.jsonl"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    assert a["mean/mismatch/mean_abs_delta"] > 0.0  # the nvfp4 engine really mismatches the fp32 trainer


def test_proxy_dense_grid_plans_and_prices_small_dense_above_tiny_dense():
    cells = expand(load_grid(ROOT / "bench/grids/proxy_dense.yaml"))
    by_model = {}
    for c in cells:
        by_model.setdefault(c.axes["model"], []).append(c)
    assert set(by_model) == {"tiny-dense", "small-dense"} and len(cells) == 42
    assert len(by_model["tiny-dense"]) == len(by_model["small-dense"])
    for c in cells:  # a mismatched cell's reference is the same model's zero-mismatch cell of its seed
        if c.axes["condition"] != "baseline":
            assert c.reference == f"add-4d-v1.{c.axes['model']}.baseline.none.recompute.grpo.s{c.axes['seed']}"
    # the plan prices every small-dense cell at the measured factor over the same tiny-dense cell
    tiny = {c.id.replace(".tiny-dense.", "."): cell_seconds(c.config) - CELL_OVERHEAD_S for c in by_model["tiny-dense"]}
    for c in by_model["small-dense"]:
        ratio = (cell_seconds(c.config) - CELL_OVERHEAD_S) / tiny[c.id.replace(".small-dense.", ".")]
        assert ratio == pytest.approx(MODEL_FACTOR["small-dense"])


def test_cost_model_scales_a_cell_by_its_model_size(monkeypatch):
    assert model_factor("tiny-dense") == 1.0 and model_factor("tiny-moe") == MOE_FACTOR
    assert model_factor("small-dense") == MODEL_FACTOR["small-dense"] > 2
    assert model_factor("/some/checkpoint") == 1.0  # not a preset: priced as tiny-dense
    # a dense preset nobody measured: its parameter count relative to tiny-dense (an upper bound)
    wide = ModelConfig(hidden_size=256, intermediate_size=512, num_attention_heads=8)
    monkeypatch.setitem(PRESETS, "wide-dense", wide)
    assert model_factor("wide-dense") == pytest.approx(wide.num_parameters() / TINY.num_parameters())
    assert model_factor("wide-dense") > 3
