"""Hostile inputs: crafted checkpoints and results dirs, paths from data, reruns over finished runs,
plug-ins that fight their limits, malformed values. Each case ends in a refusal, a one-line error or the correct
result: no code run from data, no traceback, no data loss, no hang (docs/reliability.md lists them)."""

import io
import json
import os
import subprocess
import sys

import pytest
import torch

from timbench.cli import main
from timbench.model import PRESETS, Qwen3ForCausalLM, save_checkpoint


class _Marker:
    """Unpickling this runs a shell command that creates a marker file (what a crafted checkpoint would do)."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return os.system, (f"touch {self.path}",)


def _crafted(marker) -> bytes:
    buf = io.BytesIO()
    torch.save(_Marker(marker), buf)
    return buf.getvalue()


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    d = tmp_path_factory.mktemp("ckpt")
    save_checkpoint(Qwen3ForCausalLM(PRESETS["tiny-dense"], seed=2), d)
    return d


def _train_args(ckpt, out, steps=2):
    return ["train", "--out", str(out), "--quiet"] + [
        a
        for o in (
            f"model={ckpt}",
            f"steps={steps}",
            "prompts_per_step=4",
            "group_size=4",
            "mini_batches=2",
            "eval_every=2",
            "eval_n=16",
            "checkpoint_every=1",
        )
        for a in ("--set", o)
    ]


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


# 1. Nothing from a results dir or a checkpoint runs code.


def test_a_crafted_run_checkpoint_is_refused_without_running(ckpt, tmp_path, capsys):
    out, marker = tmp_path / "run", tmp_path / "pwned"
    (out / "checkpoints").mkdir(parents=True)
    (out / "checkpoints" / "state.pt").write_bytes(_crafted(marker))
    assert main(_train_args(ckpt, out)) == 2
    line = _one_line(capsys)
    assert not marker.exists()
    assert "state.pt: refused" in line and "posix.system" in line and "would run code" in line


def test_a_crafted_checkpoint_shipped_by_a_worker_is_refused_without_running(tmp_path):
    from timbench.runners.ship import checkpoint_step

    marker = tmp_path / "pwned"
    with pytest.raises(ValueError, match="refused: the checkpoint names posix.system"):
        checkpoint_step(_crafted(marker))
    assert not marker.exists()
    buf = io.BytesIO()
    torch.save({"step": 3, "extra": {}, "lanes": [{"model": {"w": torch.ones(2)}, "opt": {"betas": (0.9, 0.99)}}]}, buf)
    assert checkpoint_step(buf.getvalue()) == 3  # a real checkpoint's plain values still load


def test_a_results_dir_grid_naming_a_plugin_file_needs_allow_plugins(tmp_path, capsys):
    import yaml

    marker = tmp_path / "pwned"
    (tmp_path / "evil.py").write_text(
        f"import pathlib\npathlib.Path({str(marker)!r}).touch()\nraise SystemExit('imported')\n"
    )
    res = tmp_path / "results" / "g"
    res.mkdir(parents=True)
    (res / "grid.yaml").write_text(yaml.safe_dump({"name": "g", "axes": {"remedy": [f"{tmp_path / 'evil.py'}:E"]}}))
    (res / "cells.json").write_text("{}")  # written by `grid run` beside its grid.yaml: a results dir's copy
    assert main(["grid", "run", str(res / "grid.yaml"), "--out", str(res)]) == 2
    line = _one_line(capsys)
    assert not marker.exists()
    assert "evil.py:E" in line and "code run with your rights" in line and "--allow-plugins" in line


# 2. Every path derived from data stays inside its root.


def _escaping_grid(tmp_path, cid):
    """A results dir whose cells.json names `cid`, with a finished-looking run where that id leads."""
    out = tmp_path / "res"
    (out / "runs").mkdir(parents=True)
    cell = {
        "id": cid,
        "axes": {"remedy": "none", "mode": "recompute", "condition": "baseline"},
        "condition": {},
        "reference": None,
        "config": {},
    }
    (out / "cells.json").write_text(json.dumps({"grid": "g", "cells": [cell]}))
    target = out / "runs" / cid
    target.mkdir(parents=True, exist_ok=True)
    (target / "cell.json").write_text(json.dumps({"status": "done", "error": None, "wall_s": 1.0, "attempts": 1}))
    (target / "summary.json").write_text(json.dumps({"status": "finished"}))
    return out, target


@pytest.mark.parametrize("cid", ["../../x", "a/b", "", ".."])
def test_a_cell_id_that_leaves_runs_is_refused_by_verify_and_report(tmp_path, capsys, cid):
    out, target = _escaping_grid(tmp_path, cid)
    assert main(["grid", "verify", str(out), "--adopt"]) == 2
    assert f"cell id {cid!r}" in _one_line(capsys) and not (target / "manifest.json").exists()
    assert main(["grid", "report", str(out)]) == 2
    assert f"cell id {cid!r}" in _one_line(capsys)


def test_a_run_dir_linked_outside_runs_is_refused(tmp_path, capsys):
    out, _ = _escaping_grid(tmp_path, "c1")
    elsewhere = tmp_path / "elsewhere"
    (out / "runs" / "c1").rename(elsewhere)
    (out / "runs" / "c1").symlink_to(elsewhere)
    assert main(["grid", "verify", str(out), "--adopt"]) == 2
    assert "outside" in _one_line(capsys) and not (elsewhere / "manifest.json").exists()


# 3. Nothing destroyed by a rerun.


@pytest.fixture(scope="module")
def finished(ckpt, tmp_path_factory):
    """A finished, sealed two-step run (copied by each test that damages it)."""
    out = tmp_path_factory.mktemp("finished") / "run"
    assert main(_train_args(ckpt, out)) == 0
    return out


def _copy(src, tmp_path):
    import shutil

    return shutil.copytree(src, tmp_path / "run")


def test_a_rerun_over_a_truncated_checkpoint_keeps_the_finished_result(ckpt, finished, tmp_path, capsys):
    out = _copy(finished, tmp_path)
    before = {n: (out / n).read_bytes() for n in ("summary.json", "manifest.json", "status.json")}
    state = out / "checkpoints" / "state.pt"
    state.write_bytes(state.read_bytes()[:1000])
    capsys.readouterr()
    assert main(_train_args(ckpt, out)) == 2
    assert "state.pt: unreadable checkpoint" in _one_line(capsys)
    assert {n: (out / n).read_bytes() for n in before} == before


@pytest.mark.parametrize("damage", ["truncate", "edit"])
def test_a_rerun_never_reseals_damaged_logs(ckpt, finished, tmp_path, capsys, damage):
    out = _copy(finished, tmp_path)
    log = out / "eval.jsonl"
    rows = log.read_text().splitlines()
    if damage == "truncate":
        log.write_text("\n".join(rows[:-1]) + "\n")
    else:
        row = json.loads(rows[-1])
        row["accuracy_t1"] = 1.0
        log.write_text("\n".join(rows[:-1] + [json.dumps(row, sort_keys=True)]) + "\n")
    sealed = (out / "manifest.json").read_bytes()
    capsys.readouterr()
    assert main(_train_args(ckpt, out)) == 2
    line = _one_line(capsys)
    assert "eval.jsonl: sha256 differs" in line and "not resumed or re-sealed" in line
    assert (out / "manifest.json").read_bytes() == sealed


def test_a_rerun_of_an_intact_finished_run_touches_nothing(ckpt, finished, tmp_path, capsys):
    out = _copy(finished, tmp_path)
    before = {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in out.rglob("*") if p.is_file()}
    capsys.readouterr()
    assert main(_train_args(ckpt, out)) == 0
    assert json.loads(capsys.readouterr().out)["status"] == "finished"
    assert {
        p: (p.stat().st_mtime_ns, p.read_bytes())
        for p in out.rglob("*")
        if p.is_file()
        if p.name not in ("config.yaml", ".lock")
    } == {p: v for p, v in before.items() if p.name not in ("config.yaml", ".lock")}


# 5. Errors: one line naming what and where.


def test_the_lock_message_names_the_holder_not_the_caller(ckpt, tmp_path, capsys):
    from timbench.util.dirlock import DirLock

    out = tmp_path / "run"
    with DirLock(out, "timbench grid run"):
        assert main(_train_args(ckpt, out)) == 2
    line = _one_line(capsys)
    assert f"in use by another `timbench grid run` (pid {os.getpid()})" in line and "timbench train`" not in line


# 4. Timeouts that cannot be swallowed; non-finite limits and values.

SWALLOWS = """import time
from timbench.remedies import Remedy, finish

