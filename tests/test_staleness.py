"""staleness=K: the engine samples with the policy of K updates ago; the ratio splits into its two factors."""

from __future__ import annotations

import json
import math

import pytest
import torch

from timbench.metrics.schema import K3_KL
from timbench.rl.config import load_config
from timbench.rl.loop import run
from timbench.rl.staleness import PolicyHistory, split_metrics
from timbench.spec.keys import SpecError, parse_spec

BASE = ["steps=3", "prompts_per_step=2", "group_size=4", "eval_every=3", "eval_n=8"]


def _rows(path):
    return [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]


def test_history_keeps_k_plus_one_versions_and_samples_from_the_oldest():
    m = torch.nn.Linear(2, 1, bias=False)
    h = PolicyHistory(2, m)
    seen = []
    for v in range(1, 5):
        with torch.no_grad():
            m.weight.fill_(v)
        h.push(m)
        seen.append((h.lag, float(h.behavior["weight"][0, 0])))
    # after v updates the engine samples with version max(0, v - 2)
    assert [lag for lag, _ in seen] == [1, 2, 2, 2] and [w for _, w in seen][2:] == [1.0, 2.0]
    assert seen[0][1] == seen[1][1] != 1.0  # clamped at version 0, the initial weights
    copy = PolicyHistory(2, m)
    copy.restore(h.state())
    assert copy.lag == 2 and torch.equal(copy.behavior["weight"], h.behavior["weight"]) and copy.first == h.first


def test_split_metrics_factor_the_ratio():
    mask = torch.tensor([[True, True, False]])
    roll = torch.tensor([[-1.0, -2.0, -9.0]], dtype=torch.float64)
    beh = torch.tensor([[-1.1, -2.0, 5.0]], dtype=torch.float64)
    cur = torch.tensor([[-0.9, -2.3, 7.0]], dtype=torch.float64)
    m = split_metrics(cur, beh, roll, mask, lag=2)
    k3 = lambda d: sum(math.exp(x) - 1 - x for x in d) / len(d)  # noqa: E731
    assert m["staleness/lag"] == 2.0
    assert m["staleness/mismatch_k3"] == pytest.approx(k3([-0.1, 0.0]), abs=1e-12)
    assert m["staleness/staleness_k3"] == pytest.approx(k3([0.2, -0.3]), abs=1e-12)
    assert m["staleness/total_k3"] == pytest.approx(k3([0.1, -0.3]), abs=1e-12)
    assert m["staleness/mismatch_log_ratio_mean"] == pytest.approx(-0.05, abs=1e-12)


@pytest.mark.parametrize("bad", ["-1", "x", "1.5"])
def test_bad_staleness_is_a_spec_error(bad):
    with pytest.raises(SpecError, match=f"invalid value '{bad}' for staleness; valid: integer >= 0"):
        parse_spec(f"staleness={bad}", side="engine")
    with pytest.raises(SpecError, match="staleness"):
        parse_spec("staleness=2", side="trainer")  # the engine's key


def test_stale_zero_mismatch_engine(tmp_path):
    """Zero mismatch + staleness 2: the mismatch factor is exactly 0 every step; the staleness factor appears
    once the engine lags; `behavior` makes rollout_corr the mismatch alone, `current` the product."""
    for old in ("current", "behavior"):
        run(
            load_config(None, BASE + ["engine.staleness=2", f"trainer.stale_old={old}"]), tmp_path / old, progress=False
        )
    cur, beh = _rows(tmp_path / "current"), _rows(tmp_path / "behavior")
    assert [r["staleness/lag"] for r in cur] == [0.0, 1.0, 2.0]
    assert all(r["staleness/mismatch_k3"] == 0.0 for r in cur + beh)
    assert cur[0]["staleness/staleness_k3"] == 0.0 and cur[2]["staleness/staleness_k3"] > 0.0
    assert all(r[K3_KL] == 0.0 for r in beh)  # pi_old is the behavior policy: no mismatch on the engine's ratio
    assert cur[1][K3_KL] == cur[1]["staleness/total_k3"] > 0.0  # pi_old is current: rho carries the staleness


def test_staleness_zero_is_the_synchronous_loop_and_a_stale_run_resumes_bytewise(tmp_path, monkeypatch):
    import timbench.rl.loop as loop_mod

    run(load_config(None, BASE), tmp_path / "sync", progress=False)
    run(load_config(None, BASE + ["engine.staleness=0"]), tmp_path / "k0", progress=False)
    assert (tmp_path / "sync/metrics.jsonl").read_bytes() == (tmp_path / "k0/metrics.jsonl").read_bytes()
    stale = BASE + ["engine.staleness=1", "engine.dtype=bf16", "checkpoint_every=1"]
    run(load_config(None, stale), tmp_path / "full", progress=False)
    real = loop_mod.train_step

    def crash(lane, loaded, step):
        if step == 2:
            raise KeyboardInterrupt("simulated kill")
        return real(lane, loaded, step)

    monkeypatch.setattr(loop_mod, "train_step", crash)
    with pytest.raises(KeyboardInterrupt):
        run(load_config(None, stale), tmp_path / "resumed", progress=False)
    monkeypatch.setattr(loop_mod, "train_step", real)
    run(load_config(None, stale), tmp_path / "resumed", progress=False)  # resumes at step 2 with its history
    assert (tmp_path / "full/metrics.jsonl").read_bytes() == (tmp_path / "resumed/metrics.jsonl").read_bytes()
    assert (tmp_path / "full/metrics.jsonl").read_bytes() != (tmp_path / "sync/metrics.jsonl").read_bytes()
