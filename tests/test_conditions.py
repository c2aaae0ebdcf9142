"""The mismatch conditions: each is a real, dialable perturbation, and exact/exact stays exactly zero.

Spec parsing and side checks; TP (tp=k agrees with tp=1 within fp tolerance but
not bitwise, ring vs tree, TP on both sides is exact); split-KV decode attention;
logits/router dtype; router noise; keyed synthetic logit noise (statistics match
the requested sigma, batch-invariant, engine reports the perturbed distribution).
"""

import math

import pytest
import torch

from timbench.align import align
from timbench.engine import Engine, Request, SamplingParams, make_engine
from timbench.engine.sampler import perturb_logits
from timbench.kernels import get_kernels
from timbench.kernels.logprobs import token_logprobs_all
from timbench.kernels.noise_ops import row_keyed_normal
from timbench.kernels.split_kv import attend_split, split_decode_attention_torch
from timbench.kernels.tensor_parallel import all_reduce, row_parallel_linear
from timbench.model import Compute
from timbench.spec.keys import Noise, Spec, SpecError, parse_spec

BATCHES = (1, 3, 24)


# ---------------------------------------------------------------- spec keys


def test_spec_keys_parse_and_print_short_form():
    s = parse_spec(
        "kernels=torch,dtype=bf16,tp=4,tp_reduce=tree,noise=student_t:0.5:3,router_noise=0.01", side="engine"
    )
    assert (s.tp, s.tp_reduce, s.noise, s.router_noise) == (4, "tree", Noise("student_t", 0.5, 3), 0.01)
    assert str(s) == "kernels=torch,dtype=bf16,tp=4,tp_reduce=tree,router_noise=0.01,noise=student_t:0.5:3"
    assert parse_spec(str(s)) == s and parse_spec(s.to_dict()) == s
    assert str(parse_spec(None)) == "kernels=exact,dtype=fp32"  # defaults print as before the new keys


@pytest.mark.parametrize(
    "text,side,msg",
    [
        ("tp=3", None, "invalid value '3' for tp; valid: 1|2|4|8"),
        ("noise=gaussian", None, "valid: none|gaussian:SIGMA"),
        ("noise=gaussian:-1", None, "invalid value 'gaussian:-1'"),
        ("noise=student_t:1:0", None, "invalid value"),
        ("attn_splits=0", None, "valid: integer >= 1"),
        ("router_noise=nan", None, "valid: float >= 0"),
        ("tp_reduce=tree", None, "tp_reduce=tree needs tp > 1"),
        ("noise=gaussian:1", "trainer", "noise is an engine-only key"),
        ("engine=vllm", "trainer", "engine is an engine-only key"),
        ("attn_splits=2", "trainer", "attn_splits is an engine-only key"),
    ],
)
def test_bad_specs_are_one_line_errors(text, side, msg):
    with pytest.raises(SpecError, match=msg.replace("|", r"\|")) as e:
        parse_spec(text, "engine spec", side=side)
    assert "\n" not in str(e.value)


def test_engine_refuses_a_vllm_spec_and_make_engine_picks_the_backend(dense):
    with pytest.raises(ValueError, match="make_engine"):
        Engine(dense.config, "engine=vllm")
    assert isinstance(make_engine(dense.config, "kernels=exact", max_num_seqs=4), Engine)


def test_a_spec_is_parsed_once_and_passes_through(dense):
    s = parse_spec("kernels=torch,dtype=bf16,noise=gaussian:1", side="engine")
    assert parse_spec(s, side="engine") is s  # no second parse
    with pytest.raises(SpecError, match="noise is an engine-only key"):
        parse_spec(s, "trainer spec", side="trainer")  # a Spec still meets the side check
    assert s.override({"dtype": "fp16"}) == parse_spec("kernels=torch,dtype=fp16,noise=gaussian:1")
    assert s.override({}) is s
    with pytest.raises(SpecError, match="invalid value 'fp8' for dtype"):
        s.override({"dtype": "fp8"}, "remedy override")
    e = make_engine(dense.config, s, max_num_seqs=2)
    assert e.spec is s


