"""replica=<kind>: a second, scoring-only trainer pass; its noise floor and the remedy's selection overlap."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from timbench.grid.cost import cell_seconds
from timbench.grid.spec import expand, parse_grid
from timbench.metrics.mismatch import mismatch_metrics
from timbench.metrics.schema import K3_KL, check_key
from timbench.remedies import load_remedy
from timbench.replica import REPLICAS, jaccard, replica_metrics
from timbench.rl.config import RunConfig, load_config, parse_config
from timbench.rl.loop import run
from timbench.rl.step import StepBatch, correct_phase

BASE = ["steps=3", "prompts_per_step=4", "group_size=4", "eval_every=3", "eval_n=8"]
# A thresholded remedy with a band narrow enough that a bf16 engine's |delta| (~4e-3) puts tokens outside it.
NARROW_ICEPOP = ["engine=dtype=bf16", "remedy=icepop", "remedy_args.low=0.99", "remedy_args.high=1.01"]
REJECTED = "rollout_corr/rollout_rs_masked_fraction"


def _rows(path):
    return [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]


def test_jaccard_by_hand():
    a = torch.tensor([[1, 1, 0, 0], [0, 1, 0, 1]], dtype=torch.bool)
    b = torch.tensor([[1, 0, 0, 0], [0, 1, 1, 1]], dtype=torch.bool)
    assert jaccard(a, b) == 3 / 5  # a & b = {(0,0),(1,1),(1,3)}, a | b adds (0,1),(1,2)
    assert jaccard(a, a) == 1.0
    none = torch.zeros(2, 4, dtype=torch.bool)
    assert jaccard(none, none) == 1.0  # both empty: two selections that agree (the stated convention)
    assert jaccard(a, none) == 0.0
    with pytest.raises(ValueError, match="shapes"):
        jaccard(a, a[:1])


def _hand_batch():
    """2 x 4 tokens, mu = -1, icepop band [0.5, 2]: the real and the replica pass disagree on two tokens."""
    mu = torch.full((2, 4), -1.0)
    delta = torch.tensor([[0.0, 1.0, 0.6, 5.0], [0.1, -1.0, 0.0, 0.0]])
    twin = torch.tensor([[0.0, 1.0, 0.75, 5.0], [0.1, -0.5, 0.0, 0.2]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]], dtype=torch.bool)
    exp = SimpleNamespace(rollout_logprobs=mu, mask=mask)
    batch = StepBatch(
        0, exp, torch.tensor([1.0, -1.0]), mask.clone(), 2, old_logprobs=mu + delta, replica_logprobs=mu + twin
    )
    lane = SimpleNamespace(remedy=load_remedy("icepop", {"low": 0.5, "high": 2.0}), plugin_timeout=0)
    return lane, SimpleNamespace(group_size=2), batch


def test_the_remedy_runs_on_the_replica_as_on_the_real_pass():
    lane, run_, batch = _hand_batch()
    correct_phase(lane, run_, batch)
    m = batch.replica_metrics
    # rejected (rho outside [0.5, 2]): real {(0,1) rho=e, (1,1) rho=1/e}; replica {(0,1), (0,2) rho=e^0.75}
    assert m["replica/mask_jaccard"] == 1 / 3
    # kept: real {(0,0),(0,2),(1,0),(1,2),(1,3)}, replica {(0,0),(1,0),(1,1),(1,2),(1,3)}
    assert m["replica/kept_jaccard"] == 4 / 6
    # weights (rho) on the tokens both keep: only (1,3) differs, 1 vs e^0.2; (0,3) is outside the loss mask
    assert m["replica/weight_max_abs_delta"] == pytest.approx(0.2214027581601699, abs=1e-6)
    floor = mismatch_metrics(batch.old_logprobs, batch.replica_logprobs, batch.exp.mask)
    assert m["replica/max_abs_delta"] == 0.5 == floor["mismatch/max_abs_delta"]
    assert m["replica/mean_abs_delta"] == pytest.approx((0.15 + 0.5 + 0.2) / 7, abs=1e-6)
    assert m["replica/k3_kl"] == floor[K3_KL] > 0
    assert all(check_key(k) for k in m)
    # the replica is scoring only: the loss mask and weights are the real pass's alone
    _, _, plain = _hand_batch()
    plain.replica_logprobs = None
    correct_phase(lane, run_, plain)
    assert torch.equal(plain.mask, batch.mask) and torch.equal(plain.weights, batch.weights)
    assert plain.replica_metrics == {} and plain.remedy_metrics == batch.remedy_metrics


def test_a_remedy_that_rejects_nothing_gives_overlap_one():
    first = torch.tensor([[-1.0, -2.0]])
    keep = torch.ones(1, 2, dtype=torch.bool)
    m = replica_metrics(first, first, keep, keep, keep, keep, None, None)
    assert m["replica/mask_jaccard"] == 1.0 and m["replica/kept_jaccard"] == 1.0
    assert m["replica/max_abs_delta"] == 0.0 and m["replica/weight_max_abs_delta"] == 0.0


@pytest.mark.parametrize("bad", ["microbatch", "None", 1, ["identical"]])
def test_a_bad_replica_value_is_a_one_line_error(bad):
    with pytest.raises(ValueError, match="config key 'replica'.*valid: none, identical, microbatch1") as e:
        parse_config({"replica": bad})
    assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match="config key 'replica'"):
        load_config(None, [f"replica={bad}"])


def test_replica_off_writes_the_config_it_always_wrote():
    """replica is in config.yaml only when on: older run dirs resume, grid fingerprints and config bytes hold."""
    assert "replica" not in RunConfig().to_dict()
    on = RunConfig(replica="microbatch1").to_dict()
    assert on["replica"] == "microbatch1" and parse_config(on).replica == "microbatch1"
    assert set(REPLICAS) == {"none", "identical", "microbatch1", "fullbatch"}
    grid = parse_grid(
        {"name": "r", "base": {"replica": "microbatch1", "steps": 1}, "axes": {"condition": ["baseline"]}}
    )
    cfg = expand(grid)[0].config
    assert cfg["replica"] == "microbatch1"
    assert cell_seconds(cfg) > cell_seconds({**cfg, "replica": "none"})  # one more recompute pass per step


def test_exact_kernels_replica_is_bitwise_and_changes_no_training_number(tmp_path):
    """Exact kernels are batch-invariant: one sequence per forward call scores every token as the real,
    chunked pass does (floor 0.0, the same rejected set), and the run trains exactly as without a replica."""
    run(load_config(None, BASE + NARROW_ICEPOP + ["replica=microbatch1"]), tmp_path / "on", progress=False)
    run(load_config(None, BASE + NARROW_ICEPOP), tmp_path / "off", progress=False)
    on, off = _rows(tmp_path / "on"), _rows(tmp_path / "off")
    assert len(on) == 3
    for r in on:
        assert r[REJECTED] > 0  # the rejected set is not empty: the overlap below is a real comparison
        assert r["replica/max_abs_delta"] == 0.0 and r["replica/k3_kl"] == 0.0
        assert r["replica/mask_jaccard"] == 1.0 and r["replica/kept_jaccard"] == 1.0
        assert r["replica/weight_max_abs_delta"] == 0.0
    assert [{k: v for k, v in r.items() if not k.startswith("replica/")} for r in on] == off
    assert not any(k.startswith("replica/") for r in off for k in r)
    assert (tmp_path / "on/eval.jsonl").read_bytes() == (tmp_path / "off/eval.jsonl").read_bytes()


def test_a_stale_run_replays_the_weights_pi_old_came_from(tmp_path):
    """stale_old=behavior: pi_old is scored under the behavior weights, so the replica must be too (the current
    weights differ from step 1 on: staleness_k3 > 0, and the floor would not be 0)."""
    cfg = BASE + NARROW_ICEPOP + ["engine.staleness=1", "trainer.stale_old=behavior", "replica=fullbatch"]
    run(load_config(None, cfg), tmp_path / "stale", progress=False)
    rows = _rows(tmp_path / "stale")
    assert rows[2]["staleness/staleness_k3"] > 0
    assert all(r["replica/max_abs_delta"] == 0.0 and r["replica/mask_jaccard"] == 1.0 for r in rows)
