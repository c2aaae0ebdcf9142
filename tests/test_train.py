"""The RL loop end to end on a tiny budget: determinism, resume, exact baseline, mismatch, twin, errors."""

import dataclasses
import json

import pytest

from timbench.cli import main
from timbench.model import PRESETS, Qwen3ForCausalLM, save_checkpoint
from timbench.rl import loop as loop_mod
from timbench.rl.config import Loaded, RunConfig, apply_overrides, load, load_config, parse_config
from timbench.rl.loop import NonFiniteError, run
from timbench.rl.rundir import read_status
from timbench.spec.keys import parse_spec
from timbench.tasks.base import Task


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    d = tmp_path_factory.mktemp("ckpt")
    save_checkpoint(Qwen3ForCausalLM(PRESETS["tiny-dense"], seed=2), d)
    return d


@pytest.fixture(scope="module")
def moe_ckpt(tmp_path_factory):
    d = tmp_path_factory.mktemp("moe")
    save_checkpoint(Qwen3ForCausalLM(PRESETS["tiny-moe"], seed=3), d)
    return d


@pytest.fixture
def parity_reward(monkeypatch):
    # A random-init model never solves the task; reward response parity so advantages are non-zero.
    monkeypatch.setattr(Task, "reward", lambda self, response, problem, format_reward=0.0: float(len(response) % 2))


def _cfg(ckpt, *extra):
    return load_config(
        None,
        [
            f"model={ckpt}",
            "steps=3",
            "prompts_per_step=4",
            "group_size=4",
            "mini_batches=2",
            "eval_every=2",
            "eval_n=16",
            "checkpoint_every=1",
            "lr=1e-3",
            *extra,
        ],
    )


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


def _crash_at(monkeypatch, at_step):
    real = loop_mod.train_step

    def crash(lane, loaded, step):
        if step == at_step:
            raise KeyboardInterrupt("simulated kill")
        return real(lane, loaded, step)

    monkeypatch.setattr(loop_mod, "train_step", crash)
    return real


def test_crash_then_resume_writes_each_step_once(ckpt, tmp_path, parity_reward, monkeypatch):
    run(_cfg(ckpt), tmp_path / "ref", progress=False)
    real = _crash_at(monkeypatch, 2)
    with pytest.raises(KeyboardInterrupt):
        run(_cfg(ckpt), tmp_path / "x", progress=False)
    assert read_status(tmp_path / "x") == {"status": "failed", "error": "KeyboardInterrupt: simulated kill"}
    assert not (tmp_path / "x" / "summary.json").exists()
    with open(tmp_path / "x" / "metrics.jsonl", "a") as f:
        f.write('{"step": 2, "torn')  # a line cut by the kill
    monkeypatch.setattr(loop_mod, "train_step", real)
    run(_cfg(ckpt), tmp_path / "x", progress=False)
    assert read_status(tmp_path / "x") == {"status": "finished", "error": None}
    assert (tmp_path / "x" / "metrics.jsonl").read_bytes() == (tmp_path / "ref" / "metrics.jsonl").read_bytes()
    assert (tmp_path / "x" / "eval.jsonl").read_bytes() == (tmp_path / "ref" / "eval.jsonl").read_bytes()
    with pytest.raises(ValueError, match="different config"):
        run(_cfg(ckpt, "lr=2e-3"), tmp_path / "x", progress=False)
    assert read_status(tmp_path / "x")["status"] == "finished"  # a refused rerun leaves the run's state alone


# Every phase and hook at once: a real mismatch, a remedy with spec overrides and weights, bypass,
# a twin, KL to the reference, DAPO's dynamic sampling, two epochs.
MISMATCH = [
    "engine=kernels=torch,dtype=bf16",
    "remedy=tis_token+seq_rs",
    "mode=bypass",
    "twin=true",
    "kl_coef=0.1",
    "algorithm=dapo",
    "epochs=2",
    "steps=2",
    "eval_every=1",
]


