"""bench/long_horizon_verdict.py: the long-horizon campaign's verdicts by the repo's rules, on hand-built dirs."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from gridfab import cell_decl, cell_id, write_cell, write_cells_json

pytestmark = pytest.mark.unit  # builds no model (make test-unit)

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("long_horizon_verdict", ROOT / "bench" / "long_horizon_verdict.py")
lh = importlib.util.module_from_spec(spec)
spec.loader.exec_module(lh)
SEEDS = range(6)
# (condition, mode) -> (endpoint offset from the baseline, collapses)
ARMS = {
    ("bf16-engine", "recompute"): (0.0, False),  # learns like zero mismatch: equivalent within +-0.05
    ("bf16-engine", "bypass"): (0.0, False),
    ("fp8-rollout", "recompute"): (-0.2, False),  # 0.2 below: outside the margin
    ("fp8-rollout", "bypass"): (-0.4, True),  # rises, then collapses on every seed
}


def grid(root: Path, seeds=SEEDS, arms=ARMS) -> Path:
    decls = []
    for s in seeds:
        base = 0.8 + 0.01 * (s % 3)
        write_cell(root, "baseline", "none", final_acc=base, delta=0.0, seed=s)
        decls.append(cell_decl("baseline", "none", seed=s))
        for i, ((cond, mode), (offset, collapse)) in enumerate(arms.items()):
            jitter = 0.004 * ((3 * s + 5 * i) % 4)  # paired differences with a spread
            write_cell(
                root, cond, "none", final_acc=base + offset + jitter, delta=0.01, collapse=collapse, mode=mode, seed=s
            )
            d = cell_decl(cond, "none", mode=mode, seed=s)
            d["reference"] = cell_id("baseline", "none", "recompute", s)  # bypass cells read the recompute baseline
            decls.append(d)
    write_cells_json(root, decls, name="long_horizon")
    return root


def test_equivalence_and_collapse_families(tmp_path, capsys):
    root = grid(tmp_path / "g")
    assert lh.main([str(root)]) == 0
    v = json.loads((root / "verdict.json").read_text())
    words = {t["test"]: t["word"] for t in v["equivalence"]}
    assert words["bf16-engine/recompute - baseline"] == "equivalent"
    assert words["bf16-engine/bypass - baseline"] == "equivalent"
    assert words["fp8-rollout/recompute - baseline"] != "equivalent"
    assert words["fp8-rollout/bypass - baseline"] != "equivalent"
    rates = {t["test"]: t["word"] for t in v["collapse_rates"]}
    assert rates["fp8-rollout/bypass collapses more than zero mismatch"] == "reproduced"  # 6/6 vs 0/6
    assert rates["bf16-engine/bypass collapses more than zero mismatch"] == "not tested"  # both 0/6
    fp8b = v["settings"]["fp8-rollout/bypass"]
    assert fp8b["collapsed"] == [6, 6] and fp8b["rose_first"] == 6  # the fabricated reward climbs, then drops
    adj = [t["p_holm"] for t in v["equivalence"]]
    assert all(a is not None and a >= t["p"] for a, t in zip(adj, v["equivalence"]))
    out = capsys.readouterr().out
    assert "Cells finished: 30 of 30 planned." in out
    assert "| bf16-engine/recompute - baseline | **equivalent** |" in out


def test_a_running_campaign_reads_the_seeds_it_has(tmp_path, capsys):
    root = grid(tmp_path / "g", seeds=[0], arms={("bf16-engine", "recompute"): (0.0, False)})
    assert lh.main([str(root)]) == 0
    v = json.loads((root / "verdict.json").read_text())
    assert v["settings"]["fp8-rollout/bypass"]["seeds"] == 0
    assert {t["word"] for t in v["equivalence"]} == {"not tested"}  # one seed: no interval
    assert "Cells finished: 2 of 30 planned (the campaign is still running" in capsys.readouterr().out
    root = grid(tmp_path / "two", seeds=[0, 1])  # two seeds decide nothing either: the house needs three
    assert lh.main([str(root)]) == 0
    v = json.loads((root / "verdict.json").read_text())
    assert {t["word"] for t in v["equivalence"]} == {"not tested"}
    assert all("fewer than 3" in t["not_tested"] for t in v["equivalence"])


def test_a_directory_without_the_campaign_is_one_line_exit_2(tmp_path, capsys):
    assert lh.main([str(tmp_path / "nothing")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1
    root = tmp_path / "g"
    write_cell(root, "baseline", "none", final_acc=0.6, delta=0.0)
    write_cells_json(root, [cell_decl("baseline", "none")], name="other")
    assert lh.main([str(root)]) == 2
    err = capsys.readouterr().err
    assert "no finished zero-mismatch and bf16/fp8 cells" in err and err.count("\n") == 1