@pytest.mark.parametrize("kernels", ["exact", "torch"])
def test_make_engine_with_weights_generates_like_a_later_load(dense, kernels):
    """The factory's optional weights equal load_weights afterwards; every kernel set has the cache protocol."""
    spec = parse_spec(f"kernels={kernels}", side="engine")
    reqs = [Request((1, 5, 6, 7), 6, i) for i in range(3)]
    a = make_engine(dense.config, spec, max_num_seqs=2, weights=dense).generate(reqs, SamplingParams(seed=3))
    later = make_engine(dense.config, spec, max_num_seqs=2)
    later.load_weights(dense)
    b = later.generate(reqs, SamplingParams(seed=3))
    assert [(c.token_ids, c.logprobs.tolist()) for c in a] == [(c.token_ids, c.logprobs.tolist()) for c in b]
    kernels_obj = get_kernels(kernels)
    kernels_obj.cache_weights(True)
    kernels_obj.invalidate_weights()


# ---------------------------------------------------------------- tensor parallelism


def test_all_reduce_orders():
    g = torch.Generator().manual_seed(0)
    parts = [torch.randn(5, 8, generator=g) * 10**i for i in range(4)]
    exact = sum(p.double() for p in parts)
    ring, tree = all_reduce(parts, "ring"), all_reduce(parts, "tree")
    assert torch.allclose(ring.double(), exact, rtol=1e-6) and torch.allclose(tree.double(), exact, rtol=1e-6)
    # ring: column chunk c sums p_c, p_c+1, ... in that order
    c1 = ((parts[1][:, 2:4] + parts[2][:, 2:4]) + parts[3][:, 2:4]) + parts[0][:, 2:4]
    assert torch.equal(ring[:, 2:4], c1)
    assert torch.equal(tree, (parts[0] + parts[1]) + (parts[2] + parts[3]))
    assert torch.equal(all_reduce(parts[:2], "ring"), all_reduce(parts[:2], "tree"))  # a+b == b+a


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_tp_matches_tp1_within_tolerance_but_not_bitwise(dense, dtype):
    ids = torch.randint(3, dense.config.vocab_size, (6, 20), generator=torch.Generator().manual_seed(1))
    kn = get_kernels("exact")
    with torch.no_grad():
        ref, _ = dense(ids, Compute(kn, Spec(dtype=dtype)))
        for tp in (2, 4, 8):
            out, _ = dense(ids, Compute(kn, Spec(dtype=dtype, tp=tp)))
            tol = 1e-5 if dtype == "fp32" else 0.1
            assert (out.float() - ref.float()).abs().max() < tol
            assert not torch.equal(out, ref), f"tp={tp} should round differently from tp=1"
        ring, _ = dense(ids, Compute(kn, Spec(dtype=dtype, tp=4)))
        tree, _ = dense(ids, Compute(kn, Spec(dtype=dtype, tp=4, tp_reduce="tree")))
        assert not torch.equal(ring, tree)


def test_row_parallel_linear_rejects_uneven_split():
    with pytest.raises(ValueError, match="tp=8 does not divide the row-parallel input width 12"):
        row_parallel_linear(get_kernels("exact"), torch.ones(2, 12), torch.ones(3, 12), 8, "ring")


def test_tp_engine_vs_tp1_trainer_is_mismatch_and_tp_on_both_sides_is_exact(model):
    mis = align(model, "tp=4", "kernels=exact", seed=0, batches=BATCHES)
    same = align(model, "tp=4", "tp=4", seed=0, batches=BATCHES)
    assert 0.0 < mis["max_abs_diff"] < 1e-4 and mis["frac_tokens_differ"] > 0.05
    assert same["max_abs_diff"] == 0.0 and same["k3_kl"] == 0.0