def test_entry_points_agree_byte_for_byte(ckpt, tmp_path, parity_reward):
    """The CLI (YAML + --set), load_config and a RunConfig built in Python run the same bytes."""
    overrides = [
        f"model={ckpt}",
        "steps=2",
        "prompts_per_step=4",
        "group_size=4",
        "mini_batches=2",
        "eval_every=1",
        "eval_n=16",
        "lr=1e-3",
        *MISMATCH[:-2],
    ]
    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text("task: add-4d-v1\nengine: {kernels: torch, dtype: bf16}\n")
    args = ["train", str(cfg_file), "--out", str(tmp_path / "cli"), "--quiet"]
    assert main(args + [a for o in overrides if not o.startswith("engine=") for a in ("--set", o)]) == 0
    loaded = load_config(None, overrides)
    assert isinstance(loaded, Loaded)
    run(loaded, tmp_path / "api", progress=False)
    plain = parse_config(apply_overrides({}, overrides))
    assert isinstance(plain, RunConfig) and not isinstance(plain, Loaded)
    run(plain, tmp_path / "plain", progress=False)
    for name in ("metrics.jsonl", "eval.jsonl", "config.yaml"):
        want = (tmp_path / "api" / name).read_bytes()
        assert (tmp_path / "cli" / name).read_bytes() == want and (tmp_path / "plain" / name).read_bytes() == want
    rows = _lines(tmp_path / "api", "metrics")
    assert rows[0]["training/rollout_probs_diff_max"] > 0 and "actor/kl_loss" in rows[0]


@pytest.mark.parametrize("kind", ["mismatch", "moe_r3"])
def test_resume_matches_an_uninterrupted_run_through_every_phase(
    ckpt, moe_ckpt, tmp_path, parity_reward, monkeypatch, kind
):
    extra = (
        MISMATCH
        if kind == "mismatch"
        else [
            f"model={moe_ckpt}",
            "preset=tiny-moe",
            "remedy=routing_replay_r3",
            "engine=dtype=bf16,router_dtype=bf16",
            "trainer=dtype=bf16,router_dtype=fp32",
            "twin=true",
            "steps=3",
        ]
    )
    run(_cfg(ckpt, *extra), tmp_path / "ref", progress=False)
    real = _crash_at(monkeypatch, 1)
    with pytest.raises(KeyboardInterrupt):
        run(_cfg(ckpt, *extra), tmp_path / "x", progress=False)
    monkeypatch.setattr(loop_mod, "train_step", real)
    run(_cfg(ckpt, *extra), tmp_path / "x", progress=False)
    for name in ("metrics.jsonl", "eval.jsonl"):
        assert (tmp_path / "x" / name).read_bytes() == (tmp_path / "ref" / name).read_bytes()
    if kind == "moe_r3":
        assert all("mismatch/routing_agreement" in r for r in _lines(tmp_path / "x", "metrics"))


def test_a_failed_start_leaves_a_failed_status_and_a_rerun_finishes(ckpt, tmp_path, parity_reward, monkeypatch):
    real = loop_mod.make_lane

    def broken(*a, **k):
        raise RuntimeError("engine could not start\nsecond line")

    monkeypatch.setattr(loop_mod, "make_lane", broken)
    with pytest.raises(RuntimeError):
        run(_cfg(ckpt, "steps=1"), tmp_path / "r", progress=False)
    assert read_status(tmp_path / "r") == {
        "status": "failed",
        "error": "RuntimeError: engine could not start second line",
    }
    assert (tmp_path / "r" / "config.yaml").is_file() and not (tmp_path / "r" / "summary.json").exists()
    monkeypatch.setattr(loop_mod, "make_lane", real)
    s = run(_cfg(ckpt, "steps=1"), tmp_path / "r", progress=False)
    assert s["status"] == "finished" and read_status(tmp_path / "r") == {"status": "finished", "error": None}
    # A finished, sealed run started again is not started at all: its result stands (nothing
    # destroyed by a rerun), so a start that would fail cannot take its summary.json away.
    monkeypatch.setattr(loop_mod, "make_lane", broken)
    assert run(_cfg(ckpt, "steps=1"), tmp_path / "r", progress=False) == s
    assert read_status(tmp_path / "r")["status"] == "finished" and (tmp_path / "r" / "summary.json").is_file()


def test_torch_engine_logs_mismatch_from_step_one_and_twin_tracks_it(ckpt, tmp_path, parity_reward):
    cfg = _cfg(ckpt, "engine.kernels=torch", "engine.dtype=bf16", "twin=true", "steps=2", "mode=bypass")
    s = run(cfg, tmp_path / "t", progress=False)
    rows = _lines(tmp_path / "t", "metrics")
    assert rows[0]["training/rollout_probs_diff_max"] > 0 and rows[0]["rollout_corr/k3_kl"] > 0
    assert rows[0]["mismatch/frac_tokens_differ"] > 0.5
    assert all("twin/frac_tokens_differ" in r for r in rows)
    assert s["twin/param_distance"] > 0
    first = next((r["step"] for r in rows if r["twin/frac_tokens_differ"] > 0), None)
    assert first is not None and s["first_divergence_step"] == first
    # A zero-mismatch run's twin never diverges: same tokens at every step, same weights at the end.
    s0 = run(_cfg(ckpt, "twin=true", "steps=2"), tmp_path / "z", progress=False)
    assert all(r["twin/frac_tokens_differ"] == 0.0 for r in _lines(tmp_path / "z", "metrics"))
    assert s0["first_divergence_step"] is None and s0["twin/param_distance"] == 0.0


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


