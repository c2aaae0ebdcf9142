"""A plug-in remedy is known by its `name` and a hash of its file, never by its path (cell ids, run
dirs, resume), built-in ids are unchanged, and a plug-in's own `extra` metrics reach summary.csv."""

import json
import shutil
from pathlib import Path

import pytest
from plugin_text import HALVE, HEADER

from timbench.grid.layout import prepare
from timbench.grid.spec import expand, parse_grid
from timbench.metrics.schema import is_known
from timbench.remedies.identity import comparable_remedy, content_hash, is_file_spec, other_version, remedy_identity
from timbench.report.collapse import rule_from_dict
from timbench.report.results import CellRun
from timbench.report.summary import COLUMNS, summarize_cell, summary_csv
from timbench.rl.rundir import RunDir
from timbench.submit.extras import markdown_lines, plugin_metrics

pytestmark = pytest.mark.unit  # builds no model (make test-unit)

PLUGIN = (
    HEADER
    + HALVE
    + """
class Nameless(Remedy):
    doc = "no name"
    def __call__(self, batch):
        return finish(batch)
"""
)


def _plugin(d: Path, text: str = PLUGIN) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    (d / "plug.py").write_text(text)
    return d / "plug.py"


def _grid(remedies: list[str]):
    return parse_grid(
        {"name": "g", "base": {"steps": 1}, "axes": {"condition": ["baseline", "noise-g2"], "remedy": remedies}}, "g"
    )


def test_a_plugin_is_name_and_content_hash_wherever_its_file_lies(tmp_path):
    a, b = _plugin(tmp_path / "a"), _plugin(tmp_path / "elsewhere" / "b")
    ida = remedy_identity(f"{a}:Halve")
    assert ida == f"halve@{content_hash(a)}" and len(content_hash(a)) == 8
    assert remedy_identity(f"{b}:Halve") == ida  # same bytes, another directory: the same remedy
    assert remedy_identity(f"{a}:Nameless") == f"Nameless@{content_hash(a)}"  # no `name`: the class's name
    c = _plugin(tmp_path / "c", PLUGIN + "\n# edited\n")
    assert remedy_identity(f"{c}:Halve") != ida  # other bytes: another remedy
    for spec in ("tis_token", "verl:decoupled_geo_rs", "trl:sequence_mask", "pkg.mod:Cls"):
        assert remedy_identity(spec) == spec and not is_file_spec(spec)
    assert comparable_remedy(f"{a}:Halve") == comparable_remedy(f"{b.parent}/plug.py:Halve") == "plug.py:Halve"
    with pytest.raises(FileNotFoundError, match="does not exist"):
        remedy_identity(f"{tmp_path}/none.py:Halve")
    assert other_version("halve@aaaa", {"none", "halve@aaaa", "halver@cccc", "halve@bbbb"}) == "halve@bbbb"
    assert other_version("halve@aaaa", {"halve@aaaa", "none"}) is None and other_version("none", {"halve@b"}) is None


def test_cell_ids_hold_the_identity_and_no_path_and_builtin_ids_are_unchanged(tmp_path):
    f = _plugin(tmp_path / "deep" / "dir")
    cells = expand(_grid(["none", "tis_token", f"{f}:Halve"]))
    ids = [c.id for c in cells]
    assert "add-4d-v1.tiny-dense.noise-g2.tis_token.recompute.grpo.s0" in ids
    assert "add-4d-v1.tiny-dense.noise-g2.none.recompute.grpo.s0" in ids
    mine = [c for c in cells if c.axes["remedy"].startswith("halve@")]
    assert mine and all("deep" not in c.id and "tmp" not in c.id for c in mine)
    assert {c.axes["remedy"] for c in mine} == {f"halve@{content_hash(f)}"}
    assert all(c.config["remedy"] == f"{f}:Halve" for c in mine)  # the path still loads the code
    assert mine[0].id == f"add-4d-v1.tiny-dense.baseline.halve-{content_hash(f)}.recompute.grpo.s0"


def test_committed_track_cell_ids_are_byte_identical():
    from timbench.submit.track import load_track

    track = load_track("quick")
    committed = Path(__file__).resolve().parents[1] / "results" / "tracks" / "quick" / "cells.json"
    if not committed.is_file():
        pytest.skip("no committed quick track results in this checkout")
    doc = json.loads(committed.read_text())
    assert [c.to_dict() for c in expand(track.spec(track.remedies))] == doc["cells"]