# ---------------------------------------------------------------- split-KV decode attention


def _attn_inputs(seed=0, b=5, t=37, h=4, hkv=2, d=16):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, d, generator=g)
    kc, vc = torch.randn(b, t, hkv, d, generator=g), torch.randn(b, t, hkv, d, generator=g)
    lengths = torch.tensor([1, 2, 9, 30, 37])[:b]
    return q, kc, vc, torch.arange(b), lengths


def test_split_kv_equals_one_pass_mathematically_not_bitwise():
    q, kc, vc, slots, lengths = _attn_inputs()
    kn = get_kernels("exact")
    one = kn.decode_attention(q, kc, vc, slots, lengths)
    for s in (2, 4, 16):
        split = kn.decode_attention(q, kc, vc, slots, lengths, s)
        assert (split - one).abs().max() < 1e-5
        torch_split = split_decode_attention_torch(q, kc, vc, slots, lengths, s)
        assert (torch_split - one).abs().max() < 1e-5
    assert not torch.equal(kn.decode_attention(q, kc, vc, slots, lengths, 4), one)
    assert torch.equal(kn.decode_attention(q, kc, vc, slots[:1], lengths[:1], 4)[0], one[0])  # 1 key: no split


def test_split_kv_exact_kernel_is_batch_invariant():
    q, kc, vc, slots, lengths = _attn_inputs()
    args = (kc.numpy(), vc.numpy())
    full = attend_split(q.numpy(), *args, slots.numpy(), lengths.numpy(), 0.25, 4)
    for i in range(len(slots)):
        alone = attend_split(q[i : i + 1].numpy(), *args, slots[i : i + 1].numpy(), lengths[i : i + 1].numpy(), 0.25, 4)
        assert (alone[0] == full[i]).all()


def test_attn_splits_engine_is_a_kernel_mismatch(dense):
    r = align(dense, "attn_splits=4", "kernels=exact", seed=0, batches=BATCHES)
    assert 0.0 < r["max_abs_diff"] < 1e-4


# ---------------------------------------------------------------- precision keys


def test_logits_and_router_dtype_on_both_sides_are_exact(moe):
    for spec in ("dtype=bf16,logits_dtype=fp32", "dtype=bf16,router_dtype=fp32"):
        r = align(moe, spec, spec, seed=0, batches=BATCHES)
        assert r["max_abs_diff"] == 0.0 and r["routing_agreement"] == 1.0


def test_router_dtype_mismatch_flips_experts(moe):
    r = align(moe, "dtype=bf16,router_dtype=bf16", "dtype=bf16,router_dtype=fp32", seed=0, batches=(3, 40))
    assert r["max_abs_diff"] > 0.0 and r["routing_agreement"] < 1.0


def test_fp16_on_both_sides_is_exact_and_closer_than_bf16_against_fp32(dense):
    assert align(dense, "dtype=fp16", "dtype=fp16", seed=0, batches=BATCHES)["max_abs_diff"] == 0.0
    fp16 = align(dense, "dtype=fp16", "kernels=exact", seed=0, batches=BATCHES)
    bf16 = align(dense, "dtype=bf16", "kernels=exact", seed=0, batches=BATCHES)
    assert 0.0 < fp16["mean_abs_diff"] < bf16["mean_abs_diff"] / 2  # 10 vs 7 mantissa bits


# ---------------------------------------------------------------- MoE router noise


def test_router_noise_is_keyed_by_the_row_and_lowers_routing_agreement(moe):
    x = torch.randn(6, 8, generator=torch.Generator().manual_seed(0)).numpy()
    a, b = row_keyed_normal(x, 3), row_keyed_normal(x[2:4].copy(), 3)
    assert (a[2:4] == b).all() and not (row_keyed_normal(x, 4) == a).all()
    z = row_keyed_normal(torch.randn(4000, 8).numpy(), 0)
    assert abs(z.mean()) < 0.03 and abs(z.std() - 1) < 0.03
    low = align(moe, "router_noise=0.01", "kernels=exact", seed=0, batches=(3, 40))
    high = align(moe, "router_noise=0.1", "kernels=exact", seed=0, batches=(3, 40))
    assert 1.0 > low["routing_agreement"] > high["routing_agreement"]
    assert align(moe, "router_noise=0.1", "router_noise=0.1", seed=0, batches=(3,))["max_abs_diff"] == 0.0