@pytest.mark.parametrize(
    "override, message",
    [
        ("colour=red", "unknown config key 'colour'"),
        ("mode=sideways", "valid: recompute, bypass"),
        ("engine.kernels=cuda", "invalid value 'cuda' for kernels"),
        ("algorithm=ppo2", "grpo"),
        ("task=add-9d-v9", "add-4d-v1"),
        ("steps.x=1", "no sub-keys"),
        # values that would train silently wrong: each rejected naming the key and its valid range
        ("grad_clip=-1", "'grad_clip': -1.0 is out of range; valid: a number > 0"),
        ("grad_clip=0", "'grad_clip': 0.0 is out of range; valid: a number > 0"),
        ("eps_low=-0.1", "'eps_low': -0.1 is out of range; valid: None or a finite number >= 0"),
        ("eps_high=-0.2", "'eps_high': -0.2 is out of range"),
        ("kl_coef=-0.5", "'kl_coef': -0.5 is out of range; valid: a finite number >= 0"),
        ("lr=-1e-4", "'lr': -0.0001 is out of range; valid: a finite number >= 0"),
        ("weight_decay=-0.1", "'weight_decay': -0.1 is out of range"),
        ("temperature=-1", "'temperature': -1.0 is out of range; valid: a finite number > 0"),
        ("betas=0.9", "'betas': 0.9 is invalid; valid: a list of two numbers in \\[0, 1\\)"),
        ("betas=[0.9]", "'betas'"),
        ("betas=[0.9, 1.5]", "'betas'"),
        ("eval_n=1000000000", "'eval_n': 1000000000 is out of range; valid: 1..4096"),
        (
            "clip_ratio_c=1",
            r"'clip_ratio_c': 1.0 is out of range; valid: None \(dual-clip off\) or a finite number > 1",
        ),
        ("clip_ratio_c=0.5", "'clip_ratio_c': 0.5 is out of range"),
        ("clip_ratio_c=.inf", "'clip_ratio_c': inf is not a valid float"),  # c = inf would be dual-clip off
    ],
)
def test_bad_config_is_a_one_line_error(override, message):
    with pytest.raises((ValueError, KeyError), match=message) as e:
        load_config("bench/runs/baseline.yaml", [override])
    assert "\n" not in str(e.value)


def test_eval_n_above_a_task_s_eval_set_is_a_clear_error(monkeypatch):
    from timbench.tasks.addition import AdditionTask

    monkeypatch.setattr(AdditionTask, "eval_set", lambda self, n=512: [object()] * min(n, 10))  # a 10-problem set
    with pytest.raises(ValueError, match="'eval_n': 11 is more than task add-4d-v1's eval set holds"):
        load_config("bench/runs/baseline.yaml", ["eval_n=11"])
    assert len(load_config("bench/runs/baseline.yaml", ["eval_n=10"]).eval_problems) == 10


def test_building_a_config_loads_nothing_and_load_runs_a_plugin_once(tmp_path):
    marker = tmp_path / "imported"
    plugin = tmp_path / "plug.py"
    plugin.write_text(
        f"from pathlib import Path\nfrom timbench.remedies import Remedy, builtin\n"
        f"p = Path({str(marker)!r}); p.write_text(p.read_text() + 'x' if p.exists() else 'x')\n"
        "class Plug(builtin.NoRemedy):\n    name = 'plug'\n"
    )
    raw = apply_overrides({}, [f"remedy={plugin}:Plug", "engine.kernels=torch"])
    cfg = parse_config(raw)
    assert not marker.exists() and cfg.engine == parse_spec("kernels=torch,dtype=fp32")
    loaded = load(cfg)
    assert marker.read_text() == "x" and load(loaded) is loaded  # a Loaded is not loaded again
    assert loaded.remedy_impl.name == "plug" and loaded.task == "add-4d-v1" and loaded.task_impl.name == "add-4d-v1"
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.lr = 1.0


