"""Per-cell figures of a grid report: |delta| distributions and histograms, dose-response (the
relative-accuracy heatmap has its own module, plots_heatmap).

They read the summary rows of `timbench.report.summary` (and, for the |delta| distributions, each
cell's per-step metrics). Collapsed cells are hollow red markers in the dose-response plot.
"""

from __future__ import annotations

import math

import numpy as np

from ...grid.conditions import KINDS
from ...metrics.mismatch import ABS_DELTA_BINS
from ...metrics.schema import ABS_DELTA_HIST, MAX_ABS_DELTA, MEAN_ABS_DELTA, MEAN_MEAN_ABS_DELTA, P99_ABS_DELTA
from ..results import CellRun, column
from .curves import _no_data, condition_colors, plt, representatives
from .style import legend, place_labels

KIND_MARKERS = KINDS  # kind -> marker: the one table of mismatch families (timbench.grid.conditions)
DELTA_KEYS = (MEAN_ABS_DELTA, P99_ABS_DELTA, MAX_ABS_DELTA)
HIST_KEY = ABS_DELTA_HIST


def delta_distribution_figure(cells: list[CellRun]):
    """(e) per-step mean / p99 / max |delta| per condition as box plots on a log axis."""
    reps = representatives(cells)
    fig, axes = plt.subplots(
        max(len(reps), 1),
        1,
        figsize=(max(6.0, 1.6 * max(map(len, reps.values()), default=1) + 2), 3.6 * max(len(reps), 1)),
        squeeze=False,
    )
    if not reps:
        return _no_data(fig, "|delta| data")
    for ax, (mode, group) in zip(axes[:, 0], reps.items()):
        ax.set_yscale("log")
        zero_conds = set()
        for k, key in enumerate(DELTA_KEYS):
            data, pos = [], []
            for i, c in enumerate(group):
                vals = column(c.metrics, key)
                positive = [v for v in vals if v > 0]
                if len(positive) < len(vals):
                    zero_conds.add(c.axes["condition"])
                if positive:
                    data.append(positive)
                    pos.append(i * (len(DELTA_KEYS) + 1) + k)
            if data:
                bp = ax.boxplot(data, positions=pos, widths=0.8, patch_artist=True, manage_ticks=False)
                for patch in bp["boxes"]:
                    patch.set_facecolor(plt.get_cmap("Set2")(k))
        ticks = [i * (len(DELTA_KEYS) + 1) + 1 for i in range(len(group))]
        ax.set_xlim(-1, len(group) * (len(DELTA_KEYS) + 1) - 1)
        legend(
            ax,
            [plt.Rectangle((0, 0), 1, 1, facecolor=plt.get_cmap("Set2")(k)) for k in range(len(DELTA_KEYS))],
            [k.split("/")[-1] for k in DELTA_KEYS],
        )
        ax.set_xticks(ticks, [c.axes["condition"] for c in group], rotation=20, ha="right", fontsize=8)
        ax.set(title=f"per-step |delta| over steps ({mode})", ylabel="|log pi - log mu|")
        if zero_conds:  # exact zeros cannot sit on a log axis; say so instead of dropping them silently
            ax.text(
                0.01,
                0.02,
                ", ".join(sorted(zero_conds)) + ": |delta| = 0 exactly at some or all steps "
                "(not drawable on a log axis)",
                transform=ax.transAxes,
                fontsize=7,
                va="bottom",
            )
    fig.tight_layout()
    return fig


def has_histograms(cells: list[CellRun]) -> bool:
    return any(HIST_KEY in r for c in cells for r in c.metrics)


def delta_histogram_figure(cells: list[CellRun]):
    """(e') |delta| histograms summed over steps from `mismatch/abs_delta_hist` (ABS_DELTA_BINS)."""
    reps, colors = representatives(cells), condition_colors(cells)
    fig, axes = plt.subplots(max(len(reps), 1), 1, figsize=(9.0, 3.6 * max(len(reps), 1)), squeeze=False)
    labels = ["0"] + [f"<{hi:g}" for lo, hi in ABS_DELTA_BINS[1:-1]] + [">=1"]
    for ax, (mode, group) in zip(axes[:, 0], reps.items()):
        width = 0.8 / max(len(group), 1)
        for i, c in enumerate(group):
            total = np.zeros(len(ABS_DELTA_BINS))
            for r in c.metrics:
                h = r.get(HIST_KEY)
                if h is not None:
                    if len(h) != len(ABS_DELTA_BINS):
                        raise ValueError(
                            f"cell {c.id} step {r['step']}: {HIST_KEY} has {len(h)} bins; "
                            f"expected {len(ABS_DELTA_BINS)} (timbench.metrics.mismatch.ABS_DELTA_BINS)"
                        )
                    total += np.asarray(h, dtype=float)
            frac = total / total.sum() if total.sum() else total
            ax.bar(
                np.arange(len(frac)) + i * width,
                frac,
                width=width,
                color=colors[c.axes["condition"]],
                label=c.axes["condition"],
            )
        ax.set_xticks(np.arange(len(labels)) + 0.4 - width / 2, labels, fontsize=7)
        ax.set(title=f"|delta| histogram over all steps ({mode})", ylabel="fraction of tokens")
        legend(ax)
    fig.tight_layout()
    return fig


