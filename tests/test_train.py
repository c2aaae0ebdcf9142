"""The RL loop end to end on a tiny budget: determinism, resume, exact baseline, mismatch, twin, errors."""

import json

import pytest

from timbench.model import PRESETS, Qwen3ForCausalLM, save_checkpoint
from timbench.rl import loop as loop_mod
from timbench.rl.config import load_config
from timbench.rl.loop import NonFiniteError, run
from timbench.tasks.base import Task


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    d = tmp_path_factory.mktemp("ckpt")
    save_checkpoint(Qwen3ForCausalLM(PRESETS["tiny-dense"], seed=2), d)
    return d


@pytest.fixture
def parity_reward(monkeypatch):
    # A random-init model never solves the task; reward response parity so advantages are non-zero.
    monkeypatch.setattr(Task, "reward", lambda self, response, problem, format_reward=0.0: float(len(response) % 2))


def _cfg(ckpt, *extra):
    return load_config(None, [f"model={ckpt}", "steps=3", "prompts_per_step=4", "group_size=4", "mini_batches=2",
                              "eval_every=2", "eval_n=16", "checkpoint_every=1", "lr=1e-3", *extra])


def _lines(d, name):
    return [json.loads(l) for l in (d / f"{name}.jsonl").read_text().splitlines()]


def test_same_config_same_seed_gives_identical_metrics(ckpt, tmp_path, parity_reward):
    run(_cfg(ckpt), tmp_path / "a", progress=False)
    run(_cfg(ckpt), tmp_path / "b", progress=False)
    a, b = (tmp_path / "a" / "metrics.jsonl").read_bytes(), (tmp_path / "b" / "metrics.jsonl").read_bytes()
    assert a == b and len(a.splitlines()) == 3
    assert (tmp_path / "a" / "eval.jsonl").read_bytes() == (tmp_path / "b" / "eval.jsonl").read_bytes()
    rows = _lines(tmp_path / "a", "metrics")
    assert any(r["actor/grad_norm"] > 0 for r in rows)
    for r in rows:  # the zero-mismatch baseline is exactly zero at every step
        assert r["training/rollout_probs_diff_max"] == 0.0 and r["rollout_corr/k3_kl"] == 0.0
        assert r["drift/diff_abs_mean"] == 0.0
    evals = _lines(tmp_path / "a", "eval")
    assert [e["step"] for e in evals] == [0, 2, 3]
    s = json.loads((tmp_path / "a" / "summary.json").read_text())
    assert s["status"] == "finished" and s["steps_done"] == 3
    other = run(_cfg(ckpt, "seed=1"), tmp_path / "c", progress=False)
    assert (tmp_path / "c" / "metrics.jsonl").read_bytes() != a and other["seed"] == 1


def test_crash_then_resume_writes_each_step_once(ckpt, tmp_path, parity_reward, monkeypatch):
    run(_cfg(ckpt), tmp_path / "ref", progress=False)
    real = loop_mod.train_step

    def crash_at_2(lane, cfg, task, algo, step):
        if step == 2:
            raise KeyboardInterrupt("simulated kill")
        return real(lane, cfg, task, algo, step)

    monkeypatch.setattr(loop_mod, "train_step", crash_at_2)
    with pytest.raises(KeyboardInterrupt):
        run(_cfg(ckpt), tmp_path / "x", progress=False)
    with open(tmp_path / "x" / "metrics.jsonl", "a") as f:
        f.write('{"step": 2, "torn')  # a line cut by the kill
    monkeypatch.setattr(loop_mod, "train_step", real)
    run(_cfg(ckpt), tmp_path / "x", progress=False)
    assert (tmp_path / "x" / "metrics.jsonl").read_bytes() == (tmp_path / "ref" / "metrics.jsonl").read_bytes()
    assert (tmp_path / "x" / "eval.jsonl").read_bytes() == (tmp_path / "ref" / "eval.jsonl").read_bytes()
    with pytest.raises(ValueError, match="different config"):
        run(_cfg(ckpt, "lr=2e-3"), tmp_path / "x", progress=False)


def test_torch_engine_logs_mismatch_from_step_one_and_twin_tracks_it(ckpt, tmp_path, parity_reward):
    cfg = _cfg(ckpt, "engine.kernels=torch", "engine.dtype=bf16", "twin=true", "steps=2", "mode=bypass")
    s = run(cfg, tmp_path / "t", progress=False)
    rows = _lines(tmp_path / "t", "metrics")
    assert rows[0]["training/rollout_probs_diff_max"] > 0 and rows[0]["rollout_corr/k3_kl"] > 0
    assert rows[0]["mismatch/frac_tokens_differ"] > 0.5
    assert all("twin/frac_tokens_differ" in r for r in rows)
    assert s["twin/param_distance"] > 0
    assert s["first_divergence_step"] in (None, 0, 1)


def test_kl_penalty_to_the_warm_start_is_logged(ckpt, tmp_path, parity_reward):
    run(_cfg(ckpt, "kl_coef=0.1", "steps=2", "lr=1e-2", "mini_batches=1"), tmp_path / "k", progress=False)
    rows = _lines(tmp_path / "k", "metrics")
    assert rows[0]["actor/kl_loss"] == 0.0  # one update per step: step 0 starts at the reference
    assert rows[1]["actor/kl_loss"] > 0.0


def test_non_finite_training_is_a_clear_failure_that_keeps_metrics(ckpt, tmp_path, parity_reward):
    with pytest.raises(NonFiniteError, match="non-finite"):
        run(_cfg(ckpt, "lr=1e30", "grad_clip=1e30", "steps=3"), tmp_path / "n", progress=False)
    s = json.loads((tmp_path / "n" / "summary.json").read_text())
    assert s["status"] == "failed" and "non-finite" in s["error"]


@pytest.mark.parametrize("override, message", [
    ("colour=red", "unknown config key 'colour'"),
    ("mode=sideways", "valid: recompute, bypass"),
    ("engine.kernels=cuda", "invalid value 'cuda' for kernels"),
    ("algorithm=ppo2", "grpo"),
    ("task=add-9d-v9", "add-4d-v1"),
    ("steps.x=1", "no sub-keys"),
])
def test_bad_config_is_a_one_line_error(override, message):
    with pytest.raises((ValueError, KeyError), match=message):
        load_config("bench/runs/baseline.yaml", [override])


def test_unknown_key_in_yaml(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("task: add-4d-v1\nlearning_rate: 1\n")
    with pytest.raises(ValueError, match="unknown config key"):
        load_config(p)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_config(tmp_path / "none.yaml")
