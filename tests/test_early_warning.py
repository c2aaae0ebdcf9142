"""`timbench early-warning`: the leave-one-seed-out envelope rule scored on hand-built runs, the fixed KL rule,
the ranking by Youden's J, and the command on a fabricated grid dir."""

from __future__ import annotations

import json
import subprocess
import sys

from gridfab import standard_grid

from timbench.studies.early_warning import Candidate, Run, rank, score_candidate, score_fixed_kl, warning_step
from timbench.studies.early_warning_md import headline

KEY = "m"


def _run(seed, values, collapse=None, key=KEY, kind=""):
    return Run(
        "g",
        f"c{seed}{collapse}{kind}",
        seed,
        collapse,
        None,
        list(range(len(values))),
        [{key: v, "rollout_corr/k3_kl": v * 1e-3} for v in values],
        kind,
    )


def _healthy(seed, v, sign=1):
    return _run(seed, [sign * (v + 0.5 * (i % 2)) for i in range(12)])  # max v + 0.5, rise 0.5 after step 0


def test_warning_step_comes_after_step_0_or_from_a_within_run_change():
    series = [(0, 5.0), (1, 5.0), (2, 6.0), (3, 9.0)]
    # outside the level envelope 4 at step 0: flagged, not warned by level; its rise 9 - 5 > 2 warns at step 3
    assert warning_step(series, 4.0, 2.0) == (3, True)
    assert warning_step(series, 4.0, None) == (None, True)
    assert warning_step(series, 5.5, 10.0) == (2, False)  # inside at step 0: the level crossing at step 2
    assert warning_step([(0, 9.0), (1, 1.0)], 4.0, 2.0) == (None, True)  # step 0 itself never warns


def test_envelope_from_the_other_real_seeds_gives_leads_and_no_step0_alarms_by_hand():
    # Healthy seeds 0, 1, 2 alternate v, v + 0.5 (v = 1, 2, 3): level envelope max, change envelope 0.5.
    # Collapsed seed 0 (3, then 4 from step 7; collapse 10) vs seeds 1-2 (level 3.5, rise 0.5): warned at 7, lead 3.
    # Collapsed seed 2 (flat 5) vs seeds 0-1 (level 2.5): outside at step 0, never rises: flagged, missed.
    # Healthy seed 2 starts at 3 > 2.5 (seeds 0-1): flagged at step 0, not a false alarm (the old rule's one).
    # A collapse at step 1 is too soon. The synthetic-noise run (100, 102, ...) does not calibrate (with it, its
    # level and its rise of 2 would hide seed 0's warning); judged, it rises 2 > 0.5 after step 0: a false alarm.
    runs = [
        _healthy(0, 1.0),
        _healthy(1, 2.0),
        _healthy(2, 3.0),
        _run(0, [3.0] * 7 + [4.0] * 5, collapse=10),
        _run(2, [5.0] * 12, collapse=10),
        _run(1, [0.0] * 12, collapse=1),
        _run(1, [100.0, 102.0] * 6, kind="noise"),
    ]
    r = score_candidate(Candidate(KEY, 1, "test"), runs)
    assert (r["collapsed_runs"], r["early"], r["late"], r["missed"], r["too_soon"]) == (2, 1, 0, 1, 1)
    assert r["leads"] == [3] and r["flagged_at_step0"] == 1
    assert (r["false_alarms"], r["healthy_runs"]) == (1, 4)
    with_noise = score_candidate(Candidate(KEY, 1, "test"), runs, calibration=runs)  # noise would raise the level
    assert with_noise["early"] == 0
    fall = score_candidate(
        Candidate(KEY, -1, "test"),
        [_healthy(s, v, sign=-1) for s, v in ((0, 1.0), (1, 2.0), (2, 3.0))]
        + [_run(0, [0.0] * 7 + [-9.0] * 5, collapse=10)],
    )
    assert fall["leads"] == [3] and fall["direction"] == "fall"  # a falling metric, mirrored: the same verdict


