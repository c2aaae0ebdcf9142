"""The leaderboard of a grid (`timbench grid report results/NAME`): leaderboard.md, leaderboard.html, summary.csv and figures/*.png.

Remedy score (the ranking): the mean, over a remedy's finished cells under a mismatched condition
(kind != reference), of final accuracy relative to the zero-mismatch reference cell, where a
collapsed cell counts min(relative accuracy, SCORE_CAP = 0.5): a run that collapsed is never worth
more than half the reference, even if its last eval happened to land high. A cell counts once it is
done, or failed with a collapse (a non-finite loss is the remedy's failure); cells still running,
pending, failed for other reasons, or whose reference has no accuracy yet are listed but not scored.

TIM tolerance of a remedy: the largest synthetic-noise sigma (engine spec `noise=KIND:SIGMA`) such
that none of the remedy's finished noise cells at that sigma or any smaller one collapsed; "< s" when
it collapsed at the smallest sigma s tested, ">= s" when it never collapsed, "-" with no noise cells.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..atomic import atomic_write
from .collapse import rule_from_dict
from .html import render_html
from .results import Grid, load_results
from .summary import summarize, summary_csv

SCORE_CAP = 0.5


@dataclass
class Table:
    title: str
    headers: list[str]
    rows: list[list[str]]
    note: str = ""


def fmt(x, digits: int = 3) -> str:
    if x is None:
        return "-"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, float):
        return "0" if x == 0 else f"{x:.{digits}g}"
    return str(x)


def is_scored(row: dict) -> bool:
    """Finished mismatched cell with a relative accuracy (see the module docstring)."""
    finished = row["status"] == "done" or (row["status"] == "failed" and bool(row["collapse/collapsed"]))
    return row["kind"] != "reference" and finished and row["relative_accuracy_t1"] is not None


def cell_score(row: dict) -> float | None:
    if not is_scored(row):
        return None
    rel = row["relative_accuracy_t1"]
    return min(rel, SCORE_CAP) if row["collapse/collapsed"] else rel


def tim_tolerance(rows: list[dict]) -> str:
    """Rendered TIM tolerance of one remedy's rows (module docstring)."""
    by_sigma: dict[float, list[bool]] = {}
    for r in rows:
        if r["kind"] == "noise" and r["noise_sigma"] is not None and (r["status"] == "done" or r["collapse/collapsed"]):
            by_sigma.setdefault(r["noise_sigma"], []).append(bool(r["collapse/collapsed"]))
    if not by_sigma:
        return "-"
    tol = None
    for sigma in sorted(by_sigma):
        if any(by_sigma[sigma]):
            return f"< {min(by_sigma):g}" if tol is None else f"{tol:g}"
        tol = sigma
    return f">= {tol:g}"


def _mean(xs):
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


SETTING = ("task", "model", "algorithm", "seed", "condition", "mode")
"""What a remedy is applied to: two remedies are compared on the settings both of them ran."""


def shared_settings(rows: list[dict]) -> set[tuple] | None:
    """Settings (SETTING values) every remedy with a scored mismatched cell was scored on; None if none shared.

    A remedy run on an easy condition must not outrank one run only on hard ones, so the
    ranking scores every remedy on the same settings when the grid has any in common.
    """
    per_remedy: dict[str, set[tuple]] = {}
    for r in rows:
        if r["kind"] != "reference" and is_scored(r):
            per_remedy.setdefault(r["remedy"], set()).add(tuple(str(r[k]) for k in SETTING))
    common = set.intersection(*per_remedy.values()) if per_remedy else set()
    return common or None


def remedy_ranking(rows: list[dict]) -> list[dict]:
    """One entry per remedy, best score first (unscored remedies last, then by name)."""
    out = []
    common = shared_settings(rows)
    for remedy in sorted({r["remedy"] for r in rows}):
        mine = [r for r in rows if r["remedy"] == remedy]
        mismatched = [r for r in mine if r["kind"] != "reference"]
        scored = [r for r in mismatched if is_scored(r)
                  and (common is None or tuple(str(r[k]) for k in SETTING) in common)]
        out.append({"remedy": remedy, "score": _mean([cell_score(r) for r in scored]), "cells": len(scored),
                    "collapses": sum(1 for r in scored if r["collapse/collapsed"]),
                    # over the scored cells, so every column of a row describes the same cells
                    "mean_abs_delta": _mean([r["mean/mismatch/mean_abs_delta"] for r in scored]),
                    "mean_k3_kl": _mean([r["mean/rollout_corr/k3_kl"] for r in scored]),
                    "tolerance": tim_tolerance(mine)})
    return sorted(out, key=lambda e: (e["score"] is None, -(e["score"] or 0.0), e["remedy"]))


def _scored_on(rows: list[dict]) -> str:
    common = shared_settings(rows)
    if common is None:
        return "no (condition, mode) setting is shared by every remedy, so each is scored on all its cells"
    names = sorted({f"{s[SETTING.index('condition')]}/{s[SETTING.index('mode')]}" for s in common})
    return f"every remedy is scored on the {len(common)} settings all of them ran ({', '.join(names)})"


def _task_line(rows: list[dict]) -> str:
    from ..tasks import UnknownTaskError, get_task
    parts = []
    for name in sorted({str(r["task"]) for r in rows}):
        try:
            parts.append(f"{name} (version {get_task(name).version})")
        except UnknownTaskError as e:
            raise ValueError(f"grid cell task: {e}") from None
    return "task: " + ", ".join(parts)