class Hangs(Remedy):
    name = 'hangs'
    doc = 'catches the timeout and keeps sleeping'
    def __call__(self, batch):
        while True:
            try:
                time.sleep(3600)
            except BaseException:
                pass

class Returns(Remedy):
    name = 'returns'
    doc = 'catches the timeout and returns as if nothing happened'
    def __call__(self, batch):
        try:
            time.sleep(3600)
        except BaseException:
            pass
        return finish(batch)
"""


def test_a_plugin_that_swallows_the_timeout_is_ended_and_its_run_failed(ckpt, tmp_path):
    (tmp_path / "swallows.py").write_text(SWALLOWS)
    out = tmp_path / "run"
    args = _train_args(ckpt, out) + ["--remedy", f"{tmp_path / 'swallows.py'}:Hangs", "--plugin-timeout", "0.5"]
    p = subprocess.Popen(
        [sys.executable, "-m", "timbench.cli", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        _, err = p.communicate(timeout=120)  # 0.5 s + the 5 s grace, plus imports on a loaded machine
    except subprocess.TimeoutExpired:
        p.kill()
        p.communicate()
        pytest.fail("a plug-in that catches its timeout hung `timbench train`")
    assert p.returncode == 1
    err = err.strip().splitlines()
    assert len(err) == 1 and "remedy hangs: __call__ did not return within 0.5 s" in err[0] and "ended" in err[0]
    from timbench.rl.rundir import read_status

    assert read_status(out)["status"] == "failed" and "PluginTimeout" in read_status(out)["error"]
    assert "PluginTimeout" in (out / "error.txt").read_text()


def test_a_plugin_that_swallows_the_timeout_and_returns_still_fails(ckpt, tmp_path, capsys):
    (tmp_path / "swallows.py").write_text(SWALLOWS)
    out = tmp_path / "run"
    assert (
        main(_train_args(ckpt, out) + ["--remedy", f"{tmp_path / 'swallows.py'}:Returns", "--plugin-timeout", "0.5"])
        == 1
    )
    assert "PluginTimeout: remedy returns: __call__ did not return within 0.5 s" in _one_line(capsys)


HOLDS_GIL = """import ctypes, ctypes.util, os
from timbench.remedies import Remedy, finish

