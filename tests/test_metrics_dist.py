"""Distribution-level mismatch metrics (timbench.metrics.dist): formulas on a batch worked out by hand, exact
zero-mismatch values from a real engine and trainer, masks, bad values, and the engine's opt-in full rows."""

from __future__ import annotations

import json

import pytest
import torch

from timbench.engine import Engine
from timbench.engine.sampler import SamplingParams, sampling_support
from timbench.engine.sequence import Request
from timbench.kernels import get_kernels
from timbench.metrics.dist import TOP_K, distribution_metrics, topk_key
from timbench.metrics.schema import is_known
from timbench.model import Compute
from timbench.rl import step as step_mod
from timbench.rl.config import load_config
from timbench.rl.loop import run
from timbench.rl.rollout import pad_dist
from timbench.spec.keys import parse_spec
from timbench.trainer import sequence_logprobs

NAN, INF = float("nan"), float("inf")
EXACT = get_kernels("exact")
ZERO = {"tim/bitwise_equal_frac": 1.0, "tim/tv_mean": 0.0, "tim/tv_max": 0.0, "tim/top1_agreement": 1.0}


def _log(rows, dtype=torch.float64):
    return torch.tensor(rows, dtype=torch.float64).log().to(dtype)


# Three compared positions (V = 4) and one masked one full of NaN / -inf.
#   A: p = (.5, .25, .125, .125)  q = (.25, .5, .125, .125)  TV = (.25 + .25) / 2 = .25;  argmax 0 vs 1;
#      top-2 {0, 1} vs {0, 1}: overlap 2
#   B: p = (.7, .1, .1, .1)       q = (.4, .3, .2, .1)       TV = (.3 + .2 + .1) / 2 = .3;  argmax 0 = 0;
#      top-2 {0, 1} (the tie .1 = .1 = .1 goes to the lowest id, 1) vs {0, 1}: overlap 2 (ids 2 or 3: 1)
#   C: p = (.1, .2, .3, .4)       q = (.4, .3, .2, .1)       TV = (.3 + .1 + .1 + .3) / 2 = .4;  argmax 3 vs 0;
#      top-2 {3, 2} vs {0, 1}: overlap 0
# tv_mean = .95 / 3, tv_max = .4, top1 = 1/3, top-2 consistency = (2 + 2 + 0) / 6 = 2/3, top-1 = top-1 agreement.
P = [[[0.5, 0.25, 0.125, 0.125], [0.7, 0.1, 0.1, 0.1]], [[0.1, 0.2, 0.3, 0.4], [1.0, 0.0, 0.0, 0.0]]]
Q = [[[0.25, 0.5, 0.125, 0.125], [0.4, 0.3, 0.2, 0.1]], [[0.4, 0.3, 0.2, 0.1], [0.5, 0.5, 0.0, 0.0]]]
MASK = torch.tensor([[True, True], [True, False]])


def _poisoned(x: torch.Tensor) -> torch.Tensor:
    x = x.clone()
    x[1, 1] = torch.tensor([NAN, -INF, INF, NAN], dtype=x.dtype)
    return x


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_formulas_on_a_batch_worked_out_by_hand(dtype):
    p, q = _poisoned(_log(P, dtype)), _poisoned(_log(Q, dtype))
    m = distribution_metrics(p, q, MASK, k=2)
    assert set(m) == {
        "tim/bitwise_equal_frac",
        "tim/tv_mean",
        "tim/tv_max",
        "tim/top1_agreement",
        "tim/top2_consistency",
    }
    assert m["tim/tv_mean"] == pytest.approx(0.95 / 3, rel=1e-6) and m["tim/tv_max"] == pytest.approx(0.4, rel=1e-6)
    assert m["tim/top1_agreement"] == 1 / 3 and m["tim/top2_consistency"] == 4 / 6
    assert m["tim/bitwise_equal_frac"] == 0.0
    assert distribution_metrics(p, q, MASK, k=1)["tim/top1_consistency"] == 1 / 3  # K = 1 is top-1 agreement
    # K = V: every set is the whole vocabulary
    assert distribution_metrics(p, q, MASK, k=4)["tim/top4_consistency"] == 1.0
    # one position equal bit for bit: a third of the rows
    q2 = q.clone()
    q2[0, 0] = p[0, 0]
    assert distribution_metrics(p, q2, MASK, k=2)["tim/bitwise_equal_frac"] == 1 / 3


