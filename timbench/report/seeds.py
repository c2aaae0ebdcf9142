"""Seed aggregation: cells that differ only by seed, summarized as means with 95% intervals.

A group is one (task, model, condition, remedy, mode, algorithm); its members are the per-cell
summary rows (timbench.report.summary) of its seeds that finished (done, or failed with a collapse).
For each group (intervals from timbench.report.stats):

- final / peak accuracy T=1: mean over seeds with a Student t interval (clipped to [0, 1]); with one
  seed, the eval-set Wilson interval (eval_n problems) on that seed's accuracy.
- relative accuracy, paired by seed: each seed's accuracy over the same seed's reference cell
  (common random numbers: same warm start, prompts and sampler keys), then mean and t interval;
  with one seed, the Wilson interval of its accuracy divided by the reference's accuracy.
- mean |delta|, k3_kl, cumulative drift: mean and t interval over seeds (no interval with one seed).
- collapse rate: collapsed seeds / finished seeds with a Wilson interval.
- time to collapse: Kaplan-Meier survival over seeds, a seed that did not collapse censored at its
  last step (the step budget for a finished run).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..metrics.schema import MEAN_K3_KL, MEAN_MEAN_ABS_DELTA
from .stats import Interval, clip, kaplan_meier, mean_interval, median_survival, wilson

GROUP = ("task", "model", "condition", "remedy", "mode", "algorithm")
"""What a seed group shares: every axis but the seed."""
MEAN_METRICS = {"mean_abs_delta": MEAN_MEAN_ABS_DELTA, "k3_kl": MEAN_K3_KL, "cum_drift": "cum/drift/diff_mean"}
"""Group field -> the summary column averaged over seeds."""


NOTHING_TRAINED = "remedy masked every token at every step (nothing was trained)"
"""The error of a cell whose remedy rejected every token at every step (`timbench track run` and
`timbench submit` mark such cells failed): an outcome of the remedy, scored like a collapse."""


def trained_nothing(row: dict) -> bool:
    return row["status"] == "failed" and row.get("error") == NOTHING_TRAINED


def is_finished(row: dict) -> bool:
    """Done, or failed with a collapse (a non-finite loss is an outcome, not a broken run) or because the
    remedy trained on nothing (also an outcome of the remedy)."""
    return (
        row["status"] == "done"
        or (row["status"] == "failed" and bool(row["collapse/collapsed"]))
        or trained_nothing(row)
    )


def group_key(row: dict) -> tuple:
    return tuple(str(row[k]) for k in GROUP)


def accuracy_interval(values: list[float], eval_n: int | None) -> Interval:
    """t interval over seeds; with one seed, the Wilson interval of that accuracy on eval_n problems."""
    if len(values) == 1 and eval_n:
        return wilson(values[0] * eval_n, eval_n)
    return clip(mean_interval(values), 0.0, 1.0)  # a t interval can leave [0, 1]; accuracy cannot


@dataclass
class SeedGroup:
    """One group of cells that differ only by seed, and its statistics."""

    key: dict
    """The GROUP values (task, model, condition, remedy, mode, algorithm)."""
    kind: str | None
    """Condition kind (reference, precision, noise, ...)."""
    rows: list[dict]
    """Every member's summary row (finished or not), in seed order."""
    eval_n: int | None
    """Eval-set size of the members (None when they differ or are unknown)."""
    seeds: int = 0
    """Members that finished (the n of every interval)."""
    final_accuracy: Interval = field(default_factory=lambda: Interval(None))
    peak_accuracy: Interval = field(default_factory=lambda: Interval(None))
    relative_accuracy: Interval = field(default_factory=lambda: Interval(None))
    greedy_accuracy: Interval = field(default_factory=lambda: Interval(None))
    """Final greedy accuracy of the fp32 policy."""
    quantized_greedy_accuracy: Interval = field(default_factory=lambda: Interval(None))
    """Final greedy accuracy of the quantized policy (quantized engines only)."""
    metrics: dict[str, Interval] = field(default_factory=dict)
    """MEAN_METRICS name -> interval over seeds."""
    collapses: int = 0
    collapse_rate: Interval = field(default_factory=lambda: Interval(None))
    survival: list[tuple[int, float]] = field(default_factory=list)
    """Kaplan-Meier curve of time to collapse [(step, fraction not collapsed)]."""
    censor_steps: list[int] = field(default_factory=list)
    """Steps at which seeds that never collapsed were last seen (marked on the survival figure)."""
    median_collapse_step: int | None = None


