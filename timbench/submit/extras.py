"""A submitted plug-in's own metrics in the submission: its `remedy_extra/<key>` summary columns, per setting.

summary.csv holds each cell's mean over steps (timbench.report.summary); here they are averaged over the
remedy's finished mismatched cells, overall and per (condition, mode) setting, the unit the paired lines use.
"""

from __future__ import annotations

from ..metrics.schema import REMEDY_EXTRA_PREFIX
from ..report.stats import mean
from ..report.summary import extra_columns


def plugin_metrics(rows: list[dict], remedy: str) -> dict:
    """{key: {"mean", "cells", "by_setting": {"condition/mode": mean}}} of `remedy`'s extra metrics (key without
    the `remedy_extra/` prefix); {} for a remedy that logs none (every built-in)."""
    mine = [r for r in rows if r["remedy"] == remedy and r["kind"] != "reference" and r["status"] == "done"]
    out = {}
    for col in extra_columns(mine):
        have = [r for r in mine if r.get(col) is not None]
        settings = sorted({f"{r['condition']}/{r['mode']}" for r in have})
        out[col[len(REMEDY_EXTRA_PREFIX) :]] = {
            "mean": mean([float(r[col]) for r in have]),
            "cells": len(have),
            "by_setting": {
                s: mean([float(r[col]) for r in have if f"{r['condition']}/{r['mode']}" == s]) for s in settings
            },
        }
    return out


def markdown_lines(metrics: dict) -> list[str]:
    """submission.md lines of `plugin_metrics` (none when it is empty)."""
    if not metrics:
        return []
    lines = ["- plug-in metrics (its own `extra` keys; mean over steps, then over its finished mismatched cells):"]
    for key, m in metrics.items():
        per = "; ".join(f"{s} {v:.4g}" for s, v in m["by_setting"].items())
        lines.append(f"  - `{key}`: {m['mean']:.4g} over {m['cells']} cells ({per})")
    return lines
