"""Merging grid result dirs: union of cells, byte-identical duplicates only, one fingerprint, a reportable result."""

import json

import pytest
from gridfab import cell_decl, cell_id, write_cell, write_cells_json

from timbench.cli import main
from timbench.grid.merge import merge
from timbench.report.leaderboard import remedy_ranking
from timbench.report.results import load_results
from timbench.report.summary import summarize

pytestmark = pytest.mark.unit  # builds no model (make test-unit)


def part(root, cells, name="fab"):
    """A result dir with the given (cond, remedy, seed, final_acc) cells, all done."""
    decls = []
    for cond, remedy, seed, acc in cells:
        write_cell(root, cond, remedy, final_acc=acc, delta=0.0 if cond == "baseline" else 0.9, seed=seed)
        decls.append(cell_decl(cond, remedy, seed=seed))
    write_cells_json(root, decls, name=name)
    return root


BASE = [("baseline", "none", s, 0.8) for s in range(3)] + [("noise-3", "none", s, 0.5) for s in range(3)]
NEW = [("baseline", "none", s, 0.8) for s in range(3)] + [("noise-3", "tis_token", s, 0.7) for s in range(3)]


def test_merge_is_the_union_and_reports_every_remedy(tmp_path):
    a, b = part(tmp_path / "a", BASE), part(tmp_path / "b", NEW)
    info = merge([a, b], tmp_path / "m")
    assert info == {"cells": 9, "done": 9, "copied": 9, "fingerprint": info["fingerprint"]}
    grid = load_results(tmp_path / "m")
    assert len(grid.cells) == 9 and all(c.status == "done" for c in grid.cells)
    ranked = remedy_ranking(summarize(grid))
    assert [e["remedy"] for e in ranked] == ["tis_token", "none"] and ranked[0]["seeds"] == 3
    # the sources are untouched, and the merge is reportable
    assert len(json.loads((a / "cells.json").read_text())["cells"]) == 6
    assert main(["grid", "report", str(tmp_path / "m")]) == 0
    assert "tis_token" in (tmp_path / "m" / "leaderboard.md").read_text()


def test_merging_into_an_existing_merge_keeps_what_it_holds(tmp_path):
    a, b = part(tmp_path / "a", BASE), part(tmp_path / "b", NEW)
    merge([a], tmp_path / "m")
    assert merge([b], tmp_path / "m")["cells"] == 9  # m itself is a source
    assert merge([a, b], tmp_path / "m")["copied"] == 0  # idempotent: m already holds every finished run
    assert len(load_results(tmp_path / "m").cells) == 9


def test_different_results_for_one_cell_are_refused(tmp_path):
    a = part(tmp_path / "a", BASE)
    b = part(tmp_path / "b", [("baseline", "none", 0, 0.81)])  # same cell, another accuracy
    with pytest.raises(
        ValueError,
        match=r"cell add-4d-v1.tiny-dense.baseline.none.recompute.grpo.s0 finished in "
        r"both .* with different results \(eval.jsonl differs\)",
    ) as e:
        merge([a, b], tmp_path / "m")
    assert "\n" not in str(e.value) and not (tmp_path / "m").exists()  # refused before anything is written


def test_wall_times_do_not_make_a_duplicate_differ(tmp_path):
    a = part(tmp_path / "a", BASE)
    b = part(tmp_path / "b", [("baseline", "none", 0, 0.8)])
    cell = b / "runs" / cell_id("baseline", "none") / "cell.json"
    cell.write_text(cell.read_text().replace('"wall_s": 1.5', '"wall_s": 9.25'))
    assert merge([a, b], tmp_path / "m")["cells"] == 6


