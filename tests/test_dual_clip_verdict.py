"""bench/dual_clip_verdict.py: the dual-clip grid's verdicts by the repo's rules, on hand-built result dirs."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from gridfab import cell_decl, cell_id, write_cell, write_cells_json

pytestmark = pytest.mark.unit  # builds no model (make test-unit)

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("dual_clip_verdict", ROOT / "bench" / "dual_clip_verdict.py")
dual_clip_verdict = importlib.util.module_from_spec(spec)
spec.loader.exec_module(dual_clip_verdict)
SEEDS = range(5)


def grid(root: Path, dual_collapses: bool) -> Path:
    decls = []
    for s in SEEDS:
        write_cell(root, "baseline", "none", final_acc=0.6, delta=0.0, seed=s)
        decls.append(cell_decl("baseline", "none", seed=s))
        for remedy, collapse in (("none", True), ("dualclip_3", dual_collapses)):
            write_cell(
                root,
                "noise-1",
                remedy,
                final_acc=0.0 if collapse else 0.5 + 0.01 * s,
                delta=0.1,
                collapse=collapse,
                mode="bypass",
                seed=s,
            )
            d = cell_decl("noise-1", remedy, mode="bypass", seed=s)
            d["reference"] = cell_id("baseline", "none", "recompute", s)  # bypass cells read the recompute baseline
            decls.append(d)
    write_cells_json(root, decls, name="dual_clip")
    return root


def test_a_dual_clip_that_prevents_every_collapse_is_reproduced(tmp_path, capsys):
    root = grid(tmp_path / "g", dual_collapses=False)
    assert dual_clip_verdict.main([str(root)]) == 0
    v = json.loads((root / "verdict.json").read_text())
    rate = v["families"]["collapse rate (primary)"][0]
    assert v["conditions"]["noise-1"]["collapsed"] == {"dualclip_3": [0, 5], "none": [5, 5]}
    assert rate["word"] == "reproduced" and abs(rate["p"] - 2 / 252) < 1e-12  # Fisher, 5/5 vs 0/5, two-sided
    assert v["families"]["endpoint (secondary)"][0]["word"] == "reproduced"
    assert "**reproduced**: noise-1: none collapses more than dual-clip" in capsys.readouterr().out


def test_both_arms_collapsing_every_seed_is_not_tested_and_a_wrong_dir_is_one_line(tmp_path, capsys):
    root = grid(tmp_path / "g", dual_collapses=True)
    assert dual_clip_verdict.main([str(root)]) == 0
    v = json.loads((root / "verdict.json").read_text())
    rate = v["families"]["collapse rate (primary)"][0]
    assert rate["word"] == "not tested" and "both arms at every seed" in rate["not_tested"]
    assert v["families"]["endpoint (secondary)"][0]["word"] == "not reproduced"  # identical arms: 0 difference
    capsys.readouterr()
    assert dual_clip_verdict.main([str(tmp_path / "nothing")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1
