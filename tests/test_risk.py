"""`timbench risk`: leave-one-condition-out never scores what it fitted; every input kind maps onto the committed
grids; bad input is one line with exit 2; every answer names the map's validity limits."""

from __future__ import annotations

import json

import pytest

from timbench.cli import main
from timbench.gate.placement import from_gate
from timbench.studies import risk_validate as rv
from timbench.studies.risk import _sizes, answer, safe_levels, the_map, units, validity
from timbench.studies.risk_data import ROOT, RiskRow, gather, mapped
from timbench.studies.risk_input import from_align, from_numbers

pytestmark = pytest.mark.unit  # builds no model (make test-unit)

ALIGN = ROOT / "align" / "align_lowprec.json"
GATE = ROOT / "gates" / "raw_logprobs" / "gate.json"


@pytest.fixture(scope="module")
def rows():
    return gather(ROOT)


@pytest.fixture
def small_results(tmp_path):
    """A results tree holding one small committed grid (paper_vllm, 9 cells), so a CLI run reads it fast."""
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "paper_vllm").symlink_to(ROOT / "paper_vllm")
    return str(tmp_path / "r")


def _row(cond: str, x: float, damaged: bool, seed: int = 0, mode: str = "recompute", **stats) -> RiskRow:
    return RiskRow(
        grid="g",
        task="t",
        model="m",
        condition=cond,
        kind="quant",
        remedy="none",
        mode=mode,
        seed=seed,
        steps=80,
        stats={"mean_abs_delta": x, **stats},
        collapsed=damaged,
        collapse_step=5 if damaged else None,
        collapsed_within=damaged,
        endpoint_t1=0.5,
        loss=0.9 if damaged else 0.0,
    )


def test_loco_never_scores_a_condition_it_fitted_on(monkeypatch):
    # In-sample, "damage iff x < 1.5" is perfect; held out, each condition is fitted on the other one only, whose
    # rows are all of the other class, so every held-out row is predicted wrong.
    data = [("A", "recompute", 1.0, True)] * 3 + [("B", "recompute", 2.0, False)] * 3
    cut, side = rv.fit_threshold([d[2] for d in data], [d[3] for d in data])
    assert all((side * (d[2] - cut) > 0) == d[3] for d in data)
    preds = rv.loco_predictions(data)
    assert [p[0] for p in preds] == ["A"] * 3 + ["B"] * 3
    assert sum(p[2] == p[1] for p in preds) == 0
    # and every fit saw exactly the rows of the conditions not being scored
    fitted = []
    real = rv.fit_threshold
    monkeypatch.setattr(rv, "fit_threshold", lambda xs, ys: fitted.append(sorted(set(xs))) or real(xs, ys))
    data = [
        (g, m, x, x > 2) for g, x in (("A", 1.0), ("B", 2.0), ("C", 3.0), ("D", 4.0)) for m in ("recompute", "bypass")
    ]
    rv.loco_predictions(data)
    assert len(fitted) == 8 and all(len(f) == 3 for f in fitted)
    assert sorted(tuple(f) for f in fitted) == sorted(
        [(2.0, 3.0, 4.0), (1.0, 3.0, 4.0), (1.0, 2.0, 4.0), (1.0, 2.0, 3.0)] * 2
    )


def test_validation_ranks_a_separating_statistic_above_a_useless_one():
    rows = [
        _row(f"c{i}", 0.01 * (i + 1), i >= 4, seed=s, k3_kl=0.5 if i % 2 else 0.7) for i in range(8) for s in range(2)
    ]
    ranked = rv.validate_outcome(rows, "collapse")
    by = {d["statistic"]: d for d in ranked}
    assert by["mean_abs_delta"]["auc"] > 0.9 and by["k3_kl"]["auc"] < 0.75
    assert ranked[0]["statistic"] == "mean_abs_delta"
    assert by["k3_kl"]["auc_minus_dose_ci"][1] < 0  # the paired interval says it is worse
    assert "mean |delta| ranks first" in rv.verdict(ranked)


