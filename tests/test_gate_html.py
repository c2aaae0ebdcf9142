"""gate.html: a gate report as one self-contained, escaped HTML page (verdict, identity, probe rows, placement)."""

from __future__ import annotations

from timbench.gate.html import render_gate_html


def _report() -> dict:
    ident = {
        "suite": "smoke",
        "suite_version": 3,
        "engine_spec": "openai=http://127.0.0.1:8000",
        "engine_package": "vllm",
        "engine_version": "0.32.0",
        "torch": "2.9",
        "machine": {"cpu": "EPYC"},
        "fingerprint": "abc",
        "served_model": "/ckpt",
        "trainer_spec": "hf=/ckpt",
        "checkpoint_hash": "f00d",
        "transformers": "4.57",
    }
    rows = [
        {
            "model": "ckpt",
            "probe": "determinism",
            "passed": True,
            "note": "",
            "error": None,
            "numbers": {"max_abs_diff": 0.0},
            "thresholds": {"max_abs_diff": 0.0},
        },
        {
            "model": "ckpt",
            "probe": "logprob_semantics",
            "passed": False,
            "note": "logprobs fit: <raw>",
            "error": None,
            "numbers": {"fits": "raw", "mean_abs_diff_raw": 3.9e-7},
            "thresholds": {},
        },
        {
            "model": "ckpt",
            "probe": "weight_sync",
            "passed": False,
            "note": "",
            "error": None,
            "numbers": {},
            "thresholds": {},
            "not_tested": "no weight-load route",
        },
    ]
    return {
        "identity": ident,
        "probes": rows,
        "passed": False,
        "placement": [{"model": "ckpt", "placed": False, "query": {}, "lines": ["not placed: below range"]}],
    }


def test_gate_html_renders_every_probe_escaped_and_the_placement():
    page = render_gate_html(_report())
    assert (
        page.startswith("<!DOCTYPE html>")
        and page.endswith("</body></html>\n")
        and "http" not in page.replace("http://127.0.0.1:8000", "")
    )  # self-contained: no link out
    assert "<h1>timbench gate: smoke v3</h1>" in page and "Suite smoke v3: FAIL (1 of 3 not tested)." in page
    assert "vllm 0.32.0" in page and "checkpoint f00d" in page
    assert '<tr class="failed">' in page and "failed (logprobs fit: &lt;raw&gt;)" in page and "<raw>" not in page
    assert "fits=raw, mean_abs_diff_raw=3.9e-07" in page and "max_abs_diff &lt;= 0" in page
    assert "not tested: no weight-load route" in page
    assert 'id="placement"' in page and "<li>not placed: below range</li>" in page
    r = _report()
    del r["placement"]
    assert 'id="placement"' not in render_gate_html(r)
