"""bench/size_ladder_verdict.py: the size x setting interaction across the ladder, on hand-built grid dirs."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from gridfab import cell_decl, cell_id, write_cell, write_cells_json

pytestmark = pytest.mark.unit  # builds no model (make test-unit)

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("size_ladder_verdict", ROOT / "bench" / "size_ladder_verdict.py")
slv = importlib.util.module_from_spec(spec)
spec.loader.exec_module(slv)
DOSE = {"tiny-dense": "noise-1", "small-dense": "noise-3", "medium-dense": "bf16-engine"}
"""One mismatched condition per size, with a different label at each (read by role, as the real grid's are)."""
RS = {"tiny-dense": "tis+rs_k3_0.0125", "small-dense": "tis+rs_k3_0.0125", "medium-dense": "tis+rs_k3_0.0175"}
# (remedy role, mode) -> endpoint offset from the dose's none-in-recompute, per size (tiny, small, medium)
ARMS = {
    ("tis_token", "recompute"): (0.10, 0.10, 0.10),  # the same effect at every size: transfers
    ("ppo_clip_0.05", "recompute"): (0.0, 0.0, 0.0),  # nothing at any size: not tested
    ("rejection", "recompute"): (0.05, 0.05, 0.05),
    ("none", "bypass"): (-0.30, -0.15, 0.0),  # shrinks with size: differs by size
}
NONE_VS_BASE = (-0.2, -0.2, -0.2)


def grid(root: Path, seeds=range(6)) -> Path:
    decls = []
    for k, model in enumerate(slv.SIZES):
        for s in seeds:
            base = 0.6 + 0.01 * (s % 3)
            write_cell(root, "baseline", "none", final_acc=base, delta=0.0, seed=s, model=model)
            decls.append(cell_decl("baseline", "none", seed=s, model=model))
            none = base + NONE_VS_BASE[k] + 0.003 * (s % 2)
            cond = DOSE[model]
            write_cell(root, cond, "none", final_acc=none, delta=0.05, seed=s, model=model)
            decls.append(cell_decl(cond, "none", seed=s, model=model))
            for i, ((role, mode), offsets) in enumerate(ARMS.items()):
                remedy = RS[model] if role == "rejection" else role
                jitter = 0.004 * ((3 * s + 5 * i + k) % 4 - 1.5)  # centred: an effect of 0 is 0 on average
                write_cell(root, cond, remedy, final_acc=none + offsets[k] + jitter, delta=0.05, mode=mode, seed=s,
                           model=model)  # fmt: skip
                d = cell_decl(cond, remedy, mode=mode, seed=s, model=model)
                d["reference"] = cell_id("baseline", "none", "recompute", s, model)
                decls.append(d)
    write_cells_json(root, decls, name="size_ladder")
    return root


def test_interaction_words_follow_the_effects_across_sizes(tmp_path):
    v = slv.verdicts(str(grid(tmp_path)))
    words = {e: o["test"]["word"] for e, o in v["effects"].items()}
    assert words["tis_token - none"] == "transfers"
    assert words["rejection ~70% - none"] == "transfers"
    assert words["none - baseline"] == "transfers"
    assert words["bypass - recompute"] == "differs by size"
    assert words["ppo_clip_0.05 - none"] == "not tested"
    assert "nothing happened" in v["effects"]["ppo_clip_0.05 - none"]["test"]["not_tested"]
    # per-size effects read through the per-size labels (doses and rejection thresholds differ by size)
    assert v["doses"] == DOSE and v["rejection"] == RS
    tis = v["effects"]["tis_token - none"]["per_size"]
    means = [tis[s]["effect"]["mean"] for s in slv.SIZES]  # the endpoint averages a ramp: ~0.83 of the final offset
    assert min(means) > 0.07 and max(means) - min(means) < 0.005
    # the bypass effect rises ~0.25 (of the endpoint) over ~1.0 decade of parameters (tiny 0.60M -> medium 6.06M)
    slope = v["effects"]["bypass - recompute"]["slope_per_decade"]
    assert slope["lo"] > 0.2 and slope["hi"] < 0.4 and slope["p"] < 0.001
    assert v["cells"]["medium-dense"] == {"finished": 36, "planned": 36}


def test_fewer_than_three_seeds_is_not_tested(tmp_path, capsys):
    root = grid(tmp_path, seeds=range(2))
    assert slv.main([str(root)]) == 0
    v = json.loads((root / "verdict.json").read_text())
    assert {o["test"]["word"] for o in v["effects"].values()} == {"not tested"}
    assert all("fewer than 3 paired seeds" in o["test"]["not_tested"] for o in v["effects"].values())
    md = (root / "verdict.md").read_text()
    assert "Cells finished: 36 of 36" in md and "| bypass - recompute | **not tested** |" in md


def test_bad_input_is_one_line_exit_2(tmp_path, capsys):
    assert slv.main([str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and "\n" not in err
    root = grid(tmp_path / "g", seeds=range(1))
    extra = cell_decl("noise-3", "none", seed=0, model="tiny-dense")  # a second dose on one size
    cells = json.loads((root / "cells.json").read_text())
    cells["cells"].append(extra)
    write_cell(root, "noise-3", "none", final_acc=0.5, delta=0.05, seed=0, model="tiny-dense")
    (root / "cells.json").write_text(json.dumps(cells))
    assert slv.main([str(root)]) == 2
    err = capsys.readouterr().err.strip()
    assert "tiny-dense has 2 mismatched conditions" in err and "\n" not in err
    assert not (root / "verdict.json").exists()


def test_trend_matches_a_hand_computed_line():
    t = slv.trend([(0.0, 1.0), (1.0, 3.0), (2.0, 5.0), (3.0, 7.5)])
    assert abs(t["slope"] - 2.15) < 1e-12 and t["lo"] < 2.15 < t["hi"] and t["n"] == 4
    assert slv.trend([(1.0, 1.0), (1.0, 2.0), (1.0, 3.0)])["slope"] is None