def test_replayed_cells_count_once():
    r = _row("c", 0.01, False)
    assert len(rv.distinct([r, RiskRow(**{**r.__dict__, "grid": "other"})])) == 1


def test_numbers_align_and_gate_each_map_onto_the_committed_grids(rows):
    ((label, q),) = from_numbers(["k3_kl=0.015"], 0.043)
    a = answer(q, rows, label=label)
    top = a["nearest"]["recompute"][0]
    assert top["kind"] == "quant" and top["outcome"]["seeds"] >= 3 and top["distance"] < 0.1
    assert a["nearest"]["bypass"][0]["outcome"]["collapsed"] == a["nearest"]["bypass"][0]["outcome"]["seeds"]
    assert any(r["remedy"] == "recompute" and r["word"] == "helped" for r in a["nearest"]["bypass"][0]["remedies"])
    lo, hi = top["outcome"]["accuracy_lost_ci"]
    assert lo < top["outcome"]["accuracy_lost"] < hi
    queries = from_align(ALIGN, row="int4-rollout")
    assert queries and all(q["mean_abs_delta"] > 0 for _, q in queries)
    assert answer(queries[0][1], rows, mode="bypass")["nearest"].keys() == {"bypass"}
    gate = from_gate(GATE)
    assert [lab for lab, _ in gate] == [f"gate smoke, {m} (alignment probe)" for m in ("tiny-dense", "tiny-moe")]
    assert answer(gate[0][1], rows)["nearest"]["recompute"]


def test_validity_limits_name_models_horizons_and_doses(rows):
    v = validity(units(rows))
    lo, hi = v["dose_mean_abs_delta"]
    assert 0 < lo < 0.004 < 0.1 < hi and "tiny-dense" in v["models"] and v["horizon_steps"][1] >= 80
    assert min(r.stats["mean_abs_delta"] for r in mapped(rows)) == lo


def test_the_caveat_names_every_model_the_map_rests_on_a_checkpoint_outside_the_presets_without_a_size():
    assert _sizes(["small-dense", "tiny-dense"]).startswith("tiny-dense 0.60M, small-dense ")
    assert _sizes(["runs/my-ckpt", "tiny-dense"]) == "tiny-dense 0.60M, runs/my-ckpt (size not known) parameters"