class HoldsGil(Remedy):
    name = 'holdsgil'
    doc = 'from the second step on, deadlocks in native code that keeps the GIL'
    def __call__(self, batch):
        if os.path.exists(STATE):
            # a mutex locked twice through ctypes.PyDLL (which keeps the GIL): a native deadlock that a signal
            # does not end, as it would a libc sleep (EINTR); no Python line of this process runs again
            libc, mutex = ctypes.PyDLL(ctypes.util.find_library('c')), ctypes.create_string_buffer(64)
            libc.pthread_mutex_lock(mutex)
            libc.pthread_mutex_lock(mutex)
        return finish(batch)
"""


def test_a_plugin_holding_the_gil_in_a_native_call_is_killed_and_its_run_failed(ckpt, tmp_path):
    from timbench.remedies.deadline import GRACE_S, KILL_AFTER_S
    from timbench.rl.rundir import read_status

    out = tmp_path / "run"
    (tmp_path / "gil.py").write_text(HOLDS_GIL.replace("STATE", repr(str(out / "checkpoints" / "state.pt"))))
    args = _train_args(ckpt, out) + ["--remedy", f"{tmp_path / 'gil.py'}:HoldsGil", "--plugin-timeout", "0.5"]
    p = subprocess.Popen(
        [sys.executable, "-m", "timbench.cli", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:  # stderr's EOF also means the watchdog process, which shares it, has ended
        _, err = p.communicate(timeout=120)  # 0.5 s + 10 s of grace, plus imports and a step on a loaded machine
    except subprocess.TimeoutExpired:
        p.kill()
        p.communicate()
        pytest.fail("a plug-in holding the GIL in a native call hung `timbench train` past its limit")
    assert p.returncode == -9  # SIGKILL: the process could not run a line of Python to exit otherwise
    err = err.strip().splitlines()
    assert len(err) == 1, err
    assert "PluginTimeout: remedy holdsgil: __call__ did not return within 0.5 s" in err[0]
    assert f"held the interpreter (a native call keeping the GIL) for {GRACE_S + KILL_AFTER_S:g} s more" in err[0]
    st = read_status(out)
    assert st["status"] == "failed" and "held the interpreter" in st["error"]
    assert "PluginTimeout" in (out / "error.txt").read_text()
    # what step 0 wrote before the call is all there: its metrics row, its eval and its checkpoint
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0]
    from timbench.rl.rundir import read_checkpoint

    state = read_checkpoint((out / "checkpoints" / "state.pt").read_bytes(), "state.pt")
    assert state["step"] == 1  # resumable from the end of step 0


@pytest.mark.parametrize("value", ["nan", "inf", "-1"])
def test_a_non_finite_or_negative_cell_timeout_is_a_one_line_error(tmp_path, capsys, value):
    assert main(["grid", "run", str(tmp_path / "g.yaml"), "--out", str(tmp_path / "o"), "--cell-timeout", value]) == 2
    assert "--cell-timeout must be >= 0 seconds and finite" in _one_line(capsys)


@pytest.mark.parametrize("value", ["nan", "inf"])
def test_a_non_finite_plugin_timeout_is_a_one_line_error(ckpt, tmp_path, capsys, value):
    assert main(_train_args(ckpt, tmp_path / "r") + ["--plugin-timeout", value]) == 2
    assert "--plugin-timeout must be >= 0 seconds and finite" in _one_line(capsys)


@pytest.mark.parametrize(
    "args,message",
    [
        (["--temperature", "nan"], "--temperature must be a finite number >= 0"),
        (["--temperature", "inf"], "--temperature must be a finite number >= 0"),
        (["--seed", "-1"], "--seed: -1 is out of range"),
        (["--seed", str(2**64)], "is out of range; valid: an integer 0..4294967295"),
    ],
)
def test_align_refuses_nan_temperatures_and_out_of_range_seeds(capsys, args, message):
    assert main(["align", *args]) == 2
    assert message in _one_line(capsys)


@pytest.mark.parametrize("seed", ["-1", str(10**20)])
def test_a_train_seed_out_of_range_is_a_one_line_error(ckpt, tmp_path, capsys, seed):
    assert main(_train_args(ckpt, tmp_path / "r") + ["--set", f"seed={seed}"]) == 2
    assert "config key 'seed'" in _one_line(capsys) and not (tmp_path / "r" / "metrics.jsonl").exists()


def test_yaml_complex_keys_and_malformed_set_values_are_one_line_errors(ckpt, tmp_path, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("? [a, b]\n: 1\n")
    assert main(["train", str(cfg), "--out", str(tmp_path / "r")]) == 2
    assert "c.yaml: line 1: a mapping key is a list" in _one_line(capsys)
    assert main(_train_args(ckpt, tmp_path / "r") + ["--set", "lr=[1,"]) == 2
    line = _one_line(capsys)
    assert "--set lr='[1,': not a YAML value" in line


@pytest.mark.parametrize(
    "doc,message",
    [
        ([], "not a gate.json (a JSON list; "),
        ({}, "not a gate.json (missing identity, probes)"),
        ({"identity": {"suite": "tiny", "suite_version": 3}}, "not a gate.json (missing probes)"),
    ],
)
def test_a_malformed_gate_json_is_a_one_line_error(tmp_path, capsys, doc, message):
    (tmp_path / "bad.json").write_text(json.dumps(doc))
    assert main(["gate", "check", str(tmp_path / "bad.json"), str(tmp_path / "bad.json")]) == 2
    assert message in _one_line(capsys)


def test_gate_check_refuses_an_empty_or_partial_candidate():
    from timbench.gate.check import check

    ident = {"suite": "tiny", "suite_version": 3}
    probes = [{"model": "m", "probe": p, "passed": True, "numbers": {}} for p in ("determinism", "batch")]
    base = {"identity": ident, "probes": probes}
    assert check(base, {"identity": ident, "probes": []})[0] == 2
    code, found = check(base, {"identity": ident, "probes": probes[:1]})
    assert code == 2 and "lacks 1 of the baseline's 2 probe results (m batch)" in found[0]["line"]
    assert check(base, base) == (0, [])


PLUGIN_RAISES = """from timbench.remedies import Remedy

