"""sampling_replay: the trainer's logprobs renormalised over the engine's top-k / top-p support."""

from __future__ import annotations

import json
import math

import pytest
import torch

from timbench.engine import Engine
from timbench.engine.sampler import SamplingParams, sample, sampling_support
from timbench.engine.sequence import Request
from timbench.kernels import get_kernels
from timbench.model import Compute
from timbench.remedies import load_remedy
from timbench.rl.config import load_config
from timbench.rl.loop import run
from timbench.spec.keys import SpecError, parse_spec
from timbench.trainer import sequence_logprobs

BASE = ["steps=2", "prompts_per_step=2", "group_size=4", "eval_every=2", "eval_n=8"]
EXACT = get_kernels("exact")
P = [0.5, 0.2, 0.15, 0.1, 0.05]


def _lp():
    return torch.tensor([P], dtype=torch.float64).log().float()


def test_support_of_top_k_then_top_p_by_hand():
    keep = lambda **kw: sampling_support(_lp(), SamplingParams(**kw), EXACT)[0].nonzero().flatten().tolist()
    assert sampling_support(_lp(), SamplingParams(), EXACT) is None  # no truncation: no support
    assert keep(top_k=3) == [0, 1, 2]
    # top-p keeps a token while the mass before it is < p: 0, 0.5, 0.7 < 0.8 -> three tokens
    assert keep(top_p=0.8) == [0, 1, 2]
    # after top-k = 3 the mass is renormalised: 0, 0.588, 0.824 -> the third token goes (vLLM's order)
    assert keep(top_k=3, top_p=0.8) == [0, 1]
    # ties keep the lower token id
    tied = torch.tensor([[0.0, 1.0, 1.0, 1.0]]).log_softmax(-1)
    assert sampling_support(tied, SamplingParams(top_k=2), EXACT)[0].tolist() == [False, True, True, False]


def test_engine_logprob_is_the_renormalised_one_by_hand():
    logits = _lp().repeat(64, 1)  # logits = log p, temperature 1
    tok, lp, keep = sample(
        logits, SamplingParams(top_k=3, top_p=0.8, seed=0), torch.arange(64), torch.zeros(64, dtype=torch.long), EXACT
    )
    assert set(tok.tolist()) == {0, 1}  # only the support is drawn
    want = {0: math.log(0.5 / 0.7), 1: math.log(0.2 / 0.7)}
    assert [float(x) for x in lp] == pytest.approx([want[int(t)] for t in tok], abs=1e-6)
    assert keep.shape == (64, 5) and keep[:, :2].all() and not keep[:, 2:].any()


def test_trainer_logprobs_renormalise_over_the_support(dense):
    c = Compute.from_spec(parse_spec(None))
    seqs = [((1, 5, 7), [9, 4, 2]), ((3, 4), [6, 8])]
    v = dense.config.vocab_size
    support = torch.ones(2, 3, v, dtype=torch.bool)
    support[0, 0, 20:] = False  # position 0 of response 0 may draw 0..19 only (token 9 among them)
    support[1, 1, ::2] = False  # odd ids only at position 1 of response 1 ...
    support[1, 1, 8] = True  # ... and its sampled token 8 (always in its support)
    with torch.no_grad():
        full = sequence_logprobs(dense, c, seqs).logprobs.double()
        got = sequence_logprobs(dense, c, seqs, support=support).logprobs.double()
        ids = torch.tensor([[1, 5, 7, 9, 4, 2], [3, 4, 6, 8, 0, 0]])
        lp_all = dense(ids, c)[0].double().log_softmax(-1)
    # log pi_S(a) = log pi(a) - log sum_{v in S} pi(v), position by position
    mass00 = lp_all[0, 2, :20].exp().sum()
    mass11 = lp_all[1, 2][support[1, 1]].exp().sum()
    assert float(got[0, 0]) == pytest.approx(float(full[0, 0] - mass00.log()), abs=2e-6)
    assert float(got[1, 1]) == pytest.approx(float(full[1, 1] - mass11.log()), abs=2e-6)
    assert float(got[0, 0]) > float(full[0, 0]) and float(got[1, 1]) > float(full[1, 1])
    # untouched positions are the same bits; a full support changes nothing at all
    assert torch.equal(got[0, 1:], full[0, 1:]) and torch.equal(got[1, 0], full[1, 0])
    with torch.no_grad():
        ones = sequence_logprobs(dense, c, seqs, support=torch.ones(2, 3, v, dtype=torch.bool)).logprobs
    assert torch.equal(ones, full.float())


