"""Low-precision conditions wired through the model: same keys on both sides are bitwise zero mismatch,
a quantized engine is a real mismatch, the KV cache format is what the engine attends to, the engine's
quantized-weight cache follows weight syncs, and unified precision removes the mismatch in training."""

import json

import pytest
import torch

from timbench.align import align
from timbench.engine import Request, SamplingParams, make_engine
from timbench.model import PRESETS, Compute, Qwen3ForCausalLM, load_model
from timbench.quant import WEIGHT_QUANT
from timbench.rl.config import load_config
from timbench.rl.loop import run
from timbench.spec.keys import SpecError, parse_spec, quantized_reference
from timbench.tasks.base import Task
from timbench.trainer import sequence_logprobs
from timbench.util.shipped import default_checkpoint

BATCHES = (1, 3, 16)
FORMATS = [k for k in WEIGHT_QUANT if k != "none"]


@pytest.mark.parametrize("fmt", FORMATS)
def test_same_weight_format_on_both_sides_is_exactly_zero(model, fmt):
    spec = f"weight_quant={fmt}"
    r = align(model, spec, spec, seed=1, batches=BATCHES)
    assert r["max_abs_diff"] == 0.0 and r["k3_kl"] == 0.0 and r["tokens"] > 100
    if model.config.is_moe:
        assert r["routing_agreement"] == 1.0


@pytest.mark.parametrize(
    "spec",
    [
        "dtype=bf16,weight_quant=nvfp4,act_quant=nvfp4",
        "dtype=bf16,weight_quant=fp8_block,act_quant=fp8_block",
        "dtype=bf16,weight_quant=int8,act_quant=int8",
        "dtype=fp32,weight_quant=mxfp4,act_quant=mxfp8",
        "dtype=bf16,weight_quant=int4,tp=2",
    ],
)
def test_weights_and_activations_quantized_on_both_sides_is_exactly_zero(model, spec):
    r = align(model, spec, spec, seed=2, batches=BATCHES)
    assert r["max_abs_diff"] == 0.0 and r["frac_tokens_differ"] == 0.0
    if model.config.is_moe:
        assert r["routing_agreement"] == 1.0


def test_quantized_engine_is_a_mismatch_ordered_by_bits(dense):
    # fp32 exact trainer throughout; only the engine's weight format changes.
    mean = {
        f: align(dense, f"weight_quant={f}", "kernels=exact", seed=0, batches=BATCHES)["mean_abs_diff"]
        for f in ("int8", "fp8", "nvfp4")
    }
    assert 0.0 < mean["int8"] < mean["fp8"] < mean["nvfp4"]


def test_nvfp4_engine_on_the_dense_warm_start_is_far_above_bf16():
    m = load_model(str(default_checkpoint("add-4d-v1", "tiny-dense")))
    nv = align(m, "weight_quant=nvfp4", "kernels=exact", seed=0, batches=BATCHES)["mean_abs_diff"]
    bf = align(m, "dtype=bf16", "kernels=exact", seed=0, batches=BATCHES)["mean_abs_diff"]
    assert nv > 5 * bf > 0.0


def test_kv_cache_format_is_what_the_engine_attends_to(model):
    # The trainer cannot name an engine-only key, but the same Compute run as a plain forward over the whole
    # sequence must reproduce the engine's prefill + decode with a quantized cache bit for bit.
    spec = parse_spec("kv_cache_dtype=fp8_e4m3", side="engine")
    engine = make_engine(model.config, spec, max_num_seqs=8, weights=model)
    reqs = [Request((5, 9, 17, 4)[: i + 1], 12, i) for i in range(4)]
    outs = engine.generate(reqs, SamplingParams(temperature=1.0, seed=4))
    seqs = [(r.prompt_ids, o.token_ids) for r, o in zip(reqs, outs)]
    with torch.no_grad():
        same = sequence_logprobs(model, Compute.from_spec(spec), seqs)
        plain = sequence_logprobs(model, Compute.from_spec(parse_spec("kernels=exact")), seqs)
    for i, o in enumerate(outs):
        n = len(o.token_ids)
        assert same.logprobs[i, :n].tolist() == o.logprobs.tolist()
    assert (same.logprobs - plain.logprobs).abs().max() > 0.0