def test_a_grid_rerun_with_the_file_moved_finds_the_same_cells(tmp_path):
    f = _plugin(tmp_path / "a")
    grid = _grid(["none", f"{f}:Halve"])
    cells = expand(grid)
    prepare(tmp_path / "out", grid, cells)
    moved = tmp_path / "b" / "plug.py"
    moved.parent.mkdir()
    shutil.move(f, moved)
    grid2 = _grid(["none", f"{moved}:Halve"])
    cells2 = expand(grid2)
    assert [c.id for c in cells2] == [c.id for c in cells]
    prepare(tmp_path / "out", grid2, cells2)  # no "written by a different grid"
    doc = json.loads((tmp_path / "out" / "cells.json").read_text())
    assert {c["config"]["remedy"] for c in doc["cells"]} == {"none", f"{moved}:Halve"}  # loads from where it is
    moved.write_text(PLUGIN + "\n# edited\n")  # other bytes: other cells
    assert [c.id for c in expand(_grid(["none", f"{moved}:Halve"]))] != [c.id for c in cells]


def test_a_run_resumes_with_the_file_moved_and_refuses_another_remedy(tmp_path):
    run = tmp_path / "run"
    RunDir(run, {"remedy": "/x/a/plug.py:Halve", "steps": 2})
    (run / "checkpoints").mkdir()
    (run / "checkpoints" / "state.pt").write_bytes(b"x")
    RunDir(run, {"remedy": "/y/b/plug.py:Halve", "steps": 2})  # moved: resumes
    with pytest.raises(ValueError, match="different config.yaml"):
        RunDir(run, {"remedy": "/y/b/plug.py:Other", "steps": 2})
    with pytest.raises(ValueError, match="different config.yaml"):
        RunDir(run, {"remedy": "/y/b/plug.py:Halve", "steps": 3})


def _cell(metrics, remedy="halve@12345678", condition="noise-g2"):
    return CellRun(
        f"c.{condition}.{metrics[0].get('seed', 0)}",
        {"condition": condition, "remedy": remedy, "mode": "recompute", "seed": 0},
        {"name": condition, "kind": "noise", "engine": "noise=gaussian:2.0"},
        "ref",
        {},
        status="done",
        metrics=metrics,
    )


def test_a_plugins_extra_metrics_are_summarised_and_builtin_columns_stay_fixed():
    steps = [
        {"step": 1, "critic/rewards/mean": 0.5, "rollout_corr/k3_kl": 0.1, "halve/scale": 0.5, "halve/kept": 1.0},
        {"step": 2, "critic/rewards/mean": 0.5, "rollout_corr/k3_kl": 0.3, "halve/scale": 0.5, "halve/kept": 0.0},
    ]
    row = summarize_cell(_cell(steps), rule_from_dict({}))
    assert row["remedy_extra/halve/scale"] == 0.5 and row["remedy_extra/halve/kept"] == 0.5
    assert abs(row["mean/rollout_corr/k3_kl"] - 0.2) < 1e-12
    assert not any(k.startswith("remedy_extra/rollout_corr") for k in row)  # schema keys are not extras
    assert is_known("remedy_extra/halve/scale") and not is_known("remedy_extra/")
    header = summary_csv([row]).splitlines()[0].split(",")
    assert header[: len(COLUMNS)] == list(COLUMNS) and header[len(COLUMNS) :] == [
        "remedy_extra/halve/kept",
        "remedy_extra/halve/scale",
    ]
    builtin = summarize_cell(_cell([{"step": 1, "critic/rewards/mean": 0.5}], remedy="tis_token"), rule_from_dict({}))
    assert summary_csv([builtin]).splitlines()[0].split(",") == list(COLUMNS)


def test_the_submission_shows_a_plugins_extra_metrics_per_setting():
    rows = [
        {
            "remedy": "halve@1",
            "kind": "noise",
            "status": "done",
            "condition": c,
            "mode": "recompute",
            "remedy_extra/halve/scale": v,
        }
        for c, v in (("noise-g2", 0.5), ("noise-g2", 0.7), ("production", 1.0))
    ]
    rows.append({"remedy": "none", "kind": "noise", "status": "done", "condition": "noise-g2", "mode": "recompute"})
    m = plugin_metrics(rows, "halve@1")
    assert m == {
        "halve/scale": {
            "mean": pytest.approx(2.2 / 3),
            "cells": 3,
            "by_setting": {"noise-g2/recompute": pytest.approx(0.6), "production/recompute": 1.0},
        }
    }
    text = "\n".join(markdown_lines(m))
    assert "`halve/scale`: 0.7333 over 3 cells (noise-g2/recompute 0.6; production/recompute 1)" in text
    assert plugin_metrics(rows, "none") == {} and markdown_lines({}) == []
