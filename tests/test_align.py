"""`timbench align`: zero mismatch for exact/exact, non-zero for torch, clear errors on bad specs."""

import json
import subprocess
import sys

import pytest

from timbench.align import align
from timbench.cli import main


@pytest.mark.parametrize("dtype", ["fp32", "bf16", "fp16"])
def test_exact_exact_reports_exactly_zero(model, dtype):
    spec = f"kernels=exact,dtype={dtype}"
    r = align(model, spec, spec, seed=3, batches=(1, 2, 7, 64))
    assert r["max_abs_diff"] == 0.0 and r["k3_kl"] == 0.0 and r["frac_tokens_differ"] == 0.0
    assert r["tokens"] > 500
    if model.config.is_moe:
        assert r["routing_agreement"] == 1.0


def test_torch_engine_against_exact_trainer_is_nonzero(dense):
    r = align(dense, "kernels=torch", "kernels=exact", seed=0, batches=(1, 3, 64))
    assert r["max_abs_diff"] > 0.0
    assert 0.0 < r["frac_tokens_differ"] <= 1.0


def test_cli_json_and_errors(capsys):
    assert main(["align", "--model", "tiny-moe", "--seed", "1", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    for key in ("tokens", "max_abs_diff", "mean_abs_diff", "frac_tokens_differ", "k3_kl", "routing_agreement"):
        assert key in r
    assert r["max_abs_diff"] == 0.0
    assert main(["align", "--engine", "kernels=cuda"]) == 2
    err = capsys.readouterr().err
    assert "invalid value 'cuda' for kernels; valid: exact|torch" in err and err.count("\n") == 1
    assert main(["align", "--trainer", "flavour=x"]) == 2
    assert "unknown key 'flavour'" in capsys.readouterr().err


def test_console_script_exit_code():
    p = subprocess.run(
        [sys.executable, "-m", "timbench.cli", "align", "--engine", "dtype=fp128"], capture_output=True, text=True
    )
    assert p.returncode == 2 and "valid: fp32|bf16|fp16" in p.stderr


def test_bf16_engine_against_fp32_trainer_is_a_larger_mismatch(dense):
    fp32 = align(dense, "kernels=torch", "kernels=torch", seed=1, batches=(2, 16))
    bf16 = align(dense, "kernels=torch,dtype=bf16", "kernels=torch", seed=1, batches=(2, 16))
    assert bf16["mean_abs_diff"] > 10 * fp32["mean_abs_diff"] > 0.0


def test_align_table_writes_and_resumes(tmp_path):
    from timbench.align_table import read_table, run_table

    table = tmp_path / "t.yaml"
    table.write_text(
        "models: [tiny-dense]\nseed: 0\nbatches: [1, 5]\nconditions:\n"
        "  - {name: a, engine: kernels=exact, trainer: kernels=exact}\n"
        "  - {name: b, engine: kernels=exact, trainer: kernels=exact}\n"
    )
    said = []
    rows = run_table(table, tmp_path / "out", progress=said.append)
    assert rows[0]["max_abs_diff"] == 0.0
    # counts and an ETA on every row, so a long table is never silent
    assert "2 rows to run" in said[0]
    assert said[1].startswith("[row 1/2, ETA ") and said[2].startswith("[row 2/2, took "), said
    res = tmp_path / "out" / "t.json"
    before = res.read_text()
    run_table(table, tmp_path / "out", progress=lambda m: pytest.fail("a finished row was recomputed"))
    assert res.read_text() == before
    assert "| tiny-dense | a |" in (tmp_path / "out" / "t.md").read_text()
    # Two worker processes give the same file, rows in table order whichever finished first.
    par = run_table(table, tmp_path / "par", progress=said.append, workers=2)
    assert (tmp_path / "par" / "t.json").read_text() == before and [r["condition"] for r in par] == ["a", "b"]
    assert "2 workers" in said[3]
    with pytest.raises(ValueError, match="workers must be >= 1, got 0"):
        run_table(table, tmp_path / "out", workers=0)
    table.write_text("models: [tiny-dense]\ncondtions: []\n")
    with pytest.raises(ValueError, match="unknown key"):
        read_table(table)
    table.write_text("conditions:\n  - {name: b, engine: kernels=fast}\n")
    with pytest.raises(ValueError, match="invalid value 'fast'"):
        read_table(table)
