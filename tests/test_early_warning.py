"""`timbench early-warning`: the leave-one-seed-out envelope rule scored on hand-built runs, the fixed KL rule,
the ranking by Youden's J, and the command on a fabricated grid dir."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from gridfab import standard_grid
from timbench.report.early_warning import Candidate, Run, rank, score_candidate, score_fixed_kl

KEY = "m"


def _run(seed, values, collapse=None, key=KEY):
    return Run("g", f"c{seed}{collapse}", seed, collapse, None, list(range(len(values))),
               [{key: v, "rollout_corr/k3_kl": v * 1e-3} for v in values])


def _runs(sign=1):
    healthy = [_run(0, [sign * 1.0] * 12), _run(1, [sign * 2.0] * 12), _run(2, [sign * 3.0] * 12)]
    collapsed = [_run(0, [sign * 0.5 * s for s in range(12)], collapse=10),
                 _run(2, [sign * 0.5 * s for s in range(12)], collapse=10)]
    return healthy + collapsed


def test_envelope_from_the_other_seeds_gives_leads_and_false_alarms_by_hand():
    # Seed 0's collapsed run is judged against max(seed 1, seed 2 healthy) = 3.0: 0.5 s > 3 first at s = 7, lead 3.
    # Seed 2's against max(seed 0, seed 1) = 2.0: first at s = 5, lead 5. Healthy seed 2 (3.0 > 2.0) is a false
    # alarm; healthy seeds 0 (1.0 vs 3.0) and 1 (2.0 vs 3.0) are not.
    r = score_candidate(Candidate(KEY, 1, "test"), _runs())
    assert (r["collapsed_runs"], r["early"], r["late"], r["missed"]) == (2, 2, 0, 0)
    assert r["leads"] == [3, 5] and r["median_lead"] == 4
    assert (r["false_alarms"], r["healthy_runs"]) == (1, 3)
    fall = score_candidate(Candidate(KEY, -1, "test"), _runs(sign=-1))  # a falling metric, mirrored: same verdicts
    assert fall["leads"] == [3, 5] and fall["false_alarms"] == 1 and fall["direction"] == "fall"


def test_late_and_missed_and_unlogged():
    runs = [_run(0, [1.0] * 12), _run(1, [1.0] * 12), _run(1, [0.0] * 5 + [9.0] * 7, collapse=5),
            _run(1, [0.0] * 12, collapse=8), _run(0, [1.0] * 12, collapse=3, key="other")]
    r = score_candidate(Candidate(KEY, 1, "test"), runs)
    assert (r["early"], r["late"], r["missed"]) == (0, 1, 1)  # the warning at the collapse step is late, not early
    assert r["collapsed_runs"] == 2  # the run that does not log the metric is not scored on it


def test_fixed_kl_rule_and_ranking_by_youden_j():
    fixed = score_fixed_kl(_runs(), kl_warn=2.5e-3)  # k3 = value * 1e-3, so the same crossings as an envelope of 2.5
    assert fixed["leads"] == [4, 4] and fixed["false_alarms"] == 1
    rows = rank([{"metric": "a", "collapsed_runs": 2, "early": 2, "healthy_runs": 4, "false_alarms": 4,
                  "median_lead": 9},
                 {"metric": "b", "collapsed_runs": 2, "early": 1, "healthy_runs": 4, "false_alarms": 0,
                  "median_lead": 1},
                 {"metric": "c", "collapsed_runs": 0, "early": 0, "healthy_runs": 0, "false_alarms": 0,
                  "median_lead": None}])
    assert [r["metric"] for r in rows] == ["b", "a", "c"] and rows[0]["youden_j"] == 0.5 and rows[2]["youden_j"] is None


def test_command_writes_the_table(tmp_path):
    grid = standard_grid(tmp_path / "g")
    out = tmp_path / "ew"
    r = subprocess.run([sys.executable, "-m", "timbench.cli", "early-warning", str(grid), "--out", str(out)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    doc = json.loads((out / "early_warning.json").read_text())
    assert doc["runs"] > 0 and doc["collapsed"] >= 1
    assert {"rollout_corr/k3_kl", "tim/neg_adv_imbalance"} <= {row["metric"] for row in doc["table"]}
    assert "Regenerate: `timbench early-warning" in (out / "early_warning.md").read_text()


def test_missing_dir_is_one_line(tmp_path):
    r = subprocess.run([sys.executable, "-m", "timbench.cli", "early-warning", str(tmp_path / "nope")],
                       capture_output=True, text=True)
    assert r.returncode != 0 and "not a directory" in r.stderr and "Traceback" not in r.stderr
