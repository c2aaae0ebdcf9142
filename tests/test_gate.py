"""The release gate: every probe passes on timbench's exact engine and fails on a fault it must catch."""

from __future__ import annotations

import copy
import json

import pytest

from timbench.cli import main
from timbench.engine import SamplingParams, make_engine
from timbench.faults import FAULTS
from timbench.gate.check import check
from timbench.gate.probes import PROBES
from timbench.gate.run import run_gate
from timbench.gate.suite import load_suite
from timbench.model import load_checkpoint
from timbench.shipped import default_checkpoint
from timbench.spec import SpecError, parse_spec

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


@pytest.mark.parametrize("name,fault", [("batch_invariance", "batch_leak"), ("prefill_vs_decode", "bf16_logprobs"),
                                        ("alignment", "rope_base"), ("alignment", "zero_logprobs"),
                                        ("weight_sync", "stale_weights"), ("weight_sync", "stale_embedding")])
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
    assert PROBES["determinism"](lambda w: make_engine(w.config, "kernels=exact", weights=w), model,
                                 suite.probes["determinism"], PARAMS, spec).passed


def test_run_writes_identity_and_check_compares(suite, tmp_path):
    base = run_gate("kernels=exact", suite, tmp_path / "base")
    assert base["passed"] and (tmp_path / "base/gate.md").read_text().count("| pass |") == len(PROBES)
    ident = json.loads((tmp_path / "base/gate.json").read_text())["identity"]
    assert (ident["suite"], ident["suite_version"], ident["engine_package"]) == ("tiny", 3, "timbench")
    assert len(ident["fingerprint"]) == 16 and ident["machine"]["cpu"] and ident["timbench_code"]
    assert check(base, base) == (0, [])
    worse = copy.deepcopy(base)
    worse["probes"][0]["passed"] = False
    code, lines = check(base, worse)
    assert code == 1 and "tiny-dense determinism passed in the baseline and fails now" in lines[0]
    drift = copy.deepcopy(base)
    next(r for r in drift["probes"] if r["probe"] == "alignment")["numbers"]["mean_abs_diff"] = 1e-9
    assert check(base, drift)[0] == 1
    other = copy.deepcopy(base)
    other["identity"]["suite_version"] = 4
    assert check(base, other) == (2, ["incomparable: baseline is suite tiny v3, candidate is tiny v4"])


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
    assert set(FAULTS) >= {"stale_weights", "stale_embedding", "zero_logprobs", "bf16_logprobs", "batch_leak",
                           "rope_base"} and all(len(f.doc) > 40 for f in FAULTS.values())


def test_committed_detection_matrix_catches_every_fault():
    from pathlib import Path

    doc = json.loads((Path(__file__).resolve().parents[1] / "results/gates/detection.json").read_text())
    assert set(doc["faults"]) == {"none", *FAULTS}
    assert doc["faults"]["none"]["gate_passed"]
    assert not any(row["gate_passed"] for f, row in doc["faults"].items() if f != "none")