def test_late_and_missed_and_unlogged():
    runs = [
        _run(0, [1.0] * 12),
        _run(1, [1.0] * 12),
        _run(1, [0.0] * 5 + [9.0] * 7, collapse=5),
        _run(1, [0.0] * 12, collapse=8),
        _run(0, [1.0] * 12, collapse=3, key="other"),
    ]
    r = score_candidate(Candidate(KEY, 1, "test"), runs)
    assert (r["early"], r["late"], r["missed"]) == (0, 1, 1)  # the warning at the collapse step is late, not early
    assert r["collapsed_runs"] == 2  # the run that does not log the metric is not scored on it


def test_fixed_kl_rule_and_ranking_by_youden_j():
    runs = [
        _run(0, [1.0] * 12),
        _run(1, [3.0] * 12),
        _run(2, [0.5 * s for s in range(12)], collapse=10),
        _run(3, [3.0] * 12, collapse=10),
    ]
    fixed = score_fixed_kl(runs, kl_warn=2.5e-3)  # k3 = value * 1e-3: crossings of 2.5 in the values
    # 0.5 s > 2.5 first at s = 6: lead 4; the runs at 3.0 from step 0 are flagged, neither warned nor false alarms
    assert fixed["leads"] == [4] and fixed["missed"] == 1 and fixed["flagged_at_step0"] == 1
    assert fixed["false_alarms"] == 0
    rows = rank(
        [
            {"metric": "a", "collapsed_runs": 2, "early": 2, "healthy_runs": 4, "false_alarms": 4, "median_lead": 9},
            {"metric": "b", "collapsed_runs": 2, "early": 1, "healthy_runs": 4, "false_alarms": 0, "median_lead": 1},
            {"metric": "c", "collapsed_runs": 0, "early": 0, "healthy_runs": 0, "false_alarms": 0, "median_lead": None},
        ]
    )
    assert [r["metric"] for r in rows] == ["b", "a", "c"] and rows[0]["youden_j"] == 0.5 and rows[2]["youden_j"] is None
    assert rows[2]["verdict"] == "not tested" and "too few runs" in rows[1]["not_tested"]  # 2/2 vs 0/4: p 0.07


def test_headline_says_plainly_when_no_metric_warns():
    real = {"runs": 10, "collapsed": 4, "collapsed_by_step8": 3, "warns": []}
    assert headline(real, [{}] * 15).startswith("**No metric warns on real conditions**: none of the 15")
    assert "3 of them by step 8" in headline(real, [{}] * 15)
    assert headline(real | {"warns": ["m"]}, [{}] * 15).startswith("**1 of 15 candidates warn on real conditions**")


def test_command_writes_the_table(tmp_path):
    grid = standard_grid(tmp_path / "g")
    out = tmp_path / "ew"
    r = subprocess.run(
        [sys.executable, "-m", "timbench.cli", "early-warning", str(grid), "--out", str(out)],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    doc = json.loads((out / "early_warning.json").read_text())
    assert doc["runs"] > 0 and doc["collapsed"] >= 1
    assert {"rollout_corr/k3_kl", "tim/neg_adv_imbalance"} <= {row["metric"] for row in doc["table"]}
    assert all(row["verdict"] in ("warns", "does not warn", "not tested") for row in doc["table"])
    assert doc["kinds"] and all(k["kind"] != "noise" for k in doc["kinds"][:-1])  # synthetic noise comes last
    assert "on real conditions" in (out / "early_warning.md").read_text()
    assert "Regenerate: `timbench early-warning" in (out / "early_warning.md").read_text()


def test_missing_dir_is_one_line(tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "timbench.cli", "early-warning", str(tmp_path / "nope")], capture_output=True, text=True
    )
    assert r.returncode != 0 and "not a directory" in r.stderr and "Traceback" not in r.stderr