def test_ties_go_to_the_lower_token_id():
    p = _log([[0.1, 0.1, 0.4, 0.4]])  # argmax: ids 2 and 3 tie -> 2
    q = _log([[0.1, 0.1, 0.45, 0.35]])  # argmax 2
    r = _log([[0.1, 0.1, 0.35, 0.45]])  # argmax 3
    assert distribution_metrics(p, q, k=1)["tim/top1_agreement"] == 1.0
    assert distribution_metrics(p, r, k=1)["tim/top1_agreement"] == 0.0
    # top-3 of p: {2, 3} then the tie .1 = .1 -> id 0; q2's top-3 is {2, 3, 0}, q3's {2, 3, 1}
    assert distribution_metrics(p, _log([[0.15, 0.1, 0.4, 0.35]]), k=3)["tim/top3_consistency"] == 1.0
    assert distribution_metrics(p, _log([[0.1, 0.15, 0.4, 0.35]]), k=3)["tim/top3_consistency"] == 2 / 3


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_top_k_ids_are_a_stable_descending_sorts_first_k(dtype):
    """The top-K sets come from `numba_ops.top_k_ids`, which must give torch.sort(descending, stable)'s first k ids
    on every row: ties (many), -inf, +inf, NaN (sorted first), -0.0 next to +0.0, and every k from 1 to V."""
    from timbench.kernels.numba_ops import top_k_ids

    g = torch.Generator().manual_seed(5)
    v = 13
    x = torch.randint(-3, 3, (400, v), generator=g).to(dtype) / 2  # few distinct values: ties everywhere
    specials = torch.tensor([-INF, INF, NAN, -0.0, 0.0], dtype=dtype)
    pick = torch.rand((400, v), generator=g) < 0.2
    x[pick] = specials[torch.randint(0, 5, (int(pick.sum()),), generator=g)]
    x[0] = NAN  # a row of NaNs: the ids in order
    x[1] = torch.tensor([0.0, -0.0] * 6 + [0.0], dtype=dtype)  # signed zeros tie
    want = torch.sort(x, dim=-1, descending=True, stable=True).indices
    for k in range(1, v + 1):
        assert torch.equal(torch.from_numpy(top_k_ids(x.numpy(), k)), want[:, :k]), k


def test_masked_rows_never_leak_and_an_empty_mask_gives_the_zero_mismatch_values():
    p, q = _log(P), _log(Q)
    clean = distribution_metrics(p, q, MASK, k=2)
    assert clean == distribution_metrics(_poisoned(p), _poisoned(q), MASK, k=2)
    assert all(v == v for v in clean.values())  # no NaN
    empty = distribution_metrics(_poisoned(p), _poisoned(q), torch.zeros(2, 2, dtype=torch.bool), k=2)
    assert empty == {**ZERO, topk_key(2): 1.0} and topk_key(TOP_K) == "tim/top5_consistency"
    # -inf entries (zero probability) inside compared rows are fine: exp(-inf) = 0 on both sides
    z = _log([[0.5, 0.5, 0.0, 0.0]])
    assert distribution_metrics(z, z, k=3) == {**ZERO, "tim/top3_consistency": 1.0}


@pytest.mark.parametrize("k", [0, -1, 5, True, 2.0, "3"])
def test_a_bad_k_is_a_one_line_error(k):
    p = _log([[0.25, 0.25, 0.25, 0.25]])
    with pytest.raises(
        ValueError,
        match=r"^distribution_metrics: k \(the top-K set size\) must be an integer "
        r"in \[1, V=4\], got ",
    ) as e:
        distribution_metrics(p, p, k=k)
    assert "\n" not in str(e.value)


def test_bad_shapes_are_one_line_errors():
    p = _log([[0.25, 0.25, 0.25, 0.25]])
    with pytest.raises(ValueError, match=r"must have one shape \[\.\.\., V\], got \(1, 4\) and \(1, 3\)"):
        distribution_metrics(p, p[:, :3])
    with pytest.raises(ValueError, match=r"mask must have the distributions' leading shape \(1,\), got \(2,\)"):
        distribution_metrics(p, p, torch.ones(2, dtype=torch.bool), k=2)
    with pytest.raises(ValueError, match="full_logprobs must be True or False"):
        SamplingParams(full_logprobs=1)


def test_every_name_is_in_the_schema():
    assert all(is_known(k) for k in distribution_metrics(_log(P), _log(Q), MASK, k=3))
    assert is_known(topk_key(17)) and not is_known("tim/topk_consistency")