def tables(grid: Grid, rows: list[dict], command: str) -> list[Table]:
    stamp = f"{_task_line(rows)}; regenerate with `{command}`"
    ranking = Table(
        "Remedies ranked by score",
        ["rank", "remedy", "score", "collapses/cells", "mean |delta|", "mean k3_kl", "TIM tolerance (sigma)"],
        [[str(i + 1), e["remedy"], fmt(e["score"]), f"{e['collapses']}/{e['cells']}", fmt(e["mean_abs_delta"]),
          fmt(e["mean_k3_kl"]), e["tolerance"]] for i, e in enumerate(remedy_ranking(rows))],
        f"{stamp}. Score: mean over finished mismatched cells of final accuracy / reference, a collapsed "
        f"cell capped at {SCORE_CAP}; {_scored_on(rows)}.")
    varying = [k for k in ("task", "model", "algorithm", "seed") if len({r[k] for r in rows}) > 1]
    cell_rows = []
    for r in rows:
        c = r["collapse/collapsed"]
        collapse = "-" if c is None else (f"collapsed@{r['collapse/step']} ({r['collapse/reason']})" if c else "no")
        cell_rows.append([fmt(r[k]) for k in varying] + [
            r["condition"], fmt(r["kind"]), r["remedy"], r["mode"], r["status"], collapse,
            fmt(r["final_accuracy_t1"]), fmt(r["relative_accuracy_t1"]), fmt(r["mean/mismatch/mean_abs_delta"]),
            fmt(r["mean/rollout_corr/k3_kl"]), fmt(r["cum/drift/diff_mean"]), fmt(r["collapse/kl_lead_steps"])])
    cells = Table(
        "Every cell", varying + ["condition", "kind", "remedy", "mode", "status", "collapse", "final acc T=1",
                                 "rel acc", "mean |delta|", "k3_kl", "cum drift C(r)", "KL lead (steps)"],
        cell_rows, f"{stamp}. cum drift = sum over steps of drift/diff_mean; KL lead = collapse step - first "
                   "step with k3_kl above kl_warn (negative: the KL warned late).")
    return [ranking, cells]


def markdown(title: str, preamble: list[str], tabs: list[Table]) -> str:
    out = [f"# {title}", ""] + [line + "  " for line in preamble] + [""]
    for t in tabs:
        out += [f"## {t.title}", "", t.note, "", "| " + " | ".join(h.replace("|", "\\|") for h in t.headers) + " |",
                "|" + "|".join("---" for _ in t.headers) + "|"]
        out += ["| " + " | ".join(v.replace("|", "\\|") for v in row) + " |" for row in t.rows] + [""]
    return "\n".join(out)


def figures(grid: Grid, rows: list[dict]) -> list[tuple[str, str, object]]:
    """(file name, caption, figure builder) for every figure of the report."""
    # Imported here: matplotlib costs ~1 s, and build_parser imports this module for every command.
    from .plots import drift_figure, kl_grad_figure, reward_accuracy_figure
    from .plots_cells import (delta_distribution_figure, delta_histogram_figure, dose_response_figure,
                              has_histograms, relative_accuracy_heatmap)
    cells = grid.cells
    out = [("reward_accuracy.png", "(a) training reward and eval accuracy per condition vs the zero-mismatch reference",
            lambda: reward_accuracy_figure(cells)),
           ("kl_grad_norm.png", "(b) rollout_corr/k3_kl and actor/grad_norm (log); exact zeros marked at the bottom",
            lambda: kl_grad_figure(cells)),
           ("relative_accuracy_heatmap.png", "(c) final accuracy / reference, condition x remedy, per mode",
            lambda: relative_accuracy_heatmap(rows)),
           ("drift_by_adv_sign.png", "(d) C(r) drift split by advantage sign per condition",
            lambda: drift_figure(cells)),
           ("abs_delta_distribution.png", "(e) per-step mean / p99 / max |delta| per condition (log)",
            lambda: delta_distribution_figure(cells)),
           ("dose_response.png", "(f) dose-response: relative accuracy vs realised mean |delta|",
            lambda: dose_response_figure(rows))]
    if has_histograms(cells):
        out.append(("abs_delta_histogram.png", "(e') |delta| histograms over all steps",
                    lambda: delta_histogram_figure(cells)))
    return out


def write_report(path: str | Path, command: str | None = None) -> dict[str, Path]:
    """Write the report files into the grid dir `path`; returns {name: path written}."""
    grid = load_results(path)
    rows = summarize(grid)
    command = command or f"timbench grid report {path}"
    rule = rule_from_dict(grid.collapse)
    status = {s: sum(1 for r in rows if r["status"] == s) for s in ("done", "failed", "running", "pending")}
    preamble = [_task_line(rows), f"regenerate: `{command}`",
                f"grid {grid.name}: {len(rows)} cells (" + ", ".join(f"{n} {s}" for s, n in status.items()) + ")",
                f"collapse rule (timbench.report.collapse): alpha={rule.alpha}, window={rule.window}, "
                f"smooth={rule.smooth}, grad_spike={rule.grad_spike}, min_peak={rule.min_peak}, kl_warn={rule.kl_warn}"]
    tabs = tables(grid, rows, command)
    written = {"summary.csv": grid.path / "summary.csv"}
    atomic_write(written["summary.csv"], summary_csv(rows))
    from .plots import png_bytes
    pngs = []
    for name, caption, build in figures(grid, rows):
        png = png_bytes(build())
        written[f"figures/{name}"] = grid.path / "figures" / name
        atomic_write(written[f"figures/{name}"], png)
        pngs.append((caption, png))
    title = f"TIM leaderboard: {grid.name}"
    written["leaderboard.md"] = grid.path / "leaderboard.md"
    atomic_write(written["leaderboard.md"], markdown(title, preamble, tabs))
    written["leaderboard.html"] = grid.path / "leaderboard.html"
    atomic_write(written["leaderboard.html"], render_html(title, preamble, tabs, pngs))
    return written
