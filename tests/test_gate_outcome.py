"""The gate's RL-outcome probe and the stale prefix-cache fault: pass where they must, fail where they must."""

from __future__ import annotations

import pytest

from timbench.engine import Request, SamplingParams, make_engine
from timbench.gate.outcome import rl_outcome
from timbench.gate.probes import PROBES
from timbench.gate.suite import load_suite
from timbench.model import load_checkpoint
from timbench.spec.keys import parse_spec
from timbench.util.shipped import default_checkpoint

PARAMS = SamplingParams(temperature=0.8, seed=0)
REFERENCE = {"tiny-dense": [0.48, 0.50, 0.49]}
EXACT = parse_spec("kernels=exact,dtype=fp32", side="engine")


def _fake(curves):
    """A runner that returns canned per-seed rewards instead of training: (start, final, collapsed) per seed."""

    def runner(preset, spec, seed, p):
        start, final, collapsed = curves[seed]
        return {"start": start, "final": final, "collapse": {"collapsed": collapsed}, "eval_t1": [0.3, 0.4]}

    return runner


def _judge(curves):
    p = {"model": "tiny-dense", "seeds": 3, "reference": REFERENCE}
    return rl_outcome(None, None, p, PARAMS, EXACT, runner=_fake(curves))


def test_rl_outcome_passes_when_the_runs_learn_as_the_reference_did():
    r = _judge({0: (0.38, 0.48, False), 1: (0.37, 0.50, False), 2: (0.45, 0.49, False)})
    assert r.passed, r.numbers
    assert r.numbers["final_mean"] == pytest.approx(0.49) and r.numbers["reference_lo"] < 0.49
    assert r.numbers["gain"] > 0 and r.numbers["collapses"] == 0


@pytest.mark.parametrize(
    "curves,why",
    [
        ({0: (0.38, 0.36, False), 1: (0.37, 0.38, False), 2: (0.45, 0.40, False)}, "below the reference interval"),
        ({0: (0.50, 0.48, False), 1: (0.52, 0.50, False), 2: (0.55, 0.49, False)}, "no learning"),
        ({0: (0.38, 0.48, True), 1: (0.37, 0.50, False), 2: (0.45, 0.49, False)}, "a collapsed seed"),
    ],
)
def test_rl_outcome_fails_on_runs_that_do_not_learn_or_collapse(curves, why):
    r = _judge(curves)
    assert not r.passed, why


def test_rl_outcome_without_a_stored_reference_for_the_model_is_one_line():
    p = {"model": "tiny-moe", "seeds": 3, "reference": REFERENCE}
    with pytest.raises(ValueError, match="no stored reference for model 'tiny-moe'"):
        rl_outcome(None, None, p, PARAMS, EXACT, runner=_fake({}))


def test_default_suite_rl_outcome_reproduces_its_stored_reference_on_the_exact_engine():
    """The real probe, one of its seeds (a 12-step GRPO run): the exact fp32 engine reproduces the final reward
    the suite stores for seed 0 byte for byte, and learns; a change to training that moves it needs a new
    reference and suite version. (The probe's other two seeds are the same code on other seeds.)"""
    suite = load_suite("default")
    p = suite.probes["rl_outcome"]
    model = load_checkpoint(default_checkpoint("add-4d-v1", "tiny-dense"))
    r = PROBES["rl_outcome"](
        None, model, {**p, "seeds": 1, "model": "tiny-dense"}, SamplingParams(seed=suite.seed), EXACT
    )
    assert r.numbers["final_reward"] == [round(p["reference"]["tiny-dense"][0], 4)]
    assert r.numbers["gain"] > 0, r.numbers


def _engine(model, fault):
    spec = parse_spec(f"kernels=exact,dtype=fp32,fault={fault}", side="engine")
    return make_engine(model.config, spec, max_num_seqs=8, weights=model)


@pytest.mark.parametrize("preset", ["tiny-dense", "tiny-moe"])
def test_stale_prefix_cache_serves_a_prompt_seen_before_the_sync_from_the_old_weights(preset):
    model = load_checkpoint(default_checkpoint("add-4d-v1", preset))
    trained = type(model)(model.config)
    trained.load_state_dict({k: v + 0.05 for k, v in model.state_dict().items()})
    seen, new = Request((5, 6, 7, 8), 6, 0), Request((9, 10, 11), 6, 1)
    engine = _engine(model, "stale_prefix_cache")
    first = engine.generate([seen], PARAMS)[0]
    again = engine.generate([seen], PARAMS)[0]  # no sync in between: a cache hit is exact
    assert again.token_ids == first.token_ids and again.logprobs.equal(first.logprobs)
    engine.load_weights(trained)
    fresh = _engine(trained, "none").generate([seen, new], PARAMS)
    got = engine.generate([seen, new], PARAMS)
    assert got[1].token_ids == fresh[1].token_ids and got[1].logprobs.equal(fresh[1].logprobs)  # not seen before
    # the seen prompt's first token comes from the old weights' prefill: its logprob is the old engine's
    assert got[0].logprobs[0] == first.logprobs[0] and got[0].logprobs[0] != fresh[0].logprobs[0]


def test_weight_sync_probe_catches_the_stale_prefix_cache():
    model = load_checkpoint(default_checkpoint("add-4d-v1", "tiny-dense"))
    p = {"updates": 1, "requests": 3, "max_new_tokens": 4}
    for fault, want in (("none", True), ("stale_prefix_cache", False)):
        spec = parse_spec(f"kernels=exact,dtype=fp32,fault={fault}", side="engine")
        make = lambda w: make_engine(w.config, spec, max_num_seqs=16, weights=w)  # noqa: E731
        r = PROBES["weight_sync"](make, model, p, PARAMS, spec)
        assert r.passed is want, (fault, r.numbers)
