"""`timbench proxy-fidelity`: verdicts per model, the size interaction against the reference model (transfers /
differs by size / inconclusive / not tested, verdict_rules), the routing-replay control, and the command's error
paths, on hand-built grids whose cells vary the model axis (gridfab)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from gridfab import cell_decl, standard_grid, write_cell, write_cells_json

from timbench.cli import main
from timbench.report.verdict_rules import DIFFERS, INCONCLUSIVE, NOT_TESTED, TRANSFERS
from timbench.studies.fidelity import (
    ACCURACY,
    CONTROL,
    GT,
    LT,
    MISSING,
    NO_DIFF,
    compare,
    proxy_fidelity,
    write_fidelity,
)

pytestmark = pytest.mark.unit  # builds no model (make test-unit)

ROOT = Path(__file__).resolve().parents[1]

R2, R3 = "routing_replay_r2", "routing_replay_r3"
AGREE = "mismatch/routing_agreement"

# (model, condition, remedy) -> per seed (final accuracy, collapsed, routing agreement); see each case below.
CELLS = {
    ("tiny-moe", "baseline", "none"): [(0.60, False, 1.0), (0.62, False, 1.0), (0.61, False, 1.0)],
    ("tiny-moe", "moe-router-noise", "none"): [(0.40, True, 0.8), (0.42, True, 0.8), (0.41, True, 0.8)],
    ("tiny-moe", "moe-router-noise", R2): [(0.45, False, 0.85), (0.46, False, 0.85), (0.47, False, 0.85)],
    ("tiny-moe", "moe-router-noise", R3): [(0.58, False, 1.0), (0.60, False, 1.0), (0.59, False, 1.0)],
    ("tiny-moe", "moe-router-bf16", "none"): [(0.60, False, 0.99), (0.61, False, 0.99), (0.60, False, 0.99)],
    ("tiny-moe", "moe-router-bf16", R3): [(0.62, False, 1.0), (0.58, False, 1.0), (0.61, False, 1.0)],
    # e4: as the reference, except R2 now hurts (R2 vs none: A < B, the reference says A > B: different)
    ("tiny-moe-e4", "baseline", "none"): [(0.55, False, 1.0), (0.57, False, 1.0), (0.56, False, 1.0)],
    ("tiny-moe-e4", "moe-router-noise", "none"): [(0.35, True, 0.7), (0.36, True, 0.7), (0.37, True, 0.7)],
    ("tiny-moe-e4", "moe-router-noise", R2): [(0.31, False, 0.8), (0.32, False, 0.8), (0.30, False, 0.8)],
    ("tiny-moe-e4", "moe-router-noise", R3): [(0.54, False, 1.0), (0.55, False, 1.0), (0.56, False, 1.0)],
    ("tiny-moe-e4", "moe-router-bf16", "none"): [(0.55, False, 0.98), (0.56, False, 0.98), (0.57, False, 0.98)],
    ("tiny-moe-e4", "moe-router-bf16", R3): [(0.58, False, 1.0), (0.59, False, 1.0), (0.60, False, 1.0)],
    # e2: routing cannot disagree (agreement 1.0), the noise does not collapse it, R2/R3 change nothing;
    # its moe-router-bf16 cells are declared but never ran (missing cells)
    ("tiny-moe-e2", "baseline", "none"): [(0.50, False, 1.0), (0.52, False, 1.0), (0.51, False, 1.0)],
    ("tiny-moe-e2", "moe-router-noise", "none"): [(0.45, False, 1.0), (0.46, False, 1.0), (0.44, False, 1.0)],
    ("tiny-moe-e2", "moe-router-noise", R2): [(0.45, False, 1.0), (0.46, False, 1.0), (0.44, False, 1.0)],
    ("tiny-moe-e2", "moe-router-noise", R3): [(0.45, False, 1.0), (0.46, False, 1.0), (0.44, False, 1.0)],
}
PENDING = [("tiny-moe-e2", "moe-router-bf16", "none"), ("tiny-moe-e2", "moe-router-bf16", R3)]


def proxy_grid(root, cells=CELLS, pending=PENDING):
    decls = []
    for (model, cond, remedy), seeds in cells.items():
        for seed, (acc, collapsed, agree) in enumerate(seeds):
            write_cell(
                root,
                cond,
                remedy,
                final_acc=acc,
                delta=0.0 if cond == "baseline" else 0.05,
                collapse=collapsed,
                seed=seed,
                model=model,
                extra={} if agree is None else {AGREE: agree},
            )
            decls.append(cell_decl(cond, remedy, seed=seed, model=model, eval_n=256))
    decls += [
        cell_decl(cond, remedy, seed=s, model=model, eval_n=256) for model, cond, remedy in pending for s in range(3)
    ]
    for model, cond, remedy in pending[:1]:  # one of them is still running: 7 steps logged, no summary
        write_cell(root, cond, remedy, final_acc=0.5, delta=0.05, status="running", steps_written=7, model=model)
    write_cells_json(root, decls, name="proxy")
    return root


def _find(doc, family, a, b=None, metric=None):
    hits = [
        v
        for v in doc["verdicts"]
        if v["family"] == family and v["a"] == a and v["b"] == b and (metric is None or v["metric"] == metric)
    ]
    assert len(hits) == 1, (family, a, b, metric, len(hits))
    return hits[0]


@pytest.fixture(scope="module")
def doc(tmp_path_factory):
    return proxy_fidelity([proxy_grid(tmp_path_factory.mktemp("g") / "proxy")])


def test_compare_is_paired_by_seed_and_needs_two_seeds():
    a = [{"seed": 0, "x": 0.5}, {"seed": 1, "x": 0.6}, {"seed": 2, "x": 0.7}]
    b = [{"seed": 0, "x": 0.4}, {"seed": 1, "x": 0.5}, {"seed": 3, "x": 0.9}]
    r = compare(a, b, "x")
    assert r["seeds"] == [0, 1] and r["word"] == GT and r["diff"][0] == pytest.approx(0.1)
    assert compare(a[:1], b, "x")["word"] == MISSING  # one paired seed: no interval
    assert compare(b, a, "x")["word"] == LT


def test_collapse_verdicts_are_rate_interactions(doc):
    v = _find(doc, "collapse", "moe-router-noise/none")
    assert v["models"]["tiny-moe"]["word"] == "collapses" and v["models"]["tiny-moe"]["collapsed"] == 3
    # 3/3 vs 3/3 (e4) and 0/3 vs 3/3 (e2, Fisher p 0.1): 3 seeds decide neither
    assert v["fidelity"] == {"tiny-moe-e4": INCONCLUSIVE, "tiny-moe-e2": INCONCLUSIVE}
    v = _find(doc, "collapse", "moe-router-bf16/none")  # nothing collapses at any size: not a verdict that survives
    assert v["fidelity"] == {"tiny-moe-e4": NOT_TESTED, "tiny-moe-e2": NOT_TESTED}
    assert "nothing happened at any size" in v["tests"]["tiny-moe-e4"]["text"]
    assert v["models"]["tiny-moe-e2"]["n"] == 0


def test_effect_vs_baseline_tests_the_interaction(doc):
    v = _find(doc, "effect", "moe-router-noise/none", "baseline/none")
    ref = v["models"]["tiny-moe"]
    assert ref["word"] == LT and ref["seeds"] == [0, 1, 2]
    # e4 loses about as much as the reference (equivalent within half its learning range), e2 far less
    assert v["fidelity"] == {"tiny-moe-e4": TRANSFERS, "tiny-moe-e2": DIFFERS}
    t = v["tests"]["tiny-moe-e4"]
    assert t["margin"] == pytest.approx(doc["learning_range"] / 2) and t["p_holm"] < 0.05
    v = _find(doc, "effect", "moe-router-bf16/none", "baseline/none")  # no effect on either: nothing to carry over
    assert v["models"]["tiny-moe"]["word"] == NO_DIFF and v["fidelity"]["tiny-moe-e4"] == NOT_TESTED


def test_remedy_order(doc):
    dis = "routing disagreement"
    v = _find(doc, "order", f"moe-router-noise/{R3}", "moe-router-noise/none", ACCURACY)
    assert v["models"]["tiny-moe"]["word"] == GT and v["fidelity"]["tiny-moe-e2"] == CONTROL
    assert v["models"]["tiny-moe-e2"]["word"] == NO_DIFF  # replay replays nothing there: judged by the control
    v = _find(doc, "order", f"moe-router-noise/{R2}", "moe-router-noise/none", ACCURACY)
    assert v["models"]["tiny-moe-e4"]["word"] == LT and v["fidelity"]["tiny-moe-e4"] == DIFFERS
    v = _find(doc, "order", f"moe-router-noise/{R3}", f"moe-router-noise/{R2}", dis)
    assert v["models"]["tiny-moe"]["word"] == LT and v["models"]["tiny-moe"]["diff"][0] == pytest.approx(-0.15)
    assert v["tests"]["tiny-moe-e4"]["margin"] is None  # routing disagreement has no equivalence margin
    v = _find(doc, "order", f"moe-router-bf16/{R3}", "moe-router-bf16/none", ACCURACY)
    assert v["models"]["tiny-moe-e2"]["word"] == MISSING and v["fidelity"]["tiny-moe-e2"] == CONTROL
    order = [
        (v["a"], v["b"])
        for v in doc["verdicts"]
        if v["family"] == "order" and v["metric"] == ACCURACY and v["a"].startswith("moe-router-noise")
    ]
    assert order == [
        (f"moe-router-noise/{R3}", "moe-router-noise/none"),
        (f"moe-router-noise/{R2}", "moe-router-noise/none"),
        (f"moe-router-noise/{R3}", f"moe-router-noise/{R2}"),
    ]


def test_survival_counts_the_rule_words(doc):
    s = doc["survival"]["tiny-moe-e4"]
    # 6 collapse verdicts: only noise/none collapses anywhere (inconclusive); the rest: nothing at any size
    assert s["collapse"] == {TRANSFERS: 0, DIFFERS: 0, INCONCLUSIVE: 1, NOT_TESTED: 5, CONTROL: 0}
    assert sum(s["order"].values()) == 8 and sum(s["all"].values()) == 6 + 2 + 8 and s["all"][CONTROL] == 0
    e2 = doc["survival"]["tiny-moe-e2"]
    assert e2["order"][CONTROL] == 8 and e2["order"][TRANSFERS] + e2["order"][DIFFERS] == 0  # every order is R2/R3


def test_control_on_the_model_whose_routing_cannot_disagree(doc, tmp_path):
    assert [c["model"] for c in doc["control"]] == ["tiny-moe-e2"]  # e4 (4 experts, top-2) can disagree
    c = doc["control"][0]
    assert c["verdict"] == "passes" and c["max_routing_disagreement"] == 0.0
    assert {x["a"] for x in c["checks"]} == {
        f"moe-router-noise/{R2}",
        f"moe-router-noise/{R3}",
        f"moe-router-bf16/{R3}",
    }
    # noise: R2 and R3 vs none x 2 metrics, all no difference; bf16: R3 vs none x 2 metrics, never ran on e2
    words = [x["result"]["word"] for x in c["checks"]]
    assert words.count(NO_DIFF) == 4 and c["missing"] == 2 and len(words) == 6
    cells = dict(CELLS)  # R3 suddenly matters on e2: the control fails
    cells[("tiny-moe-e2", "moe-router-noise", R3)] = [(0.55, False, 1.0), (0.56, False, 1.0), (0.54, False, 1.0)]
    bad = proxy_fidelity([proxy_grid(tmp_path / "bad", cells, pending=[])])
    assert bad["control"][0]["verdict"] == "fails"


def test_reference_model_option_and_files(tmp_path, capsys):
    grid = proxy_grid(tmp_path / "proxy")
    out = tmp_path / "out"
    assert main(["proxy-fidelity", str(grid), "--out", str(out), "--reference-model", "tiny-moe-e4"]) == 0
    doc = json.loads((out / "fidelity.json").read_text())
    assert doc["reference_model"] == "tiny-moe-e4" and set(doc["survival"]) == {"tiny-moe", "tiny-moe-e2"}
    assert doc["command"].endswith("--reference-model tiny-moe-e4")
    md = (out / "fidelity.md").read_text()
    assert f"Regenerate: `{doc['command']}`" in md and "Legend (" in md and "seeds 0,1,2" in md
    assert "Endpoint: last-half" in md and "of 7 survive" not in md
    assert "| tiny-moe-e2 | " in md and "## Control" in md
    assert str(out / "fidelity.md") in capsys.readouterr().out


def test_models_come_from_the_dir_holding_most_of_their_cells(tmp_path):
    full = proxy_grid(tmp_path / "full")
    part = {k: v[:1] for k, v in CELLS.items() if k[0] != "tiny-moe-e2"}  # one seed each: fewer finished cells
    doc = write_fidelity([proxy_grid(tmp_path / "part", part, pending=[]), full], tmp_path / "o")
    got = json.loads(doc["fidelity.json"].read_text())
    assert got["models"]["tiny-moe"]["grid"] == str(full) and got["models"]["tiny-moe"]["seeds"] == [0, 1, 2]


def test_a_grid_that_has_not_run_yet_is_all_not_tested(tmp_path):
    out = write_fidelity([proxy_grid(tmp_path / "fresh", {}, pending=list(CELLS))], tmp_path / "o")
    doc = json.loads(out["fidelity.json"].read_text())
    assert {w for v in doc["verdicts"] for w in v["fidelity"].values()} <= {NOT_TESTED, CONTROL}
    assert doc["survival"]["tiny-moe-e4"]["all"][NOT_TESTED] == len(doc["verdicts"]) > 0
    assert "missing (0 finished seeds, 2 needed)" in out["fidelity.md"].read_text()


def test_a_dense_pair_has_no_routing_verdicts_and_no_control(tmp_path):
    ok = [(0.60, False, None), (0.62, False, None), (0.61, False, None)]
    cells = {
        ("tiny-dense", "baseline", "none"): ok,
        ("tiny-dense", "bf16-engine", "none"): [(0.50, False, None), (0.51, False, None), (0.52, False, None)],
        ("tiny-dense", "bf16-engine", "tis_token"): ok,
        ("dense-wide", "baseline", "none"): ok,
        ("dense-wide", "bf16-engine", "none"): [(0.60, False, None), (0.63, False, None), (0.58, False, None)],
        ("dense-wide", "bf16-engine", "tis_token"): ok,
    }
    doc = proxy_fidelity([proxy_grid(tmp_path / "dense", cells, pending=[])])
    assert doc["control"] == [] and {v["metric"] for v in doc["verdicts"] if v["family"] == "order"} == {ACCURACY}
    v = _find(doc, "effect", "bf16-engine/none", "baseline/none")
    assert v["models"]["tiny-dense"]["word"] == LT and v["models"]["dense-wide"]["word"] == NO_DIFF
    assert v["fidelity"] == {"dense-wide": DIFFERS}
    # collapse: nothing collapses at any size (3 not tested); the effect and tis_token vs none differ by size
    assert doc["survival"]["dense-wide"]["all"] == {
        TRANSFERS: 0,
        DIFFERS: 2,
        INCONCLUSIVE: 0,
        NOT_TESTED: 3,
        CONTROL: 0,
    }


def _error(capsys, *args) -> str:
    assert main(["proxy-fidelity", *map(str, args)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    return err


def test_errors_are_one_line(tmp_path, capsys):
    dense = standard_grid(tmp_path / "d")
    assert "vary no model axis (models: tiny-dense)" in _error(capsys, dense, "--out", tmp_path / "o")
    assert "models: tiny-moe)" in _error(capsys, ROOT / "results" / "vllm_moe", "--out", tmp_path / "o")  # committed
    err = _error(capsys, proxy_grid(tmp_path / "p"), "--out", tmp_path / "o", "--reference-model", "tiny-moe-e8")
    assert "'tiny-moe-e8' is not a model of these grids; valid: tiny-moe, tiny-moe-e4, tiny-moe-e2" in err
    assert "not a directory" in _error(capsys, tmp_path / "nope", "--out", tmp_path / "o")
    assert not (tmp_path / "o").exists()  # nothing written on an error