def dose_response_figure(rows: list[dict]):
    """(f) relative final accuracy against realised mean |delta| (log x) for every cell.

    Marker by condition kind; collapsed cells hollow red; real (non-noise, non-reference) conditions
    annotated by name, noise cells by sigma. Cells with mean |delta| exactly 0 (the reference) sit on
    the left edge with a note, since 0 has no place on a log axis.
    """
    fig, ax = plt.subplots(figsize=(8.0, 5.0))
    ax.set_xscale("log")
    pts = [r for r in rows if r["relative_accuracy_t1"] is not None and r[MEAN_MEAN_ABS_DELTA] is not None]
    if not pts:
        return _no_data(fig, "cells with accuracy and |delta|")
    positive = [r[MEAN_MEAN_ABS_DELTA] for r in pts if r[MEAN_MEAN_ABS_DELTA] > 0]
    left = min(positive) / 10 if positive else 1e-9
    seen_kinds, labelled, texts = set(), [], []
    for r in pts:
        x = r[MEAN_MEAN_ABS_DELTA] or left
        kind = r["kind"] or "?"
        collapsed = bool(r["collapse/collapsed"])
        ax.scatter(
            [x],
            [r["relative_accuracy_t1"]],
            marker=KIND_MARKERS.get(kind, "X"),
            s=60,
            facecolors="none" if collapsed else "C0",
            edgecolors="red" if collapsed else "C0",
            linewidths=1.5,
            label=None if kind in seen_kinds else kind,
            zorder=3,
        )
        seen_kinds.add(kind)
        if kind != "reference":
            labelled.append((x, r["relative_accuracy_t1"]))
            texts.append(
                f"σ={r['noise_sigma']:g}" if kind == "noise" and r["noise_sigma"] is not None else r["condition"]
            )
    if any(not r[MEAN_MEAN_ABS_DELTA] for r in pts):
        ax.axvline(left, color="grey", linestyle=":", linewidth=0.8)
        ax.text(left, ax.get_ylim()[0], " mean |delta| = 0 exactly", fontsize=7, rotation=90, va="bottom")
    ax.scatter([], [], marker="o", facecolors="none", edgecolors="red", label="collapsed (hollow red)")
    ax.axhline(1.0, color="grey", linewidth=0.6)
    ax.set(
        xlabel="realised mean |delta| = mean over steps of mismatch/mean_abs_delta (log)",
        ylabel="final accuracy / reference",
        title="dose-response: where real conditions sit against noise",
    )
    if not math.isfinite(ax.get_ylim()[1]):
        ax.set_ylim(0, 1.5)
    fig.tight_layout()
    labelled, texts = _one_label_each(labelled, texts)
    place_labels(ax, labelled, texts)  # after the layout: labels are placed apart in its final geometry
    legend(ax)
    return fig


def _one_label_each(points: list[tuple[float, float]], texts: list[str]) -> tuple[list, list[str]]:
    """One label per distinct text (a condition's seeds and remedies share a name), on that text's point nearest
    its median (log x): a 75-cell grid gets a dozen readable labels instead of 75 colliding ones."""
    groups: dict[str, list[tuple[float, float]]] = {}
    for pt, text in zip(points, texts):
        groups.setdefault(text, []).append(pt)
    out_pts, out_texts = [], []
    for text, pts in groups.items():
        mx = float(np.median([math.log10(x) for x, _ in pts]))
        my = float(np.median([y for _, y in pts]))
        out_pts.append(min(pts, key=lambda p: (math.log10(p[0]) - mx) ** 2 + (p[1] - my) ** 2))
        out_texts.append(text)
    return out_pts, out_texts