def _eval_n(rows: list[dict]) -> int | None:
    ns = {r.get("eval_n") for r in rows}
    return ns.pop() if len(ns) == 1 else None


def _relative(rows: list[dict], ref_by_id: dict[str, dict], eval_n: int | None) -> Interval:
    pairs = [
        (r["final_accuracy_t1"], ref_by_id[r["reference"]]["final_accuracy_t1"])
        for r in rows
        if r["reference"] in ref_by_id and r["final_accuracy_t1"] is not None
    ]
    pairs = [(a, b) for a, b in pairs if b]  # a reference at accuracy 0 has no ratio
    if len(pairs) == 1 and eval_n:
        a, b = pairs[0]
        w = wilson(a * eval_n, eval_n)
        return Interval(a / b, w.lo / b, w.hi / b, 1)
    return clip(mean_interval([a / b for a, b in pairs]), 0.0)


def seed_groups(rows: list[dict]) -> list[SeedGroup]:
    """One SeedGroup per GROUP value, in first-appearance order of the summary rows."""
    order: dict[tuple, list[dict]] = {}
    for r in rows:
        order.setdefault(group_key(r), []).append(r)
    by_id = {r["id"]: r for r in rows}
    # A reference counts for pairing only once it finished (as in the per-cell relative accuracy).
    ref_by_id = {i: r for i, r in by_id.items() if is_finished(r) and r["final_accuracy_t1"] is not None}
    out = []
    for key, members in order.items():
        members = sorted(members, key=lambda r: (r["seed"] is None, r["seed"] or 0))
        done = [r for r in members if is_finished(r)]
        eval_n = _eval_n(members)
        g = SeedGroup(dict(zip(GROUP, key)), members[0]["kind"], members, eval_n, seeds=len(done))
        if done:
            g.final_accuracy = accuracy_interval(
                [r["final_accuracy_t1"] for r in done if r["final_accuracy_t1"] is not None], eval_n
            )
            g.peak_accuracy = accuracy_interval(
                [r["peak_accuracy_t1"] for r in done if r["peak_accuracy_t1"] is not None], eval_n
            )
            for attr, col in (
                ("greedy_accuracy", "final_accuracy_greedy"),
                ("quantized_greedy_accuracy", "final_quantized_accuracy_greedy"),
            ):
                vals = [r[col] for r in done if r.get(col) is not None]
                if vals:
                    setattr(g, attr, accuracy_interval(vals, eval_n))
            if g.kind == "reference":
                g.relative_accuracy = Interval(1.0, 1.0, 1.0, len(done)) if g.final_accuracy.mean else Interval(None)
            else:
                g.relative_accuracy = _relative(done, ref_by_id, eval_n)
            g.metrics = {
                name: mean_interval([r[col] for r in done if r.get(col) is not None])
                for name, col in MEAN_METRICS.items()
            }
            events = [bool(r["collapse/collapsed"]) for r in done]
            times = [int(r["collapse/step"]) if e else int(r["steps_done"]) for r, e in zip(done, events)]
            g.collapses = sum(events)
            g.collapse_rate = wilson(g.collapses, len(done))
            g.survival = kaplan_meier(times, events)
            g.censor_steps = [t for t, e in zip(times, events) if not e]
            g.median_collapse_step = median_survival(g.survival)
        out.append(g)
    return out


def group_csv_row(g: SeedGroup) -> dict:
    """A flat row for seeds.csv: the group key, seed counts, every mean with its interval bounds."""
    row = {**g.key, "kind": g.kind, "seeds": g.seeds, "cells": len(g.rows), "eval_n": g.eval_n}
    parts = {
        "final_accuracy_t1": g.final_accuracy,
        "peak_accuracy_t1": g.peak_accuracy,
        "relative_accuracy_t1": g.relative_accuracy,
        "final_accuracy_greedy": g.greedy_accuracy,
        "quantized_accuracy_greedy": g.quantized_greedy_accuracy,
        "collapse_rate": g.collapse_rate,
        **g.metrics,
    }
    for name, iv in parts.items():
        row[name], row[f"{name}_lo"], row[f"{name}_hi"] = iv.mean, iv.lo, iv.hi
    row["collapses"] = g.collapses
    row["median_collapse_step"] = g.median_collapse_step
    return row
