"""Per-cell drift, mismatch and collapse summary of a grid, and its summary.csv.

One row per cell of cells.json (cells that are not done appear with their status and empty values).
From metrics.jsonl: the effective-objective drift C(r_train) - C(r_rollout) of arXiv 2605.14220 Eq. 5,
cumulative (`cum/drift/*`, sum over steps) and final (`final/drift/*`, mean of the last
FINAL_WINDOW steps); the mean over steps of the mismatch metrics (`mean/...`, verl's names) and of
the remedy metrics every run logs (`rollout_corr/rollout_is_*`, `rollout_corr/rollout_rs_*`); the
running maximum of the exactness metrics; the mean over steps of a plug-in remedy's own metrics (keys the
schema does not know, as `remedy_extra/<key>`, after the fixed columns); the collapse fields of
`timbench.report.collapse` (`collapse/*`); and final accuracy relative to the zero-mismatch
reference cell (`relative_accuracy_t1` = final_accuracy_t1 / the reference's).
"""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path

from ..metrics.schema import (
    ACCURACY_GREEDY,
    K3_KL,
    MAX_ABS_DELTA,
    MEAN_ABS_DELTA,
    PROBS_DIFF_MAX,
    QUANTIZED_ACCURACY_GREEDY,
    REMEDY_EXTRA_PREFIX,
    is_known,
)
from ..metrics.schema import METRIC_NAMES as REMEDY_METRIC_NAMES
from ..spec.keys import parse_spec
from ..util.atomic import atomic_write
from .collapse import CollapseRule, detect_collapse, rule_from_dict
from .results import CellRun, Grid, column, load_results
from .stats import mean

FINAL_WINDOW = 10  # steps averaged for the `final/...` drift values
DRIFT_KEYS = ("drift/diff_mean", "drift/diff_abs_mean", "drift/diff_pos_adv_mean", "drift/diff_neg_adv_mean")
MEAN_KEYS = (MEAN_ABS_DELTA, K3_KL, PROBS_DIFF_MAX)
MAX_KEYS = (PROBS_DIFF_MAX, MAX_ABS_DELTA)  # exactness: 0.0 at every step
REMEDY_KEYS = tuple(sorted(REMEDY_METRIC_NAMES.values()))
"""What every remedy logs (verl's rollout_corr/rollout_is_* and rollout_rs_* names), averaged over steps."""
COLLAPSE_KEYS = {
    "collapsed": "collapse/collapsed",
    "collapse_step": "collapse/step",
    "collapse_reason": "collapse/reason",
    "grad_spike_step": "collapse/grad_spike_step",
    "peak_reward": "collapse/peak_reward",
    "final_reward": "collapse/final_reward",
    "kl_warning_step": "collapse/kl_warning_step",
    "kl_lead_steps": "collapse/kl_lead_steps",
}
ID_COLUMNS = (
    "id",
    "task",
    "model",
    "condition",
    "kind",
    "remedy",
    "mode",
    "algorithm",
    "seed",
    "reference",
    "status",
    "error",
    "steps_done",
    "noise_sigma",
    "eval_n",
)
COLUMNS = (
    ID_COLUMNS
    + (
        "final_accuracy_t1",
        "peak_accuracy_t1",
        "relative_accuracy_t1",
        "final_accuracy_greedy",
        "final_quantized_accuracy_greedy",
    )
    + tuple(COLLAPSE_KEYS.values())
    + tuple(f"{p}/{k}" for k in DRIFT_KEYS for p in ("cum", "final"))
    + tuple(f"mean/{k}" for k in MEAN_KEYS + REMEDY_KEYS)
    + tuple(f"max/{k}" for k in MAX_KEYS)
)


def noise_sigma(condition: dict) -> float | None:
    """Sigma of a synthetic-noise condition (engine spec `noise=gaussian:2.0` -> 2.0), else None.

    The engine spec goes through `timbench.spec.keys.parse_spec`, the one parser of specs, so a bad
    noise value is the same one-line SpecError a run would raise.
    """
    engine = parse_spec(
        condition.get("engine") or None, f"condition {condition.get('name')!r}: engine spec", side="engine"
    )
    return None if engine.noise.kind == "none" else engine.noise.sigma


def plugin_metric_keys(metrics: list[dict]) -> list[str]:
    """Keys of metrics.jsonl rows the schema does not know: a plug-in remedy's own (the loop logs only known ones)."""
    return sorted({k for r in metrics for k in r if not is_known(k)})


