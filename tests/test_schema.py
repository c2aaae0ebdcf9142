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


def _named_constants() -> dict[str, str]:
    """Metric name -> the schema constant that names it (STEP's "step" and the bare prefixes aside: "step" is also
    a status, checkpoint and cell field, and a prefix is not a name)."""
    return {
        v: k
        for k, v in vars(schema).items()
        if k.isupper() and isinstance(v, str) and ("/" in v or v.startswith("accuracy")) and not v.endswith("/")
    }


def _named_literals(path: Path, named: dict[str, str]) -> list[str]:
    return [
        f"{path.name}:{node.lineno}: {node.value!r} (schema.{named[node.value]})"
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in named
    ]


def test_library_code_writes_no_named_metric_as_a_literal():
    """A metric the schema names is imported from it everywhere in timbench/, runners/ and tasks/ (a rename is one
    edit, and a typo is a NameError at import, not an empty column)."""
    named = _named_constants()
    assert named[schema.K3_KL] == "K3_KL" and named[schema.MEAN_MEAN_ABS_DELTA] == "MEAN_MEAN_ABS_DELTA"
    found = [
        f"{p.parent.relative_to(ROOT)}/{hit}"
        for d in ("timbench", "runners", "tasks")
        for p in sorted((ROOT / d).rglob("*.py"))
        if p != ROOT / "timbench/metrics/schema.py"
        for hit in _named_literals(p, named)
    ]
    assert not found, "metric names written as literals (import them from timbench.metrics.schema):\n" + "\n".join(
        found
    )


def test_the_literal_scan_sees_a_literal(tmp_path):
    f = tmp_path / "probe.py"
    f.write_text('x = {"rollout_corr/k3_kl": 1, "mean/mismatch/mean_abs_delta": 2}\ny = f"{x}/rollout_corr/k3_kl"\n')
    assert _named_literals(f, _named_constants()) == [
        "probe.py:1: 'rollout_corr/k3_kl' (schema.K3_KL)",
        "probe.py:1: 'mean/mismatch/mean_abs_delta' (schema.MEAN_MEAN_ABS_DELTA)",
    ]