def _rows(path):
    return [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]


def test_identity_without_truncation_and_zero_mismatch_with_it(tmp_path):
    run(load_config(None, BASE + ["remedy=none"]), tmp_path / "none", progress=False)
    run(load_config(None, BASE + ["remedy=sampling_replay"]), tmp_path / "replay", progress=False)
    assert (tmp_path / "none/metrics.jsonl").read_bytes() == (tmp_path / "replay/metrics.jsonl").read_bytes()
    assert (tmp_path / "none/eval.jsonl").read_bytes() == (tmp_path / "replay/eval.jsonl").read_bytes()
    trunc = BASE + ["engine.top_k=5", "engine.top_p=0.9"]
    run(load_config(None, trunc + ["remedy=none"]), tmp_path / "tnone", progress=False)
    run(load_config(None, trunc + ["remedy=sampling_replay"]), tmp_path / "treplay", progress=False)
    biased, fixed = _rows(tmp_path / "tnone"), _rows(tmp_path / "treplay")
    # full-vocabulary pi_old against the truncated mu: log pi - log mu < 0 on average, never above 0
    assert all(r["rollout_corr/k3_kl"] > 0 and r["rollout_corr/log_ppl_diff"] > 0 for r in biased)
    # scored over the engine's support, the exact trainer reproduces mu bit for bit again
    assert all(r["rollout_corr/k3_kl"] == 0.0 and r["mismatch/mean_abs_delta"] == 0.0 for r in fixed)


def test_bad_values_are_one_line_errors():
    for bad, key in (("top_k=-1", "top_k"), ("top_p=0", "top_p"), ("top_p=1.5", "top_p")):
        with pytest.raises(SpecError, match=f"invalid value .* for {key}; valid: "):
            parse_spec(bad, side="engine")
    with pytest.raises(SpecError, match="top_k is an engine-only key"):
        parse_spec("top_k=5", side="trainer")
    with pytest.raises(ValueError, match="unknown parameter"):
        load_remedy("sampling_replay", {"top_k": 5})
    with pytest.raises(ValueError, match="needs the engine's sampling support .* engine=vllm .* use engine=timbench"):
        load_config(None, ["remedy=sampling_replay", "engine.engine=vllm", "engine.top_k=5"])
    with pytest.raises(ValueError, match="top_k must be an integer >= 0"):
        SamplingParams(top_k=-2)


def test_engine_scores_what_it_sampled_under_truncation(dense):
    eng = Engine(dense.config, "top_k=4,top_p=0.9")
    eng.load_weights(dense)
    reqs = [Request((1, 5, 7, i % 5 + 2), 6, i) for i in range(6)]
    comps = eng.generate(reqs, SamplingParams(seed=3))
    assert all(
        c.support is not None
        and c.support.shape == (len(c.token_ids), dense.config.vocab_size)
        and int(c.support.sum(-1).max()) <= 4
        for c in comps
    )
    scores = eng.score(
        [(c.prompt_ids, c.token_ids) for c in comps], SamplingParams(seed=3), request_ids=[c.request_id for c in comps]
    )
    for c, lp in zip(comps, scores.logprobs):
        assert torch.equal(lp.float(), c.logprobs)  # teacher-forced scoring applies the same truncation