def test_cli_text_and_json_name_the_validity_limits(small_results, capsys):
    assert main(["risk", "--mean-abs-delta", "0.005", "--results", small_results]) == 0
    out = capsys.readouterr().out
    assert "paper_vllm / tiny-dense / vllm-bf16" in out and "validity of this map" in out
    assert "committed mean |delta| spans" in out and "horizons 80-80 steps" in out
    assert "what level was safe in the committed real settings" in out
    assert main(["risk", "--mean-abs-delta", "0.005", "--results", small_results, "--json", "--mode", "bypass"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["validity"]["models"] == ["tiny-dense"] and list(doc["answers"][0]["nearest"]) == ["bypass"]
    assert list(doc["safe_levels"]) == ["bypass"]


def _gate(tmp_path, suite: str, probes: list) -> str:
    p = tmp_path / f"{suite}.json"
    p.write_text(json.dumps({"identity": {"suite": suite, "suite_version": 1}, "probes": probes}))
    return str(p)


@pytest.mark.parametrize(
    "argv, says",
    [
        (["--stat", "nope=1"], "unknown statistic 'nope'; valid: mean_abs_delta, "),
        (
            ["--mean-abs-delta", "5"],
            "no committed grid at that dose: mean |delta| 5 is outside the committed mean |delta| range 0.004",
        ),
        (["--mean-abs-delta", "0"], "(0 is zero mismatch: the reference itself)"),
        (
            ["--gate", "OTHER"],
            "a gate run of suite 'mine'; `timbench risk` understands the suites with the alignment "
            "probe: default, production, smoke",
        ),
        (["--gate", "NOALIGN"], "no alignment probe result (suite smoke)"),
        (["--gate", "/no/such/gate.json"], "no gate.json"),
        (["--align", "/no/such.json"], "align table /no/such.json does not exist"),
        (["--align", str(ALIGN.with_suffix(".md"))], "the Markdown table; pass the JSON next to it"),
        (["--mean-abs-delta", "0.01", "--mode", "sideways"], "--mode 'sideways': valid: recompute, bypass"),
        ([], "give one of --mean-abs-delta"),
    ],
)
def test_bad_input_is_one_line_exit_2(argv, says, small_results, tmp_path, capsys):
    row = {"model": "tiny-dense", "probe": "determinism", "passed": True, "numbers": {"max_abs_diff": 0.0}}
    subst = {"OTHER": _gate(tmp_path, "mine", [row]), "NOALIGN": _gate(tmp_path, "smoke", [row])}
    argv = [subst.get(a, a) for a in argv]
    assert main(["risk", *argv, "--results", small_results]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("timbench risk: error: ") and says in err, err


def test_validate_writes_the_pages_with_their_command(tmp_path, small_results, capsys, monkeypatch):
    monkeypatch.setattr(rv, "BOOT", 50)
    rows = [
        _row(f"c{i}", 0.01 * (i + 1), i >= 2, seed=s, mode=m)
        for i in range(4)
        for s in range(2)
        for m in ("recompute", "bypass")
    ]
    v = rv.validate(rows)
    assert v["rows"] == 16 and set(v["outcomes"]) == {
        "collapse",
        "loss",
        "collapse, real conditions only",
        "loss, real conditions only",
    }
    out = tmp_path / "risk"
    assert main(["risk", "--validate", "--results", small_results, "--out", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["map.json", "map.md", "validation.json", "validation.md"]
    assert "no statistic could be validated" in capsys.readouterr().out  # one condition: nothing to hold out
    assert (
        f"Regenerate: `timbench risk --validate --results {small_results} --out {out}`" in (out / "map.md").read_text()
    )
    committed = json.loads((ROOT / "risk" / "validation.json").read_text())
    assert committed["command"] == "timbench risk --validate --out results/risk"
    assert "validity of this map" in (ROOT / "risk" / "map.md").read_text()


def test_safe_levels_name_the_smallest_damaged_dose_of_real_settings():
    rows = [_row("a", 0.01, False, seed=s) for s in range(2)] + [_row("b", 0.02, False, seed=s) for s in range(2)]
    rows += [_row("c", 0.05, s == 0, seed=s) for s in range(2)]  # one seed of two collapsed: damaged
    rows += [RiskRow(**{**_row("d", 0.005, True).__dict__, "kind": "noise"})]  # noise does not set the level
    safe = safe_levels(the_map(rows))["recompute"]
    assert safe["smallest_damaged"]["condition"] == "c" and safe["undamaged_below"] == 2
    assert safe["below_range"] == [0.01, 0.02] and safe["largest_undamaged"]["condition"] == "b"


def test_a_setting_two_grids_replay_is_listed_once_with_both_grids_remedies(rows):
    # dual_clip reran paper's nvfp4 bypass control cells bit for bit: one setting, paper's, whose remedies
    # include dual_clip's variant (without the merge, dual_clip's copy ranked first with only its own remedy)
    ((label, q),) = from_numbers(["k3_kl=0.015"], 0.043)
    near = answer(q, rows, label=label)["nearest"]["bypass"]
    where = [(s["grid"], s["condition"]) for s in near]
    assert len(where) == len(set(where)) and ("dual_clip", "nvfp4-rollout") not in where
    top = next(s for s in near if s["grid"] == "paper" and s["condition"] == "nvfp4-rollout")
    assert "dual_clip" in top["also_in"]
    got = {(r["remedy"], r["grid"]) for r in top["remedies"]}
    assert {("recompute", "paper"), ("dualclip_3", "dual_clip")} <= got
