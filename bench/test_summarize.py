"""bench/summarize.py on hand-made pytest-benchmark JSON: pooling, the exact/torch ratio, the target lines.

Runs with the smoke round in CI, so the summary cannot drift from what the suites record.
"""

from __future__ import annotations

import json

import summarize


def _bench(bench, kernels, median, tokens=1000, batch="32x8"):
    return {
        "stats": {"median": median},
        "extra_info": {
            "bench": bench,
            "model": "tiny-dense",
            "kernels": kernels,
            "dtype": "fp32",
            "batch": batch,
            "tokens": tokens,
            "torch_threads": 1,
            "numba_threads": 1,
        },
    }


def _file(path, *benches):
    path.write_text(
        json.dumps(
            {"datetime": "2026-12-03", "machine_info": {"cpu": {"brand_raw": "test"}}, "benchmarks": list(benches)}
        )
    )
    return path


def test_rl_step_ratio_is_pooled_and_judged_against_the_target(tmp_path, capsys):
    a = _file(
        tmp_path / "rl_step.json",
        _bench("rl_step", "exact", 1.2),
        _bench("rl_step", "torch", 1.0),
        _bench("engine", "exact", 0.5, batch=64),
        _bench("engine", "torch", 1.0, batch=64),
        {"stats": {"median": 9.0}, "extra_info": {"spec": "an old-format row"}},
    )
    b = _file(tmp_path / "rl_step.2.json", _bench("rl_step", "exact", 1.0), _bench("rl_step", "torch", 1.0))
    out = tmp_path / "summary.md"
    assert summarize.main([str(a), str(b), "--out", str(out)]) == 0
    rows = {r["bench"]: r for r in summarize.summarize(summarize.load([a, b])[0])}
    assert set(rows) == {"rl_step", "engine"}  # the old-format row is not ours and is skipped
    # pooled: median of per-file medians (1.2, 1.0) -> 1.1 against torch 1.0; per-run range 1.0-1.2
    assert abs(rows["rl_step"]["ratio"] - 1.1) < 1e-12 and rows["rl_step"]["ratio_range"] == (1.0, 1.2)
    text = out.read_text()
    # the targets: the RL step <= 1.0 (missed at 1.10), the engine <= 0.9 (met at 0.50)
    assert "- rl_step tiny-dense 32x8 fp32: exact/torch 1.10 (1.100 s vs 1.000 s), target <= 1.0: MISSED" in text
    assert "- engine tiny-dense 64 fp32: exact/torch 0.50 (0.500 s vs 1.000 s), target <= 0.9: met" in text
    assert text == capsys.readouterr().out


def test_missed_target_and_missing_torch_side_are_said(tmp_path):
    f = _file(
        tmp_path / "x.json",
        _bench("rl_step", "exact", 1.5),
        _bench("rl_step", "torch", 1.0),
        _bench("trainer", "exact", 1.0, batch=256),
    )
    lines = summarize.target_lines(summarize.summarize(summarize.load([f])[0]))
    assert any(l.startswith("- rl_step") and l.endswith("MISSED") and "1.50" in l for l in lines)
    assert any(l.startswith("- trainer") and "n/a" in l for l in lines)


def test_cpu_kind_names_the_isa_and_the_missing_kinds():
    zen4 = {"brand_raw": "AMD EPYC", "vendor_id_raw": "AuthenticAMD", "family": 25, "model": 17,
            "flags": ["avx2", "avx512f", "fma"]}  # fmt: skip
    xeon = {"brand_raw": "Intel Xeon", "vendor_id_raw": "GenuineIntel", "family": 6, "model": 143,
            "flags": ["avx2", "avx512f", "amx_tile"]}  # fmt: skip
    zen3 = {**zen4, "model": 1, "flags": ["avx2", "fma"]}
    assert summarize.cpu_kind(zen4) == "AMD EPYC (AMD family 25 model 17), AVX-512"
    assert summarize.cpu_kind(xeon) == "Intel Xeon (Intel family 6 model 143), AVX-512+AMX"
    assert summarize.cpu_kind(zen3).endswith("), AVX2")
    amd_only = summarize.kinds_line({"a": {"cpu": summarize.cpu_kind(zen4)}})
    assert "missing: Intel with AVX-512" in amd_only
    both = summarize.kinds_line({"a": {"cpu": summarize.cpu_kind(zen3)}, "b": {"cpu": summarize.cpu_kind(xeon)}})
    assert both.endswith("none missing.")