def test_engine_requantizes_at_each_weight_sync(dense):
    other = Qwen3ForCausalLM(PRESETS["tiny-dense"], seed=11)
    spec = "weight_quant=nvfp4,act_quant=nvfp4"
    reqs = [Request((3, 4, 5), 10, 0), Request((7, 8), 10, 1)]
    params = SamplingParams(temperature=1.0, seed=0)
    reused = make_engine(dense.config, spec, max_num_seqs=4, weights=dense)
    reused.generate(reqs, params)  # fills the quantized-weight cache with `dense`
    reused.load_weights(other)
    fresh = make_engine(dense.config, spec, max_num_seqs=4, weights=other)
    a, b = reused.generate(reqs, params), fresh.generate(reqs, params)
    assert [o.logprobs.tolist() for o in a] == [o.logprobs.tolist() for o in b]


def test_spec_errors_are_one_line():
    for bad, needle in [
        ("weight_quant=fp7", "valid: none|fp8"),
        ("act_quant=fp8", "needs weight_quant"),
        ("kv_cache_dtype=int8", "valid: auto|fp8_e4m3"),
    ]:
        with pytest.raises(SpecError, match=needle) as e:
            parse_spec(bad, "engine spec", side="engine")
        assert "\n" not in str(e.value)
    with pytest.raises(SpecError, match="engine-only"):
        parse_spec("kv_cache_dtype=fp8_e4m3", "trainer spec", side="trainer")


def test_quantized_reference_keeps_only_the_quantization_keys():
    q = quantized_reference(parse_spec("kernels=torch,dtype=bf16,weight_quant=fp8,kv_cache_dtype=fp8_e5m2"))
    assert str(q) == "kernels=exact,dtype=fp32,weight_quant=fp8,kv_cache_dtype=fp8_e5m2"
    assert quantized_reference(parse_spec("dtype=bf16,tp=2")) is None


@pytest.fixture
def parity_reward(monkeypatch):
    monkeypatch.setattr(Task, "reward", lambda self, response, problem, format_reward=0.0: float(len(response) % 2))


def _cfg(tmp_path, *extra):
    from timbench.model import save_checkpoint

    ck = tmp_path / "ck"
    if not ck.exists():
        save_checkpoint(Qwen3ForCausalLM(PRESETS["tiny-dense"], seed=2), ck)
    return load_config(
        None,
        [
            f"model={ck}",
            "steps=2",
            "prompts_per_step=4",
            "group_size=4",
            "mini_batches=2",
            "eval_every=2",
            "eval_n=8",
            "lr=1e-3",
            "engine.weight_quant=nvfp4",
            "engine.act_quant=nvfp4",
            *extra,
        ],
    )


def _rows(d, name):
    return [json.loads(l) for l in (d / f"{name}.jsonl").read_text().splitlines()]


def test_unified_precision_makes_a_quantized_run_exact_again(tmp_path, parity_reward):
    plain = _cfg(tmp_path)
    unified = _cfg(tmp_path, "remedy=unified_precision")
    assert str(unified.main_trainer) == "kernels=exact,dtype=fp32,weight_quant=nvfp4,act_quant=nvfp4"
    run(plain, tmp_path / "plain", progress=False)
    run(unified, tmp_path / "unified", progress=False)
    mp, mu = _rows(tmp_path / "plain", "metrics"), _rows(tmp_path / "unified", "metrics")
    assert all(r["rollout_corr/k3_kl"] > 0 for r in mp)
    assert all(r["rollout_corr/k3_kl"] == 0.0 and r["mismatch/max_abs_delta"] == 0.0 for r in mu)
    # Straight-through gradients reach the fp32 master weights: the policy moves.
    assert all(r["actor/grad_norm"] > 0 for r in mu)
    # The quantized policy is measured on its own at each eval, beside the fp32 one.
    for d in ("plain", "unified"):
        ev = _rows(tmp_path / d, "eval")
        assert [r["step"] for r in ev] == [0, 2]
        assert all(0.0 <= r["quantized/accuracy_greedy"] <= 1.0 for r in ev)


def test_unquantized_runs_log_no_quantized_accuracy(tmp_path, parity_reward):
    from timbench.model import save_checkpoint

    save_checkpoint(Qwen3ForCausalLM(PRESETS["tiny-dense"], seed=2), tmp_path / "ck")
    cfg = load_config(
        None, [f"model={tmp_path / 'ck'}", "steps=1", "prompts_per_step=2", "group_size=2", "eval_every=1", "eval_n=4"]
    )
    run(cfg, tmp_path / "r", progress=False)
    assert all("quantized/accuracy_greedy" not in r for r in _rows(tmp_path / "r", "eval"))