def test_unknown_key_in_yaml(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("task: add-4d-v1\nlearning_rate: 1\n")
    with pytest.raises(ValueError, match="unknown config key"):
        load_config(p)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_config(tmp_path / "none.yaml")


_FSIZE = """
import resource, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit then fails with EFBIG instead of killing
resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[1]), int(sys.argv[1])))
from timbench.cli import main
sys.exit(main(sys.argv[2:]))
"""


def test_a_refused_write_is_one_line_with_the_path_and_a_rerun_resumes_byte_identical(ckpt, tmp_path):
    # RLIMIT_FSIZE stands in for a full disk (no root or tmpfs needed): the checkpoint is the first file over it.
    import subprocess
    import sys

    args = ["train", "--out", str(tmp_path / "full"), "--quiet"] + [
        a
        for o in (
            f"model={ckpt}",
            "steps=3",
            "prompts_per_step=4",
            "group_size=4",
            "mini_batches=2",
            "eval_every=2",
            "eval_n=16",
            "checkpoint_every=1",
            "lr=1e-3",
        )
        for a in ("--set", o)
    ]
    p = subprocess.run([sys.executable, "-c", _FSIZE, "200000", *args], capture_output=True, text=True)
    assert p.returncode == 2, p.stderr[-2000:]
    err = p.stderr.strip().splitlines()
    assert len(err) == 1 and "checkpoints/state.pt: File too large (EFBIG)" in err[0] and str(tmp_path) in err[0]
    st = read_status(tmp_path / "full")
    assert st["status"] == "failed" and "WriteError: writing" in st["error"] and "state.pt" in st["error"]
    assert not list((tmp_path / "full").rglob(".*.tmp"))  # no temp file left behind
    assert main(args) == 0  # the "disk" has room again: the same command resumes and finishes
    assert main(["train", "--out", str(tmp_path / "clean")] + args[3:]) == 0
    for name in ("metrics.jsonl", "eval.jsonl"):
        assert (tmp_path / "full" / name).read_bytes() == (tmp_path / "clean" / name).read_bytes(), name


def test_a_truncated_checkpoint_and_a_raising_plugin_are_one_line_errors(ckpt, tmp_path, capsys):
    args = ["train", "--out", str(tmp_path / "r"), "--quiet"] + [
        a
        for o in (
            f"model={ckpt}",
            "steps=2",
            "prompts_per_step=4",
            "group_size=4",
            "mini_batches=2",
            "eval_every=2",
            "eval_n=16",
            "checkpoint_every=1",
        )
        for a in ("--set", o)
    ]
    assert main(args) == 0
    state = tmp_path / "r" / "checkpoints" / "state.pt"
    state.write_bytes(state.read_bytes()[:1000])  # a checkpoint cut short (a copy that did not finish)
    (tmp_path / "r" / "config.yaml").write_text((tmp_path / "r" / "config.yaml").read_text())
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "state.pt: unreadable checkpoint" in err[0] and "delete it" in err[0]
    (tmp_path / "boom.py").write_text(
        "from timbench.remedies import Remedy\n\nclass Boom(Remedy):\n"
        "    name = 'boom'\n    doc = 'raises'\n"
        "    def __call__(self, batch):\n        raise RuntimeError('plug-in bug')\n"
    )
    out = tmp_path / "b"
    assert main(["train", "--out", str(out), "--quiet", "--remedy", f"{tmp_path / 'boom.py'}:Boom"] + args[4:]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "RuntimeError: plug-in bug" in err[0] and "traceback in" in err[0]
    assert "Traceback" in (out / "error.txt").read_text()
    assert read_status(out)["status"] == "failed"


def test_dual_clip_key_written_only_when_set_and_refused_where_the_loss_has_none():
    off = load_config("bench/runs/baseline.yaml")
    assert "clip_ratio_c" not in off.to_dict()  # configs (and grid fingerprints) of runs without it are unchanged
    assert load_config("bench/runs/baseline.yaml", ["clip_ratio_c=3"]).to_dict()["clip_ratio_c"] == 3.0
    with pytest.raises(
        ValueError, match="'clip_ratio_c': algorithm gspo has no dual-clip .*; valid with: grpo, dapo"
    ) as e:
        load_config("bench/runs/baseline.yaml", ["algorithm=gspo", "clip_ratio_c=3"])
    assert "\n" not in str(e.value)
