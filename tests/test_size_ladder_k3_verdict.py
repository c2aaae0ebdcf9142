"""bench/size_ladder_k3_verdict.py: the K3 control's three interactions and their reading, on hand-built grids."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
from gridfab import cell_decl, write_cell, write_cells_json

pytestmark = pytest.mark.unit  # builds no model (make test-unit)

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
spec = importlib.util.spec_from_file_location("size_ladder_k3_verdict", ROOT / "bench" / "size_ladder_k3_verdict.py")
k3v = importlib.util.module_from_spec(spec)
spec.loader.exec_module(k3v)
DOSE = {"tiny-dense": "noise-1", "small-dense": "noise-1", "medium-dense": "noise-3"}
"""The ladder's one dose per rung (labels differ by rung, as the real grid's do)."""
LADDER_BYPASS = {"tiny-dense": -0.10, "small-dense": -0.10, "medium-dense": -0.30}
"""bypass - recompute's final-accuracy offset per rung: medium-dense costs more (the ladder's finding, enlarged)."""


def _pair(root: Path, model: str, cond: str, bypass: float, seeds, decls: list, baseline: bool) -> None:
    for s in seeds:
        acc = 0.7 + 0.01 * (s % 3)
        if baseline:
            write_cell(root, "baseline", "none", final_acc=acc, delta=0.0, seed=s, model=model)
            decls.append(cell_decl("baseline", "none", seed=s, model=model))
        jitter = 0.004 * ((3 * s + len(model)) % 4 - 1.5)
        for mode, offset in (("recompute", 0.0), ("bypass", bypass + jitter)):
            write_cell(root, cond, "none", final_acc=acc + offset, delta=0.05, mode=mode, seed=s, model=model)
            decls.append(cell_decl(cond, "none", mode=mode, seed=s, model=model))


def ladder(root: Path) -> str:
    decls: list = []
    for model, cond in DOSE.items():
        _pair(root, model, cond, LADDER_BYPASS[model], range(6), decls, baseline=True)
    write_cells_json(root, decls, name="size_ladder")
    return str(root)


def control(root: Path, bypass: float, seeds=range(6)) -> str:
    """The K3 grid: medium-dense under another dose, recompute and bypass only (its baseline is the ladder's)."""
    decls: list = []
    _pair(root, "medium-dense", "noise-1", bypass, seeds, decls, baseline=False)
    write_cells_json(root, decls, name="size_ladder_k3")
    return str(root)


def words(v: dict) -> list[str]:
    return [t["word"] for t in v["tests"]]


def test_a_control_cost_like_the_small_rungs_reads_as_the_tail(tmp_path):
    v = k3v.verdicts(ladder(tmp_path / "ladder"), control(tmp_path / "k3", LADDER_BYPASS["tiny-dense"]))
    assert words(v) == ["transfers", "transfers", "differs by size"]
    assert v["reading"] == "the tail"
    assert v["doses"]["control"] == "noise-1" and v["doses"]["medium-dense"] == "noise-3"
    assert v["effects"]["control"]["seeds"] == list(range(6))
    assert v["cells"] == {"finished": 12, "planned": 12}


def test_a_control_cost_like_the_ladders_medium_rung_reads_as_the_size(tmp_path):
    v = k3v.verdicts(ladder(tmp_path / "ladder"), control(tmp_path / "k3", LADDER_BYPASS["medium-dense"]))
    assert words(v) == ["differs by size", "differs by size", "transfers"]
    assert v["reading"] == "the size"


def test_two_seeds_decide_nothing_and_the_page_says_so(tmp_path, capsys):
    lad, ctl = ladder(tmp_path / "ladder"), control(tmp_path / "k3", -0.1, seeds=range(2))
    assert k3v.main([lad, ctl]) == 0
    v = json.loads((Path(ctl) / "verdict.json").read_text())
    assert set(words(v)) == {"not tested"} and v["reading"] == "undecided"
    assert all("fewer than 3 paired seeds" in t["not_tested"] for t in v["tests"])
    md = (Path(ctl) / "verdict.md").read_text()
    assert "**Reading: undecided**" in md and "Control cells finished: 4 of 4." in md


def test_a_control_dir_without_medium_dense_is_a_one_line_error(tmp_path, capsys):
    lad = ladder(tmp_path / "ladder")
    assert k3v.main([lad, str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "valid: a result dir of bench/grids/size_ladder_k3.yaml" in err
    assert not (tmp_path / "missing").exists()  # nothing written for a bad input
