"""bench/same_metrics.py: a rerun that logs more metrics but trains the same bits passes; any changed value fails."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from gridfab import cell_decl, write_cell, write_cells_json

from timbench.util.manifest import stamp_run

pytestmark = pytest.mark.unit  # builds no model (make test-unit)

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("same_metrics", ROOT / "bench" / "same_metrics.py")
same_metrics = importlib.util.module_from_spec(spec)
spec.loader.exec_module(same_metrics)


def grid(root: Path, extra=None, acc=0.7) -> Path:
    write_cell(root, "baseline", "none", final_acc=0.8, delta=0.0, extra=extra)
    write_cell(root, "noise-1", "none", final_acc=acc, delta=0.1, extra=extra)
    write_cells_json(root, [cell_decl("baseline", "none"), cell_decl("noise-1", "none")])
    return root


def test_more_keys_same_bits_pass(tmp_path, capsys):
    old = grid(tmp_path / "old")
    new = grid(tmp_path / "new", extra={"tim/tv_mean": 0.25})
    assert same_metrics.main([str(old), str(new)]) == 0
    out = capsys.readouterr().out
    assert "2/2 shared cells trained the same bits" in out and "1 more keys (tim/tv_mean)" in out


def test_changed_metric_or_eval_fails(tmp_path, capsys):
    old = grid(tmp_path / "old")
    new = grid(tmp_path / "new", extra={"tim/tv_mean": 0.25})
    path = new / "runs" / "add-4d-v1.tiny-dense.noise-1.none.recompute.grpo.s0" / "metrics.jsonl"
    rows = [json.loads(l) for l in path.read_text().splitlines()]
    rows[3]["actor/grad_norm"] = rows[3]["actor/grad_norm"] + 2**-40  # one ulp-scale change in one step
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    stamp_run(path.parent)  # a consistent run dir, not a corrupt one: the check must catch the value itself
    assert same_metrics.main([str(old), str(new)]) == 1
    assert "step 3: actor/grad_norm" in capsys.readouterr().out
    other = grid(tmp_path / "other", acc=0.71)  # the final eval differs
    assert same_metrics.main([str(old), str(other)]) == 1
    assert "eval.jsonl differs" in capsys.readouterr().out


def test_no_shared_cell_fails(tmp_path):
    old = grid(tmp_path / "old")
    empty = tmp_path / "empty"
    write_cells_json(empty, [])
    assert same_metrics.main([str(old), str(empty)]) == 1
