"""bench/f5_powered_verdict.py: the powered F5 ablation's pre-registered family, on hand-built result dirs."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from gridfab import cell_decl, write_cell, write_cells_json

pytestmark = pytest.mark.unit  # builds no model (make test-unit)

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("f5_powered_verdict", ROOT / "bench" / "f5_powered_verdict.py")
f5 = importlib.util.module_from_spec(spec)
spec.loader.exec_module(f5)
SEEDS = range(8)
FINAL = {
    "none": 0.40,
    "tis_token": 0.60,
    "tis+rs_k3": 0.50,
    "tis+rs_k1": 0.50,
    "tis+rs_k3_ppo": 0.50,
    "ppo_clip_0.05": 0.40,
}


def grid(root: Path) -> Path:
    decls = []
    for s in SEEDS:
        write_cell(root, "baseline", "none", final_acc=0.6 + 0.01 * (s % 3), delta=0.0, seed=s)
        decls.append(cell_decl("baseline", "none", seed=s))
        for i, (remedy, final) in enumerate(FINAL.items()):
            jitter = 0.01 * ((3 * s + 5 * i) % 4)  # differs by arm and seed: paired differences have a spread
            write_cell(root, "noise-1", remedy, final_acc=final + jitter, delta=0.1, seed=s)
            decls.append(cell_decl("noise-1", remedy, seed=s))
    write_cells_json(root, decls, name="f5_powered")
    return root


def test_the_family_decides_each_claim_with_holm_and_the_equivalence_margin(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(f5, "CONDITION", "noise-1")
    root = grid(tmp_path / "g")
    assert f5.main([str(root)]) == 0
    v = json.loads((root / "verdict.json").read_text())
    words = {t["test"]: t["word"] for t in v["family"]}
    assert words == {
        "tis_token - none": "reproduced",  # +0.2 at the final eval
        "ppo_clip_0.05 - none": "not reproduced",  # same final: only jitter
        "tis+rs_k3 - tis_token": "reversed",  # rejection costs 0.1
        "tis+rs_k3 - tis+rs_k3_ppo": "not reproduced",
        "tis+rs_k1 - tis+rs_k3": "equivalent",
    }  # within +-0.075, tight over 8 seeds
    ps = [t["p"] for t in v["family"] if t["p"] is not None]
    adj = [t["p_holm"] for t in v["family"] if t["p"] is not None]
    assert all(a >= p for p, a in zip(ps, adj)) and min(adj) == pytest.approx(min(ps) * len(ps))
    assert v["settings"]["tis+rs_k1"] == {**v["settings"]["tis+rs_k1"], "seeds": 8, "planned": 36}
    out = capsys.readouterr().out
    assert "Cells finished: 56 of 192 planned (the grid is still running" in out
    assert "| token TIS helps | **reproduced** |" in out


def test_a_directory_without_the_ablation_is_one_line_exit_2(tmp_path, capsys):
    assert f5.main([str(tmp_path / "nothing")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1
    root = tmp_path / "g"
    write_cell(root, "baseline", "none", final_acc=0.6, delta=0.0)
    write_cells_json(root, [cell_decl("baseline", "none")], name="other")
    assert f5.main([str(root)]) == 2
    err = capsys.readouterr().err
    assert "no finished nvfp4-rollout recompute cells" in err and err.count("\n") == 1