# ---------------------------------------------------------------- synthetic logit noise


def _noise(kind, sigma, df=0, rows=512, width=64, seed=0):
    logits = torch.randn(rows, width, generator=torch.Generator().manual_seed(9)) * 3
    req, pos = torch.arange(rows), torch.full((rows,), 5)
    out = perturb_logits(logits, Noise(kind, sigma, df), SamplingParams(seed=seed), req, pos, get_kernels("exact"))
    return logits, out - logits


@pytest.mark.parametrize("sigma", [0.1, 1.0, 2.0])
def test_gaussian_noise_statistics_match_sigma(sigma):
    _, d = _noise("gaussian", sigma)
    assert abs(d.mean()) < 0.02 * sigma and abs(d.std() / sigma - 1) < 0.02


def test_student_t_is_heavy_tailed_with_the_t_variance():
    _, d = _noise("student_t", 1.0, df=5)
    assert abs(d.var() / (5 / 3) - 1) < 0.1  # Var t_5 = df / (df - 2)
    _, g = _noise("gaussian", 1.0)
    kurt = lambda x: float(((x - x.mean()) ** 4).mean() / x.var() ** 2)
    assert kurt(d) > kurt(g) + 1.5


def test_lowprob_noise_spares_likely_tokens():
    logits, d = _noise("lowprob", 1.0)
    top = logits.argmax(-1)
    p_top = torch.softmax(logits, -1).gather(-1, top[:, None])[:, 0]
    sure = p_top > 0.9
    assert sure.sum() > 20
    assert d.gather(-1, top[:, None])[sure].abs().mean() < 0.1 * d[sure].abs().mean()


def test_noise_is_keyed_and_zero_sigma_is_a_no_op():
    logits, d = _noise("gaussian", 1.0)
    _, again = _noise("gaussian", 1.0)
    _, other_seed = _noise("gaussian", 1.0, seed=1)
    assert torch.equal(d, again) and not torch.equal(d, other_seed)
    _, zero = _noise("gaussian", 0.0)
    assert torch.equal(zero, torch.zeros_like(zero))


def test_noisy_engine_reports_the_distribution_it_sampled_from(dense):
    engine = Engine(dense.config, "noise=gaussian:1.5", max_num_seqs=8)
    engine.load_weights(dense)
    reqs = [Request((1, 5, 6, 7), 6, i) for i in range(4)]
    params = SamplingParams(temperature=0.7, seed=2)
    comps = engine.generate(reqs, params)
    alone = engine.generate(reqs[2:3], params)[0]
    assert alone.token_ids == comps[2].token_ids and torch.equal(alone.logprobs, comps[2].logprobs)
    c = comps[0]  # recompute its first token's logprob from the perturbed logits
    logits, _ = dense(torch.tensor([c.prompt_ids]), Compute(get_kernels("exact")))
    pert = perturb_logits(
        logits[:, -1],
        engine.spec.noise,
        params,
        torch.tensor([0]),
        torch.tensor([len(c.prompt_ids)]),
        get_kernels("exact"),
    )
    lp = token_logprobs_all(pert, params.temperature, get_kernels("exact"))[0, c.token_ids[0]]
    assert lp.item() == c.logprobs[0].item()
    r = align(dense, "noise=gaussian:0.5", "kernels=exact", seed=0, batches=BATCHES)
    assert 0.2 < r["mean_abs_diff"] < 0.6 and math.isfinite(r["k3_kl"])
