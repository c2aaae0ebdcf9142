"""Engine.generate_many (one prefill per prompt, forks decoded together) equals one `generate` per parameter set,
bitwise, and evaluate_both's one-run path equals its two-run path."""

import random

import pytest
import torch

from timbench.engine import Engine, Request, SamplingParams, make_engine
from timbench.evaluate import evaluate, evaluate_both
from timbench.tasks import get_task

TASK = get_task("add-4d-v1")

PARAMS = [
    SamplingParams(temperature=1.0, seed=3),
    SamplingParams(temperature=0.0, seed=3),
    SamplingParams(temperature=0.7, top_k=5, top_p=0.9, seed=4, full_logprobs=True),
]


def _requests(n, seed=0):
    rng = random.Random(seed)
    return [
        Request(tuple(rng.randrange(3, 60) for _ in range(rng.randint(1, 14))), rng.randint(1, 12), 10 + i)
        for i in range(n)
    ]


def _same(a, b):
    """Every field of two completion lists, bitwise (tensors by torch.equal, None where either is None)."""
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert (x.request_id, x.prompt_ids, x.token_ids, x.finish_reason) == (
            y.request_id,
            y.prompt_ids,
            y.token_ids,
            y.finish_reason,
        )
        assert torch.equal(x.logprobs, y.logprobs)
        for field in ("routing", "support", "full_logprobs"):
            u, v = getattr(x, field), getattr(y, field)
            assert (u is None) == (v is None), field
            if u is not None:
                assert torch.equal(u, v), field


# 2 and 3 slots: fewer than the forks of all requests, so forks of new prompts are prefilled while others decode;
# 3 with three parameter sets: one request in flight at a time; 96: everything in flight at once.
@pytest.mark.parametrize(
    "spec,slots",
    [
        *((s, n) for s in ("kernels=exact", "kernels=exact,noise=gaussian:1.0") for n in (3, 7, 96)),
        ("kernels=torch", 7),  # batch-variant kernels: one run per set (shared batches would change the bits)
    ],
)
def test_generate_many_equals_separate_runs(model, spec, slots):
    engine = Engine(model.config, spec, max_num_seqs=slots)
    engine.load_weights(model)
    reqs = _requests(20)
    many = engine.generate_many(reqs, PARAMS)
    assert len(many) == len(PARAMS)
    for p, got in zip(PARAMS, many):
        _same(got, engine.generate(reqs, p))
    # the forks did sample differently (else the test would not tell them apart)
    assert [c.token_ids for c in many[0]] != [c.token_ids for c in many[1]]
    assert many[2][0].full_logprobs is not None and many[0][0].full_logprobs is None


def test_generate_many_errors(dense):
    engine = Engine(dense.config, "kernels=exact", max_num_seqs=2)
    with pytest.raises(ValueError, match="max_num_seqs=2"):
        engine.generate_many(_requests(2), PARAMS)
    with pytest.raises(ValueError, match="no sampling parameters"):
        engine.generate_many(_requests(2), [])
    assert engine.generate_many([], PARAMS[:2]) == [[], []]


def test_forks_share_batches_only_on_batch_invariant_kernels(dense, monkeypatch):
    from timbench.kernels import KERNELS

    assert {n: KERNELS.lookup(n).batch_invariant for n in KERNELS.names()} == {"exact": True, "torch": False}
    for spec, runs in (("kernels=exact", 1), ("kernels=torch", len(PARAMS))):
        engine = Engine(dense.config, spec, max_num_seqs=8)
        engine.load_weights(dense)
        calls = []
        real = engine._generate
        monkeypatch.setattr(engine, "_generate", lambda r, p, real=real: calls.append(len(p)) or real(r, p))
        engine.generate_many(_requests(3), PARAMS)
        assert len(calls) == runs, spec


class _TwoRunEngine:
    """An engine without generate_many (as vLLM's): evaluate_both must run it twice."""

    def __init__(self, inner):
        self.inner, self.max_len, self.calls = inner, inner.max_len, []

    def generate(self, requests, params):
        self.calls.append(params.temperature)
        return self.inner.generate(requests, params)


@pytest.mark.parametrize("spec", ["kernels=exact", "kernels=exact,noise=gaussian:1.0"])
def test_evaluate_both_one_run_equals_two(dense, spec):
    probs = TASK.eval_set(24)
    one_run = make_engine(dense.config, spec, max_num_seqs=48, weights=dense)
    got = evaluate_both(dense, TASK, probs, seed=2, engine=one_run)
    two_runs = _TwoRunEngine(make_engine(dense.config, spec, max_num_seqs=5, weights=dense))
    assert evaluate_both(dense, TASK, probs, seed=2, engine=two_runs) == got
    assert two_runs.calls == [1.0, 0.0]
    # and each half is evaluate's own result at that temperature
    alone = {t: evaluate(dense, TASK, probs, spec, temperature=t, seed=2) for t in (1.0, 0.0)}
    assert got["accuracy_t1"] == alone[1.0]["accuracy"]
    assert got["mean_response_tokens_t1"] == alone[1.0]["mean_response_tokens"]
    assert got["accuracy_greedy"] == alone[0.0]["accuracy"]
    assert got["mean_response_tokens_greedy"] == alone[0.0]["mean_response_tokens"]
    assert got == evaluate_both(dense, TASK, probs, spec, seed=2)  # the engine it builds itself


def test_faulty_engine_forks_through_its_fault(dense):
    """A fault-injected engine's generate_many applies the fault to each parameter set (not bypassed)."""
    engine = make_engine(dense.config, "kernels=exact,fault=zero_logprobs", max_num_seqs=8, weights=dense)
    reqs = _requests(6)
    many = engine.generate_many(reqs, PARAMS[:2])
    for p, got in zip(PARAMS[:2], many):
        _same(got, engine.generate(reqs, p))
        assert all(not c.logprobs.any() for c in got)
