"""Proxy fidelity's test: does a verdict on the reference model transfer to a proxy model?

Not by comparing the two models' labels ("detected" / "not detected") but by testing the size x setting
interaction with timbench.report.verdict_rules: for an effect or a remedy order, the proxy's A - B minus the
reference model's, per seed (`size_interaction`: TOST within half the reference model's learning range on the
accuracy scale; routing disagreement has no margin); for a collapse, the proxy's collapse rate against the
reference model's (`rate_interaction`, Fisher). Pure functions of summary rows (timbench.studies.fidelity).
"""

from __future__ import annotations

from ..report.stats import mean
from ..report.verdict_rules import Test, rate_interaction, size_interaction
from .paper_claims import collapses


def seed_diffs(a: list[dict], b: list[dict], col: str) -> dict:
    """seed -> a's col - b's col, on the seeds both have."""
    bs = {r["seed"]: r.get(col) for r in b if r.get(col) is not None}
    return {r["seed"]: r[col] - bs[r["seed"]] for r in a if r.get(col) is not None and r["seed"] in bs}


def learning_range(rows: dict[tuple, list[dict]], reference: str) -> float | None:
    """A model's zero-mismatch own gain (endpoint - step-0 eval), the mean over its baseline settings' seeds
    (`rows`: setting (task, condition, remedy, mode, algorithm) -> summary rows with endpoint columns)."""
    gains = [
        r["gain_t1"]
        for s, rs in rows.items()
        if s[1] == reference and s[2] == "none"
        for r in rs
        if r.get("gain_t1") is not None
    ]
    return mean(gains) if gains else None


def size_test(
    family: str,
    col: str | None,
    accuracy: bool,
    ref_model: str,
    model: str,
    ref_rows: tuple,
    rows: tuple,
    lr: float | None,
) -> Test:
    """One verdict's interaction test: `ref_rows` and `rows` are (A rows, B rows) of the reference model and the
    proxy (B empty for a collapse verdict); `accuracy` when `col` is on the accuracy scale (it gets the margin)."""
    (a_ref, b_ref), (a, b) = ref_rows, rows
    if family == "collapse":
        return rate_interaction(f"{model} - {ref_model} collapse rate", *collapses(a_ref), *collapses(a))
    margin = lr / 2 if accuracy and lr and lr > 0 else None
    return size_interaction(
        f"({model} - {ref_model}) of A - B",
        seed_diffs(a_ref, b_ref, col),
        seed_diffs(a, b, col),
        margin,
        lr if accuracy else None,
    )


def test_json(t: Test) -> dict:
    """A test for fidelity.json: its words, numbers and p-values."""
    return {
        "text": t.text(),
        "word": t.word(),
        "estimate": t.estimate,
        "lo": t.interval.lo,
        "hi": t.interval.hi,
        "n": t.interval.n,
        "p_tost": t.p,
        "p_holm": t.p_adj,
        "p_difference": t.p_diff,
        "margin": t.margin,
        "not_tested": t.blocked,
    }
