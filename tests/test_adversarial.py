"""Hostile inputs (issue 40): crafted checkpoints and results dirs, paths from data, reruns over finished runs,
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
        a for o in (f"model={ckpt}", f"steps={steps}", "prompts_per_step=4", "group_size=4", "mini_batches=2",
                    "eval_every=2", "eval_n=16", "checkpoint_every=1") for a in ("--set", o)]


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
    torch.save({"step": 3, "extra": {}, "lanes": [{"model": {"w": torch.ones(2)}, "opt": {"betas": (0.9, 0.99)}}]},
               buf)
    assert checkpoint_step(buf.getvalue()) == 3  # a real checkpoint's plain values still load


def test_a_results_dir_grid_naming_a_plugin_file_needs_allow_plugins(tmp_path, capsys):
    import yaml
    marker = tmp_path / "pwned"
    (tmp_path / "evil.py").write_text(f"import pathlib\npathlib.Path({str(marker)!r}).touch()\n"
                                      "raise SystemExit('imported')\n")
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
    cell = {"id": cid, "axes": {"remedy": "none", "mode": "recompute", "condition": "baseline"},
            "condition": {}, "reference": None, "config": {}}
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