class Exits(Remedy):
    name = 'exits'
    doc = 'raises SystemExit(0)'
    def __call__(self, batch):
        raise SystemExit(0)

class Oserr(Remedy):
    name = 'oserr'
    doc = 'raises an OSError'
    def __call__(self, batch):
        open('/nonexistent/x')

class Keyerr(Remedy):
    name = 'keyerr'
    doc = 'raises a KeyError'
    def __call__(self, batch):
        return {}['missing']
"""


@pytest.mark.parametrize(
    "cls,raised", [("Exits", "SystemExit"), ("Oserr", "FileNotFoundError"), ("Keyerr", "KeyError: 'missing'")]
)
def test_a_plugins_own_exception_fails_the_run_with_error_txt(ckpt, tmp_path, capsys, cls, raised):
    (tmp_path / "raises.py").write_text(PLUGIN_RAISES)
    out = tmp_path / "run"
    rc = main(_train_args(ckpt, out) + ["--remedy", f"{tmp_path / 'raises.py'}:{cls}"])
    assert rc == 1
    line = _one_line(capsys)
    assert f"remedy {cls.lower()}: __call__ raised {raised}" in line and "the plug-in's error" in line
    from timbench.rl.rundir import read_status

    assert read_status(out)["status"] == "failed" and "Traceback" in (out / "error.txt").read_text()


def test_a_cells_json_cell_without_an_id_names_what_is_missing(tmp_path, capsys):
    (tmp_path / "cells.json").write_text(json.dumps({"cells": [{"axes": {}}]}))
    assert main(["grid", "verify", str(tmp_path)]) == 2
    assert "cells[0] has no 'id'" in _one_line(capsys)


# 6. Processes and files.


def test_a_local_ray_instance_keeps_its_files_in_a_private_dir(monkeypatch):
    from timbench.runners import ray_runner

    class FakeRay:
        kw = None

        def is_initialized(self):
            return False

        def init(self, **kw):
            FakeRay.kw = kw

    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")  # no token set up for a Ray that never starts
    before = os.environ.get(ray_runner.SINGLE_NODE)
    temp = ray_runner._connect(FakeRay(), "local", 2)
    try:
        assert FakeRay.kw["_temp_dir"] == temp and FakeRay.kw["address"] == "local"
        assert os.stat(temp).st_mode & 0o777 == 0o700 and os.stat(temp).st_uid == os.getuid()
        # a single-node instance on the loopback address, not on the host's
        assert FakeRay.kw["_node_ip_address"] == "127.0.0.1" and os.environ[ray_runner.SINGLE_NODE] == "0"
    finally:
        ray_runner.release(temp)  # its reaper finds no process to end and removes the dir
    assert not os.path.exists(temp) and os.environ.get(ray_runner.SINGLE_NODE) == before


# 7. Integrity bound to content.


def _done_cell(out, cid="c1", status="finished", rows=4, steps=4):
    """A done cell as a run leaves it (logs, summary, cell.json), not yet stamped, in a cells.json of `steps`."""
    d = out / "runs" / cid
    d.mkdir(parents=True)
    (out / "cells.json").write_text(json.dumps({"grid": "g", "cells": [{"id": cid, "config": {"steps": steps}}]}))
    (d / "metrics.jsonl").write_text("".join(f'{{"step": {i}}}\n' for i in range(rows)))
    (d / "eval.jsonl").write_text('{"step": 0}\n')
    (d / "timing.jsonl").write_text('{"step": 0}\n')
    (d / "status.json").write_text(json.dumps({"status": status, "error": None}))
    (d / "summary.json").write_text(json.dumps({"status": status, "steps_done": rows}))
    (d / "cell.json").write_text(json.dumps({"status": "done", "error": None, "wall_s": 1.0, "attempts": 1}))
    return d


def test_a_failed_run_flipped_to_done_in_cell_json_is_caught(tmp_path, capsys):
    from timbench.util.manifest import stamp_run

    stamp_run(_done_cell(tmp_path, status="failed"))
    assert main(["grid", "verify", str(tmp_path)]) == 1
    assert "not 'finished', though cell.json says done" in capsys.readouterr().out


def test_a_manifest_listing_no_files_vouches_for_nothing(tmp_path, capsys):
    d = _done_cell(tmp_path)
    (d / "manifest.json").write_text(json.dumps({"manifest": 1, "files": {}}))
    assert main(["grid", "verify", str(tmp_path)]) == 1
    assert "lists no metrics.jsonl, eval.jsonl, summary.json" in capsys.readouterr().out


def test_adopt_refuses_a_cut_short_or_failed_run_and_says_so(tmp_path, capsys):
    d = _done_cell(tmp_path / "short", rows=3)
    assert main(["grid", "verify", str(tmp_path / "short"), "--adopt"]) == 1
    assert "not adopted" in capsys.readouterr().out and not (d / "manifest.json").exists()
    d = _done_cell(tmp_path / "failed", status="failed")
    assert main(["grid", "verify", str(tmp_path / "failed"), "--adopt"]) == 1
    assert "not adopted" in capsys.readouterr().out and not (d / "manifest.json").exists()
    d = _done_cell(tmp_path / "whole")
    assert main(["grid", "verify", str(tmp_path / "whole"), "--adopt"]) == 0 and (d / "manifest.json").is_file()


def test_a_report_is_not_written_into_another_grids_dir(tmp_path, capsys):
    from gridfab import standard_grid

    a, b = standard_grid(tmp_path / "a"), standard_grid(tmp_path / "b")
    before = sorted(p.name for p in b.iterdir())
    assert main(["grid", "report", str(a), "--out", str(b)]) == 2
    assert "another grid's result dir" in _one_line(capsys) and sorted(p.name for p in b.iterdir()) == before
