"""gate.placement: a gate run's alignment mismatch placed among the committed grids (`timbench risk`'s answer),
each sentence carrying the CPU-scale caveat, and refused (not extrapolated) outside the committed dose range."""

from __future__ import annotations

import pytest

from timbench.gate.placement import placement, render_placement
from timbench.studies.risk import answer
from timbench.studies.risk_data import gather


@pytest.fixture(scope="module")
def rows():
    return gather()


def _report(mad, k3=None, **row):
    numbers = {"mean_abs_diff": mad, **({"k3_kl": k3} if k3 is not None else {})}
    return {
        "probes": [
            {"model": "m", "probe": "determinism", "numbers": {"max_abs_diff": 0.0}},
            {"model": "m", "probe": "alignment", "numbers": numbers, **row},
        ]
    }


def test_a_measured_mismatch_is_placed_per_mode_with_the_scale_caveat(rows):
    (f,) = placement(_report(0.074, 0.004), rows)
    assert f["placed"] and f["query"] == {"mean_abs_delta": 0.074, "k3_kl": 0.004}
    assert set(f["nearest"]) == {"recompute", "bypass"} and len(f["lines"]) == 2
    want = answer(f["query"], rows, k=1)["nearest"]
    for mode, s in f["nearest"].items():
        assert (s["grid"], s["model"], s["condition"]) == tuple(
            want[mode][0][k] for k in ("grid", "model", "condition")
        )
        assert "remedies" not in s
    for line, mode in zip(f["lines"], f["nearest"]):
        s = f["nearest"][mode]
        assert line.startswith(f"{mode}: nearest committed setting {s['grid']} / {s['model']} / {s['condition']}")
        assert f"{s['outcome']['collapsed']}/{s['outcome']['seeds']} seeds" in line
        assert "at CPU scale (models of " in line and "tiny-dense" in line  # the caveat in the same sentence
        assert line.endswith("with no committed evidence that it transfers to larger models")
    md = render_placement([f])
    assert md.startswith("\n## Where this mismatch sits among timbench's committed conditions")
    assert "- m (mean_abs_delta 0.074, k3_kl 0.004):" in md and f"  - {f['lines'][0]}" in md


@pytest.mark.parametrize(
    "mad,why",
    [
        (5.5e-7, "outside the committed mean |delta| range"),
        (50.0, "outside the committed mean |delta| range"),
        (-1.0, "must be a finite number >= 0"),
    ],
)
def test_outside_the_committed_range_is_not_placed(rows, mad, why):
    (f,) = placement(_report(mad), rows)
    assert not f["placed"] and "nearest" not in f and len(f["lines"]) == 1
    assert f["lines"][0].startswith("not placed: ") and why in f["lines"][0]


def test_nothing_to_place_or_nothing_committed(rows):
    assert placement(_report(0.05, not_tested="no server"), rows) == []
    assert placement({"probes": [{"model": "m", "probe": "alignment", "numbers": {}}]}, rows) == []
    assert render_placement([]) == ""
    (f,) = placement(_report(0.05), [])
    assert not f["placed"] and "no committed grid results here" in f["lines"][0]
