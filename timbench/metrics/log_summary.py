"""The part of a run's summary.json computed from its logs, and the check that summary.json still says it.

A manifest proves the files are the ones hashed into it, not that they agree: an edited eval.jsonl re-hashed
into the manifest would still feed its old summary.json to every report. `differences` recomputes the log
aggregates exactly as the run did (`from_logs`, which `rl.rundir.summarize` calls) and names each key whose
value no longer matches. Torch-free: `timbench grid verify` and the report read it.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from .schema import ACCURACY_GREEDY, ACCURACY_T1, FINAL_REWARD_MEAN, K3_KL, MEAN_ABS_DELTA, PROBS_DIFF_MAX, REWARD_MEAN

MEAN_KEYS = (K3_KL, PROBS_DIFF_MAX, MEAN_ABS_DELTA, "drift/diff_mean", "drift/diff_abs_mean")


def _aggregates(rows: list[dict], evals: list[dict]) -> dict:
    """{summary key: a thunk computing it from the logs}; the eval keys only with evals, the rest only with rows."""
    out = {"steps_done": lambda: len(rows)}
    if evals:
        out.update(
            initial_accuracy_t1=lambda: evals[0][ACCURACY_T1],
            final_accuracy_t1=lambda: evals[-1][ACCURACY_T1],
            final_accuracy_greedy=lambda: evals[-1][ACCURACY_GREEDY],
            peak_accuracy_t1=lambda: max(e[ACCURACY_T1] for e in evals),
        )
    if rows:
        for k in MEAN_KEYS:
            out[f"mean/{k}"] = lambda k=k: sum(r[k] for r in rows) / len(rows)
        out[FINAL_REWARD_MEAN] = lambda: rows[-1][REWARD_MEAN]
    return out


def from_logs(rows: list[dict], evals: list[dict]) -> dict:
    """summary.json's log aggregates: steps done, first/last/peak eval accuracy, per-step means, last reward."""
    return {k: f() for k, f in _aggregates(rows, evals).items()}


def _same(a, b) -> bool:
    return a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b))


def differences(d: str | Path) -> list[str]:
    """One line per summary.json key of run dir `d` that its metrics.jsonl/eval.jsonl no longer give ([] when
    all agree). Only keys the summary holds are compared (an older run may lack some)."""
    d = Path(d)
    try:
        summary = json.loads((d / "summary.json").read_text())
        rows = [json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines()]
        evals = [json.loads(line) for line in (d / "eval.jsonl").read_text().splitlines()]
    except (OSError, ValueError):  # a missing or malformed file: the readers name its line (report.results)
        return []
    if not isinstance(summary, dict):
        return [f"{d / 'summary.json'}: not a JSON object"]
    bad = []
    for k, f in _aggregates(rows, evals).items():
        if k not in summary:
            continue
        try:
            value = f()
        except (KeyError, TypeError, AttributeError, ZeroDivisionError):
            value = "nothing (the logs lack it)"
        if not _same(summary[k], value):
            bad.append(
                f"{d / 'summary.json'}: {k} is {summary[k]!r} but the logs give {value!r} (summary.json "
                "does not match metrics.jsonl/eval.jsonl)"
            )
    return bad[:3] + ([f"{d / 'summary.json'}: +{len(bad) - 3} more keys differ from the logs"] if len(bad) > 3 else [])
