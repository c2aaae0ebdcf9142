"""The metric schema (timbench.metrics.schema) names every logged and summary key: an unknown key is an error,
every metric-like string literal in the loop, remedies and reports is a schema name, and every key a run
actually logs (the committed results) is one."""

import ast
import json
import re
from pathlib import Path

import pytest

from timbench.metrics import schema

pytestmark = pytest.mark.unit  # builds no model (make test-unit)

ROOT = Path(__file__).resolve().parents[1]
METRIC_LIKE = re.compile(
    r"^((rollout_corr|mismatch|training|actor|critic|drift|batch|response_length|quantized|cum"
    r"|final|mean|max|collapse|twin|tim)/[A-Za-z0-9_./]+"
    r"|(final_|peak_|initial_|relative_)?accuracy_(t1|greedy))$"
)
SCANNED = [
    "timbench/rl",
    "timbench/metrics/mismatch.py",
    "timbench/metrics/dist.py",
    "timbench/remedies",
    "timbench/report",
    "timbench/evaluate.py",
    "timbench/submit",
    "runners",
]


def _literals(path: Path):
    tree = ast.parse(path.read_text())
    # parts of f-strings are prefixes of a parametrised key (schema.STEP_KEY_FAMILIES), not names
    parts = {id(v) for n in ast.walk(tree) if isinstance(n, ast.JoinedStr) for v in n.values}
    for node in ast.walk(tree):
        if id(node) in parts:
            continue
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and METRIC_LIKE.match(node.value):
            yield node.value, node.lineno


def test_unknown_key_is_a_one_line_error():
    assert schema.check_key(schema.K3_KL) == "rollout_corr/k3_kl"
    assert schema.check_key("mean/rollout_corr/k3_kl") and schema.check_key("collapse/step")
    for bad in ("rollout_corr/k3kl", "mean/rollout_corr/k3kl", "accuracy_t2", "cum/accuracy_t1"):
        with pytest.raises(schema.SchemaError, match=rf"^report: unknown metric '{re.escape(bad)}'; valid: ") as e:
            schema.check_key(bad, "report")
        assert "\n" not in str(e.value)


def test_every_metric_literal_in_loop_and_reports_is_a_schema_name():
    unknown = [
        f"{p.relative_to(ROOT)}:{line}: {s}"
        for d in SCANNED
        for p in ([ROOT / d] if d.endswith(".py") else sorted((ROOT / d).rglob("*.py")))
        for s, line in _literals(p)
        if not schema.is_known(s)
    ]
    assert not unknown, "metric names not in timbench.metrics.schema:\n" + "\n".join(unknown)


def test_every_committed_logged_key_is_a_schema_name():
    runs = sorted((ROOT / "results").glob("*/runs/*"))
    assert runs, "no committed runs to check"
    seen = set()
    for run in runs[:40]:
        for name in ("metrics.jsonl", "eval.jsonl"):
            f = run / name
            if f.exists():
                for line in f.read_text().splitlines():
                    if line.strip():
                        seen |= set(json.loads(line))
        if (run / "summary.json").exists():
            seen |= set(json.loads((run / "summary.json").read_text()))
    assert {schema.K3_KL, schema.ACCURACY_T1} <= seen and schema.is_known("mismatch/extreme_frac_3")
    assert not [k for k in seen if not schema.is_known(k)]