def test_a_done_copy_wins_over_a_failed_or_pending_one(tmp_path):
    a = tmp_path / "a"
    write_cell(a, "baseline", "none", final_acc=0.8, delta=0.0, status="failed", failed_nan_at=3)
    write_cells_json(a, [cell_decl("baseline", "none"), cell_decl("noise-3", "none")])  # noise-3 pending
    b = part(tmp_path / "b", [("baseline", "none", 0, 0.8), ("noise-3", "none", 0, 0.5)])
    merge([a, b], tmp_path / "m")
    assert {c.id: c.status for c in load_results(tmp_path / "m").cells} == {
        cell_id("baseline", "none"): "done",
        cell_id("noise-3", "none"): "done",
    }


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda d: d.update(grid="other"), "different grid fingerprint \\(grid 'fab' vs 'other'\\)"),
        (lambda d: d.update(collapse={"alpha": 0.3}), "collapse"),
        (lambda d: [c["config"].update(steps=99) for c in d["cells"]], "config key 'steps' \\(30 vs 99\\)"),
        (
            lambda d: [
                c["condition"].update(engine="kernels=exact,noise=gaussian:4.0")
                for c in d["cells"]
                if c["condition"]["name"] == "noise-3"
            ],
            "condition 'noise-3'",
        ),
    ],
)
def test_another_grid_is_refused_naming_what_differs(tmp_path, change, message):
    a, b = part(tmp_path / "a", BASE), part(tmp_path / "b", NEW)
    doc = json.loads((b / "cells.json").read_text())
    change(doc)
    (b / "cells.json").write_text(json.dumps(doc))
    with pytest.raises(ValueError, match=message) as e:
        merge([a, b], tmp_path / "m")
    assert "\n" not in str(e.value)


def test_cli_merge_and_errors(tmp_path, capsys):
    a, b = part(tmp_path / "a", BASE), part(tmp_path / "b", NEW)
    assert main(["grid", "merge", str(a), str(b), "--out", str(tmp_path / "m")]) == 0
    assert "9 cells (9 done, 9 run dirs copied)" in capsys.readouterr().out
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "x").write_text("x")
    assert main(["grid", "merge", str(a), "--out", str(tmp_path / "junk")]) == 2
    assert "is not a grid result directory" in capsys.readouterr().err
    assert main(["grid", "merge", str(tmp_path / "nope"), "--out", str(tmp_path / "m2")]) == 2


def test_resume_checkpoints_are_neither_compared_nor_copied(tmp_path):
    a = part(tmp_path / "a", BASE)
    b = part(tmp_path / "b", [("baseline", "none", 0, 0.8)])
    for root, payload in ((a, b"x"), (b, b"y")):
        ck = root / "runs" / cell_id("baseline", "none") / "checkpoints"
        ck.mkdir()
        (ck / "step_1.pt").write_bytes(payload)
    assert merge([a, b], tmp_path / "m")["cells"] == 6
    assert not (tmp_path / "m" / "runs" / cell_id("baseline", "none") / "checkpoints").exists()


def _variant(root, eps, seeds):
    """A part whose `clip` cells carry a remedy variant's own config keys (eps_low / eps_high), as
    bench/grids/paper.yaml's ppo_clip_0.05 does; its `none` cells carry the default None."""
    part(root, [("baseline", "none", s, 0.8) for s in seeds] + [("noise-3", "clip", s, 0.6) for s in seeds])
    doc = json.loads((root / "cells.json").read_text())
    for c in doc["cells"]:
        c["config"].update(
            eps_low=eps if c["axes"]["remedy"] == "clip" else None,
            eps_high=eps if c["axes"]["remedy"] == "clip" else None,
        )
    (root / "cells.json").write_text(json.dumps(doc))
    return root


def test_remedy_variant_keys_merge_per_label_and_a_label_with_two_configs_is_refused(tmp_path):
    a, b = _variant(tmp_path / "a", 0.05, [0, 1]), _variant(tmp_path / "b", 0.05, [2, 3])
    assert merge([a, b], tmp_path / "m")["cells"] == 8  # eps differs between labels, not within one
    c = _variant(tmp_path / "c", 0.1, [4])
    with pytest.raises(
        ValueError,
        match=r"the merged cells: cell .*noise-3.clip.recompute.grpo.s4 differs from "
        r"the other 'clip' cells in config key 'eps_high'",
    ) as e:
        merge([a, c], tmp_path / "m2")
    assert "\n" not in str(e.value) and not (tmp_path / "m2").exists()
    # a shared key that differs is still refused, variants or not
    d = _variant(tmp_path / "d", 0.05, [5])
    doc = json.loads((d / "cells.json").read_text())
    [cell["config"].update(steps=99) for cell in doc["cells"]]
    (d / "cells.json").write_text(json.dumps(doc))
    with pytest.raises(ValueError, match=r"different grid fingerprint \(config key 'steps' \(30 vs 99\)\)"):
        merge([a, d], tmp_path / "m3")
