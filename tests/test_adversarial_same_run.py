"""Hostile inputs: the same run given twice counts once. Every command that pools result directories refuses a
directory named twice (however it is spelled) in one line, and runs that two grids hold bit for bit count once
where runs are pooled: early-warning's runs, the claims pooled over grids, the risk map's settings, a merged
grid's cells (docs/reliability.md)."""

import json
import os
import re
import shutil

import pytest
from gridfab import standard_grid

from timbench.cli import main

pytestmark = pytest.mark.unit


@pytest.fixture
def grids(tmp_path):
    """Grid a (gridfab's standard grid) and b, a copy of it: another directory holding the same runs."""
    a = standard_grid(tmp_path / "a")
    b = tmp_path / "b"
    shutil.copytree(a, b)
    return a, b


def _release(d):
    d.mkdir()
    (d / "error.txt").write_text("pip install failed\n")
    return d


def _commands(a, out):
    """Each pooling command with grid a named twice (as `a` and `a/`), or a release dir named twice."""
    rel = _release(a.parent / "rel")
    return {
        "claims": ["claims", str(a), f"{a}/", "--out", str(out)],
        "early-warning": ["early-warning", str(a), f"{a}/", "--out", str(out)],
        "proxy-fidelity": ["proxy-fidelity", str(a), f"{a}/", "--out", str(out)],
        "grid merge": ["grid", "merge", str(a), f"{a}/", "--out", str(out)],
        "gate matrix": ["gate", "matrix", str(rel), f"{rel}/", "--out", str(out)],
    }


@pytest.mark.parametrize("command", ["claims", "early-warning", "proxy-fidelity", "grid merge", "gate matrix"])
def test_a_directory_named_twice_is_refused_in_one_line(grids, tmp_path, capsys, command):
    out = tmp_path / "out"
    assert main(_commands(grids[0], out)[command]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert "given twice" in err[0] and "counts once" in err[0]
    assert not out.exists()


def test_a_symlink_to_a_directory_already_given_is_the_same_directory(grids, tmp_path, capsys):
    a, _ = grids
    (tmp_path / "link").symlink_to(a)
    assert main(["early-warning", str(a), str(tmp_path / "link"), "--out", str(tmp_path / "out")]) == 2
    assert f"given twice (as {a} and {tmp_path / 'link'})" in capsys.readouterr().err


def test_early_warning_counts_a_run_two_grids_hold_once(grids):
    from timbench.studies.early_warning import early_warning

    a, b = grids
    one, both = early_warning([a]), early_warning([a, b])
    assert both["runs"] == one["runs"] > 0 and both["collapsed"] == one["collapsed"]
    assert both["table"] == one["table"] and both["kinds"] == one["kinds"]


def test_claims_count_a_run_two_grids_hold_once(grids, tmp_path):
    from timbench.studies.claims import write_claims

    a, b = grids
    write_claims([a], tmp_path / "one")
    write_claims([a, b], tmp_path / "both")
    one, both = (json.loads((tmp_path / o / "claims.json").read_text())["claims"] for o in ("one", "both"))
    # remedy_gain names the other grid holding the same runs; everything else, the counts included, is as for a
    noted = re.compile(r" \(these runs, or a subset of them, also in: [^)]*\)")
    for c1, c2 in zip(one, both, strict=True):
        for s1, s2 in zip(c1["subclaims"], c2["subclaims"], strict=True):
            assert s1 == {**s2, "numbers": noted.sub("", s2["numbers"])}, c1["claim"]


def test_the_risk_map_counts_a_setting_whose_runs_another_grid_holds_once():
    from test_risk import _row

    from timbench.studies.risk import units

    big = [_row("fp8", 0.01 * (1 + s), False, seed=s) for s in range(4)]
    small = [_row("fp8", 0.01 * (1 + s), False, seed=s) for s in range(2)]  # seeds 0-1 of big, bit for bit
    for r in small:
        r.grid = "small"
    other = [_row("fp8", 0.5, False, seed=7)]  # the same setting with a run big does not hold: its own unit
    for r in other:
        r.grid = "other"
    us = units(big + small + other)
    assert sorted((u.key[0], len(u.rows), u.also_in) for u in us) == [("g", 4, ("small",)), ("other", 1, ())]


def test_merging_two_grids_holding_the_same_runs_keeps_each_cell_once(grids, tmp_path, capsys):
    from timbench.report.results import load_results

    a, b = grids
    assert main(["grid", "merge", str(a), str(b), "--out", str(tmp_path / "m")]) == 0
    merged, orig = load_results(tmp_path / "m"), load_results(a)
    assert [c.id for c in merged.cells] == [c.id for c in orig.cells]
    assert [c.status for c in merged.cells] == [c.status for c in orig.cells]
    assert sorted(os.listdir(tmp_path / "m" / "runs")) == sorted(os.listdir(a / "runs"))


@pytest.mark.parametrize("which", ["align", "diagnose"])
@pytest.mark.parametrize("twice", ["model", "condition"])
def test_a_table_listing_a_model_or_condition_twice_is_refused_in_one_line(tmp_path, capsys, which, twice):
    if which == "align":
        cond = {"name": "bf16", "engine": "kernels=exact,dtype=bf16", "trainer": "kernels=exact"}
        conds = [cond, cond] if twice == "condition" else [cond]
    else:
        conds = ["bf16-engine", "bf16-engine"] if twice == "condition" else ["bf16-engine"]
    models = ["tiny-dense", "tiny-dense"] if twice == "model" else ["tiny-dense"]
    (tmp_path / "t.yaml").write_text(json.dumps({"models": models, "conditions": conds}))
    assert main([which, "--table", str(tmp_path / "t.yaml"), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is listed twice" in err[0] and twice in err[0], err
    assert not (tmp_path / "out").exists()