@pytest.mark.parametrize("spec", ["", "top_k=4,top_p=0.9", "dtype=bf16,noise=gaussian:0.5"])
def test_full_logprobs_are_opt_in_raw_and_change_no_sampled_bit(dense, spec):
    eng = Engine(dense.config, spec)
    eng.load_weights(dense)
    reqs = [Request((1, 5, 7, i % 5 + 2), 6, i) for i in range(6)]
    plain = eng.generate(reqs, SamplingParams(seed=3))
    full = eng.generate(reqs, SamplingParams(seed=3, full_logprobs=True))
    for a, b in zip(plain, full):
        assert a.full_logprobs is None and a.token_ids == b.token_ids and torch.equal(a.logprobs, b.logprobs)
        assert (a.support is None) == (b.support is None) and (a.support is None or torch.equal(a.support, b.support))
        rows = b.full_logprobs
        assert rows.dtype == torch.float32 and rows.shape == (len(b.token_ids), dense.config.vocab_size)
        # raw: normalised over the whole vocabulary, whatever top-k / top-p kept
        assert torch.allclose(rows.double().exp().sum(-1), torch.ones(len(rows), dtype=torch.float64), atol=1e-5)
        picked = rows.gather(-1, torch.tensor(b.token_ids)[:, None])[:, 0]
        if b.support is None:  # no truncation: the sampled token's logprob is read off the same row
            assert torch.equal(picked, b.logprobs)
        else:  # truncated: the processed logprob is the raw one renormalised over the support
            assert bool((b.logprobs >= picked).all()) and not torch.equal(picked, b.logprobs)
            # and the support is the one top-k / top-p cut from this very row
            assert torch.equal(sampling_support(rows, SamplingParams(top_k=4, top_p=0.9), EXACT), b.support)


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_zero_mismatch_is_exact_in_two_chunks(dense, dtype):
    spec = parse_spec(f"dtype={dtype}")
    eng = Engine(dense.config, spec)
    eng.load_weights(dense)
    comps = eng.generate(
        [Request((1, 5, 7, i % 5 + 2), 3 + 2 * i, i) for i in range(5)], SamplingParams(seed=1, full_logprobs=True)
    )
    seqs = [(c.prompt_ids, c.token_ids) for c in comps]
    width = max(len(c.token_ids) for c in comps)
    engine_dist = pad_dist([c.full_logprobs for c in comps], width)
    assert engine_dist.shape == (5, width, dense.config.vocab_size)
    compute = Compute.from_spec(parse_spec(f"dtype={dtype}", side="trainer"))
    with torch.no_grad():  # two chunks of different response widths, padded as the loop's recompute does
        outs = [sequence_logprobs(dense, compute, seqs[s], full_dist=True) for s in (slice(0, 2), slice(2, 5))]
    trainer_dist = torch.cat([torch.nn.functional.pad(o.dist, (0, 0, 0, width - o.dist.shape[1])) for o in outs])
    mask = torch.cat([torch.nn.functional.pad(o.mask, (0, width - o.mask.shape[1])) for o in outs])
    assert torch.equal(trainer_dist[mask], engine_dist[mask])
    assert distribution_metrics(trainer_dist, engine_dist, mask) == {**ZERO, "tim/top5_consistency": 1.0}
    # the recompute without full_dist gives no distribution
    assert sequence_logprobs(dense, compute, seqs[:1]).dist is None


BASE = ["steps=2", "prompts_per_step=2", "group_size=4", "mini_batches=2", "eval_every=2", "eval_n=8"]


def _rows(path):
    return [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]


def test_logged_every_step_and_absent_without_an_engine_distribution(tmp_path, monkeypatch):
    # zero mismatch under top-k with sampling replay: the trainer's pi_old is renormalised over the support,
    # yet the logged distributions are the full ones on both sides, so they still agree exactly
    replay = BASE + ["engine.top_k=5", "remedy=sampling_replay"]
    run(load_config(None, replay), tmp_path / "zero", progress=False)
    assert all({k: r[k] for k in ZERO} == ZERO and r["tim/top5_consistency"] == 1.0 for r in _rows(tmp_path / "zero"))
    run(load_config(None, replay + ["engine.dtype=bf16"]), tmp_path / "bf16", progress=False)
    bf16 = _rows(tmp_path / "bf16")
    assert all(
        r["tim/tv_mean"] > 0 and r["tim/tv_max"] >= r["tim/tv_mean"] and r["tim/bitwise_equal_frac"] < 1 for r in bf16
    )
    # an engine that gives no full distribution (vLLM): no tim/ keys, and every other value the same bits
    real = step_mod.collect

    def no_dist(*a, **kw):
        exp = real(*a, **kw)
        exp.rollout_dist = None
        return exp

    monkeypatch.setattr(step_mod, "collect", no_dist)
    run(load_config(None, replay + ["engine.dtype=bf16"]), tmp_path / "none", progress=False)
    none = _rows(tmp_path / "none")
    from timbench.metrics.dist import distribution_metrics

    dist_keys = set(
        distribution_metrics(torch.zeros(1, 1, 8), torch.zeros(1, 1, 8), torch.ones(1, 1, dtype=torch.bool))
    )
    assert not [k for r in none for k in r if k in dist_keys]
    assert none == [{k: v for k, v in r.items() if k not in dist_keys} for r in bf16]
