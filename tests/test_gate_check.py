"""`timbench gate check` and `gate run`'s baseline: readable findings with structured --json fields, one-line
refusals of an empty, partial or malformed gate.json, and a release that switches its rollouts to bf16 (within the
alignment probe's 0.1 bound) failing `gate run` against the stored baseline without a second command."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from timbench.cli import main
from timbench.gate.check import check, load_report
from timbench.gate.suite import load_suite

ROOT = Path(__file__).resolve().parents[1]
SUITE = """name: tiny-align
version: 1
models: [tiny-dense]
seed: 0
temperature: 0.8
probes:
  determinism: {requests: 2, max_new_tokens: 3}
  alignment: {batches: [1, 3], max_mean_abs_diff: 0.1}
"""


def _report() -> dict:
    ident = {"suite": "smoke", "suite_version": 3, "engine_spec": "kernels=exact,dtype=fp32"}
    rows = [
        {
            "model": "tiny-dense",
            "probe": "determinism",
            "passed": True,
            "note": "",
            "error": None,
            "numbers": {"completions_differ": 0, "max_abs_diff": 0.0},
            "thresholds": {"max_abs_diff": 0.0},
        },
        {
            "model": "tiny-dense",
            "probe": "alignment",
            "passed": True,
            "note": "",
            "error": None,
            "numbers": {"mean_abs_diff": 0.0, "max_abs_diff": 0.0},
            "thresholds": {"mean_abs_diff": 0.0},
        },
    ]
    return {"identity": ident, "passed": True, "probes": rows, "seconds": 1.0}


def _write(d: Path, doc) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    (d / "gate.json").write_text(json.dumps(doc))
    return d


def test_findings_are_readable_lines_and_json_has_their_fields(tmp_path, capsys):
    base, cand = _report(), _report()
    cand["probes"][0] |= {"passed": False, "numbers": {"completions_differ": 1, "max_abs_diff": 2.5e-7}}
    cand["probes"][1]["numbers"]["mean_abs_diff"] = 0.0134
    b, c = _write(tmp_path / "b", base), _write(tmp_path / "c", cand)
    assert main(["gate", "check", str(b), str(c)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out == [
        "regression: tiny-dense determinism passed in the baseline and fails now: "
        "completions_differ 0 -> 1, max_abs_diff 0 -> 2.5e-07",
        "regression: tiny-dense alignment mean_abs_diff 0 -> 0.0134 (rule: mean_abs_diff <= 1.5x the "
        "baseline's + 1e-12)",
    ]
    assert not any("{" in line for line in out)  # no dict reprs
    assert main(["gate", "check", str(b), str(c), "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["exit"] == 1
    first, second = doc["findings"]
    assert {k: first[k] for k in ("kind", "probe", "model", "metric", "baseline", "candidate")} == {
        "kind": "regression",
        "probe": "determinism",
        "model": "tiny-dense",
        "metric": "passed",
        "baseline": True,
        "candidate": False,
    }
    assert (second["metric"], second["baseline"], second["candidate"]) == ("mean_abs_diff", 0.0, 0.0134)
    assert "1.5x" in second["rule"] and first["rule"]


@pytest.mark.parametrize(
    "doc, says",
    [
        ([], "not a gate.json (a JSON list"),
        ({}, "not a gate.json (missing identity, probes)"),
        ({"identity": {"suite": "smoke"}, "probes": []}, "not a gate.json (missing suite_version)"),
        ({"identity": {"suite": "smoke", "suite_version": 3}, "probes": [{"model": "x"}]}, "probe row 0 lacks one of"),
        ({"identity": {"suite": "smoke", "suite_version": 3}, "probes": []}, "an empty gate run (no probe results)"),
    ],
)
def test_a_malformed_or_empty_gate_json_is_one_line_exit_2(tmp_path, capsys, doc, says):
    good, bad = _write(tmp_path / "good", _report()), _write(tmp_path / "bad", doc)
    for args in ([str(good), str(bad)], [str(bad), str(good)]):
        assert main(["gate", "check", *args]) == 2
        err = capsys.readouterr().err
        assert says in err and err.count("\n") == 1 and "Traceback" not in err


def test_a_partial_candidate_is_refused_in_one_line(tmp_path, capsys):
    cand = _report()
    cand["probes"].pop()
    b, c = _write(tmp_path / "b", _report()), _write(tmp_path / "c", cand)
    assert main(["gate", "check", str(b), str(c)]) == 2
    out = capsys.readouterr().out
    assert (
        out == "incomparable: the candidate lacks 1 of the baseline's 2 probe results (tiny-dense alignment); "
        "a partial gate run is not checked\n"
    )


def test_a_probe_that_erred_in_the_candidate_is_not_compared_and_not_a_pass():
    cand = _report()
    cand["probes"][0] |= {"passed": False, "numbers": {}, "error": "RuntimeError: engine failed"}
    code, found = check(_report(), cand)
    assert code == 2 and [f["line"] for f in found] == [
        "not compared: tiny-dense determinism erred in the candidate (RuntimeError: engine failed)"
    ]


@pytest.fixture
def suite_with_baseline(tmp_path):
    """A one-model suite whose stored baseline is the exact fp32 engine's run of it (made here, as
    results/gates/none is for `smoke`)."""
    (tmp_path / "s.yaml").write_text(SUITE)
    assert main(["gate", "run", "--suite", str(tmp_path / "s.yaml"), "--out", str(tmp_path / "base")]) == 0
    (tmp_path / "s.yaml").write_text(SUITE + f"baseline: {tmp_path / 'base'}\n")
    return tmp_path / "s.yaml"


def test_gate_run_fails_a_silent_switch_to_bf16_against_the_stored_baseline(suite_with_baseline, tmp_path, capsys):
    # A release whose rollouts silently become bf16 (`dtype=bf16`): mean |delta| ~0.013 is within the alignment
    # probe's 0.1 bound, so every probe passes; the stored exact baseline (0.0) catches it in the same command.
    capsys.readouterr()
    assert (
        main(
            [
                "gate",
                "run",
                "--suite",
                str(suite_with_baseline),
                "--engine",
                "dtype=bf16",
                "--out",
                str(tmp_path / "bf16"),
            ]
        )
        == 1
    )
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("regression: tiny-dense alignment mean_abs_diff 0 -> 0.01")
    assert out[-1].startswith("gate tiny-align v1: FAIL; 1 regression(s) against ")
    assert all(r["passed"] for r in load_report(tmp_path / "bf16")["probes"])  # the probes alone pass it
    assert (
        main(
            [
                "gate",
                "run",
                "--suite",
                str(suite_with_baseline),
                "--engine",
                "dtype=bf16",
                "--no-baseline",
                "--out",
                str(tmp_path / "bf16b"),
            ]
        )
        == 0
    )
    assert "no baseline compared" in capsys.readouterr().out


def test_a_baseline_of_another_suite_is_refused_before_any_probe_runs(tmp_path, capsys):
    (tmp_path / "s.yaml").write_text(SUITE)
    base = _write(tmp_path / "b", _report())  # smoke v3
    assert (
        main(
            ["gate", "run", "--suite", str(tmp_path / "s.yaml"), "--baseline", str(base), "--out", str(tmp_path / "o")]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert "is suite smoke v3, this run is tiny-align v1" in err and err.count("\n") == 1
    assert not (tmp_path / "o").exists()


def test_every_stored_baseline_is_of_its_suite_and_version():
    # `gate run --suite smoke` compares with results/gates/none by default: a suite version bump without
    # regenerating it would make every gate run incomparable.
    smoke = load_suite("smoke")
    assert smoke.baseline == ROOT / "results" / "gates" / "none"
    for path in sorted((ROOT / "bench" / "gates").glob("*.yaml")):
        suite = load_suite(str(path))
        if suite.baseline is not None:
            ident = load_report(suite.baseline)["identity"]
            assert (ident["suite"], ident["suite_version"]) == (suite.name, suite.version), path
            assert ident["engine_spec"] == "kernels=exact,dtype=fp32"


def test_gate_md_prints_each_probe_s_pass_condition():
    from timbench.gate.run import pass_condition

    # sampling_semantics passes at p >= alpha (its threshold is a floor, min_p_value), alignment at <= its bound
    assert pass_condition({"min_p_value": 1e-3}) == "p_value >= 0.001"
    assert pass_condition({"mean_abs_diff": 0.1}) == "mean_abs_diff <= 0.1"


def test_the_sampling_probe_records_its_threshold_as_a_floor():
    from timbench.engine import SamplingParams, make_engine
    from timbench.gate.probes import PROBES
    from timbench.gate.run import render
    from timbench.gate.shapes import load_model
    from timbench.spec.keys import parse_spec

    spec = parse_spec("kernels=exact", side="engine")
    make = lambda w: make_engine(w.config, spec, weights=w)  # noqa: E731
    r = PROBES["sampling_semantics"](
        make,
        load_model("tiny-dense"),
        {"prompts": 1, "samples": 200, "alpha": 1e-3},
        SamplingParams(temperature=0.8, seed=0),
        spec,
    )
    assert r.passed and r.thresholds == {"min_p_value": 1e-3}
    rep = _report()
    rep["identity"] |= {
        "engine_package": "timbench",
        "engine_version": "0",
        "torch": "t",
        "machine": {"cpu": "c"},
        "fingerprint": "f",
    }
    rep["probes"] = [
        {
            "model": "tiny-dense",
            "probe": "sampling_semantics",
            "passed": True,
            "note": "",
            "error": None,
            "numbers": r.numbers,
            "thresholds": r.thresholds,
        }
    ]
    assert render(rep).rstrip().endswith("| p_value >= 0.001 |")


def test_check_of_a_copy_is_clean_and_json_of_no_findings(tmp_path, capsys):
    b = _write(tmp_path / "b", _report())
    c = _write(tmp_path / "c", copy.deepcopy(_report()))
    assert main(["gate", "check", str(b), str(c), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"exit": 0, "findings": []}