def extra_columns(rows: list[dict]) -> list[str]:
    """The `remedy_extra/<key>` columns any of `rows` has, sorted."""
    return sorted({k for r in rows for k in r if k.startswith(REMEDY_EXTRA_PREFIX)})


def summarize_cell(cell: CellRun, rule: CollapseRule) -> dict:
    """The summary row of one cell, without its relative accuracy (that needs the reference row)."""
    ax = cell.axes
    row = {
        "id": cell.id,
        "task": ax.get("task"),
        "model": ax.get("model"),
        "condition": ax["condition"],
        "kind": cell.condition.get("kind"),
        "remedy": ax["remedy"],
        "mode": ax["mode"],
        "algorithm": ax.get("algorithm"),
        "seed": ax.get("seed"),
        "reference": cell.reference,
        "status": cell.status,
        "error": cell.error,
        "steps_done": len(cell.metrics),
        "noise_sigma": noise_sigma(cell.condition),
        "eval_n": cell.config.get("eval_n"),
    }
    row.update({c: None for c in COLUMNS if c not in row})
    m = cell.metrics
    if not m and not cell.summary:  # nothing ran yet (a failure at step 0 still has a summary)
        return row
    c = detect_collapse(m, cell.evals, cell.summary, rule)
    row.update({COLLAPSE_KEYS[k]: c[k] for k in COLLAPSE_KEYS})
    row["final_accuracy_t1"], row["peak_accuracy_t1"] = c["final_accuracy_t1"], c["peak_accuracy_t1"]
    # Greedy accuracy of the fp32 policy and, for a quantized engine, of the quantized policy itself at the
    # last eval: their gap is what quantization costs the policy, apart from what mismatch cost training.
    last = cell.evals[-1] if cell.evals else {}
    row["final_accuracy_greedy"] = last.get(ACCURACY_GREEDY)
    row["final_quantized_accuracy_greedy"] = last.get(QUANTIZED_ACCURACY_GREEDY)
    for k in DRIFT_KEYS:
        xs = column(m, k)
        row[f"cum/{k}"] = math.fsum(xs) if xs else None
        row[f"final/{k}"] = mean(column(m[-FINAL_WINDOW:], k))
    for k in MEAN_KEYS + REMEDY_KEYS:
        row[f"mean/{k}"] = mean(column(m, k))
    for k in MAX_KEYS:
        xs = column(m, k)
        row[f"max/{k}"] = max(xs) if xs else None
    for k in plugin_metric_keys(m):  # numbers only: a plug-in's metrics are checked finite (remedies.base)
        row[f"{REMEDY_EXTRA_PREFIX}{k}"] = mean([float(r[k]) for r in m if isinstance(r.get(k), (int, float))])
    return row


def summarize(grid: Grid) -> list[dict]:
    """One summary row per cell of a loaded grid, in cells.json order."""
    rule = rule_from_dict(grid.collapse)
    rows = [summarize_cell(c, rule) for c in grid.cells]
    by_id = {r["id"]: r for r in rows}
    for r in rows:
        ref = by_id.get(r["reference"]) if r["reference"] else (r if r["kind"] == "reference" else None)
        acc = r["final_accuracy_t1"]
        ref_acc = ref["final_accuracy_t1"] if ref is not None and ref["status"] == "done" else None
        r["relative_accuracy_t1"] = acc / ref_acc if acc is not None and ref_acc else None
    return rows


def summarize_grid(path: str | Path) -> list[dict]:
    """Read results/NAME and return one summary row per cell (see the module docstring)."""
    return summarize(load_results(path))


def _cell_text(v) -> str:
    if v is None:
        return ""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return repr(v)  # shortest round-trip form: deterministic and lossless
    return str(v)


def csv_text(rows: list[dict], columns: tuple) -> str:
    """CSV text of `rows`: `columns` first, then any other key a row has, sorted; floats in repr form."""
    columns = tuple(columns) + tuple(sorted({k for r in rows for k in r if k not in columns}))
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(columns)
    for r in rows:
        w.writerow([_cell_text(r.get(k)) for k in columns])
    return buf.getvalue()


def summary_csv(rows: list[dict]) -> str:
    """summary.csv: the fixed COLUMNS, then any other column a row has, sorted."""
    return csv_text(rows, COLUMNS)


def write_summary_csv(rows: list[dict], path: str | Path) -> None:
    atomic_write(path, summary_csv(rows))
