"""Hostile inputs for the release gate: suite values that would make a probe do nothing, and a suite
edited without a new version (docs/reliability.md)."""

import json

import pytest

from timbench.cli import main
from timbench.gate.suite import load_suite

SUITE = """\
name: tiny
version: 3
models: [tiny-dense]
seed: 0
temperature: 0.8
probes:
  determinism: {requests: 2, max_new_tokens: 3}
  alignment: {batches: [1, 3], max_mean_abs_diff: 0.1}
  sampling_semantics: {prompts: 2, samples: 100, alpha: 1.0e-3}
"""


@pytest.mark.parametrize(
    "old,new,message",
    [
        ("requests: 2", "requests: -5", "probes.determinism.requests is -5; valid: an integer >= 1"),
        ("requests: 2", "requests: 2.5", "probes.determinism.requests is 2.5; valid: an integer >= 1"),
        ("max_new_tokens: 3", "max_new_tokens: 0", "probes.determinism.max_new_tokens is 0; valid: an integer >= 1"),
        ("batches: [1, 3]", "batches: []", "probes.alignment.batches is []; valid: a non-empty list of integers >= 1"),
        ("max_mean_abs_diff: 0.1", "max_mean_abs_diff: .nan", "max_mean_abs_diff is nan; valid: a finite number >= 0"),
        ("samples: 100", "samples: 0", "probes.sampling_semantics.samples is 0; valid: an integer >= 1"),
        ("alpha: 1.0e-3", "alpha: 2", "probes.sampling_semantics.alpha is 2; valid: a number in (0, 1)"),
        ("temperature: 0.8", "temperature: -1", "temperature is -1; valid: a finite number > 0"),
        ("seed: 0", "seed: -3", "seed is -3; valid: an integer 0..4294967295"),
        (
            "  determinism: {requests: 2, max_new_tokens: 3}",
            "  determinism: 5",
            "probes.determinism is 5; valid: a mapping",
        ),
    ],
)
def test_a_suite_value_out_of_range_is_a_one_line_error(tmp_path, capsys, old, new, message):
    path = tmp_path / "bad.yaml"
    path.write_text(SUITE.replace(old, new))
    with pytest.raises(ValueError, match=None) as e:
        load_suite(str(path))
    assert message in str(e.value) and str(path) in str(e.value) and "\n" not in str(e.value)
    assert main(["gate", "run", "--suite", str(path), "--no-baseline", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]


def test_the_shipped_suites_hold_valid_values():
    for name in ("smoke", "default", "production"):
        assert len(load_suite(name).content) == 64


def test_a_suite_edited_without_a_new_version_has_another_content_hash(tmp_path):
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text(SUITE)
    b.write_text("# a comment does not change what is tested\n" + SUITE)
    assert load_suite(str(a)).content == load_suite(str(b)).content
    b.write_text(SUITE.replace("max_mean_abs_diff: 0.1", "max_mean_abs_diff: 10"))
    assert load_suite(str(a)).content != load_suite(str(b)).content


def _report(sha) -> dict:
    ident = {"suite": "tiny", "suite_version": 3, "engine_spec": "kernels=exact,dtype=fp32"}
    if sha:
        ident["suite_sha256"] = sha
    rows = [
        {
            "model": "tiny-dense",
            "probe": "determinism",
            "passed": True,
            "note": "",
            "error": None,
            "numbers": {"completions_differ": 0},
            "thresholds": {},
        }
    ]
    return {"identity": ident, "passed": True, "probes": rows, "seconds": 1.0}


def _write(d, doc):
    d.mkdir(parents=True)
    (d / "gate.json").write_text(json.dumps(doc))
    return str(d)


def test_gate_check_refuses_runs_of_one_suite_version_with_different_content(tmp_path, capsys):
    b, c = _write(tmp_path / "b", _report("a" * 64)), _write(tmp_path / "c", _report("b" * 64))
    assert main(["gate", "check", b, c]) == 2
    assert "incomparable: both ran suite tiny v3, but its content differs" in capsys.readouterr().out
    same = _write(tmp_path / "same", _report("a" * 64))
    assert main(["gate", "check", b, same]) == 0
    legacy = _write(tmp_path / "legacy", _report(None))  # gate.json made before suites were hashed
    assert main(["gate", "check", legacy, c]) == 0


# 5. Gate runs and align tables get manifests; a reader refuses one edited after it was written.


def test_a_gate_run_is_sealed_and_an_edited_gate_json_is_refused(tmp_path, capsys):
    suite = tmp_path / "tiny.yaml"
    suite.write_text(
        SUITE.replace("  alignment: {batches: [1, 3], max_mean_abs_diff: 0.1}\n", "").replace(
            "  sampling_semantics: {prompts: 2, samples: 100, alpha: 1.0e-3}\n", ""
        )
    )
    out = tmp_path / "run"
    assert main(["gate", "run", "--suite", str(suite), "--no-baseline", "--out", str(out)]) == 0
    doc = json.loads((out / "gate.json").read_text())
    assert doc["identity"]["suite_sha256"] == load_suite(str(suite)).content
    assert sorted(json.loads((out / "manifest.json").read_text())["files"]) == ["gate.json", "gate.md"]
    capsys.readouterr()
    assert main(["gate", "check", str(out), str(out)]) == 0
    doc["probes"][0]["passed"] = False
    (out / "gate.json").write_text(json.dumps(doc))
    capsys.readouterr()
    assert main(["gate", "check", str(out), str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "gate.json: sha256 differs from manifest.json" in err[0]
    assert "gate run is not read" in err[0]


def test_an_align_table_edited_after_it_was_written_is_refused(tmp_path):
    from timbench.studies.claims_data import _align_rows
    from timbench.studies.risk_input import from_align
    from timbench.util import manifest

    rows = [
        {
            "model_name": "tiny-dense",
            "condition": "bf16 engine",
            "max_abs_diff": 0.01,
            "k3_kl": 1e-5,
            "mean_abs_diff": 0.001,
        }
    ]
    table = tmp_path / "align_x.json"
    table.write_text(json.dumps(rows))
    manifest.update(tmp_path, ["align_x.json"])  # what `timbench align --table` does last
    assert _align_rows(tmp_path)[0]["k3_kl"] == 1e-5
    rows[0]["k3_kl"] *= 1000
    table.write_text(json.dumps(rows))
    for read in (lambda: _align_rows(tmp_path), lambda: from_align(table)):
        with pytest.raises(ValueError, match=r"align_x.json: sha256 differs .*this align table is not read"):
            read()


def test_align_table_writes_its_files_into_the_dirs_manifest(tmp_path):
    from timbench.align_table import run_table
    from timbench.util import manifest

    table = tmp_path / "t.yaml"
    table.write_text(
        "models: [tiny-dense]\nseed: 0\nbatches: [1]\nconditions:\n"
        "  - {name: a, engine: kernels=exact, trainer: kernels=exact}\n"
    )
    run_table(table, tmp_path / "out", progress=lambda m: None)
    assert sorted(manifest.read(tmp_path / "out")) == ["t.json", "t.md"]
    assert manifest.problems(tmp_path / "out") == []
