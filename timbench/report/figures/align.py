"""The |delta| axis of an alignment table: every condition's mean engine-trainer gap on one log scale.

One panel per model, one marker per condition (shape by kind, as in the grid's dose-response plot),
so real conditions (precision, kernels, TP, low-precision formats) are placed against the synthetic
noise doses on the same axis. Rows with a gap of exactly 0 sit on the left edge, labelled, since 0 has
no place on a log axis.
"""

from __future__ import annotations

from pathlib import Path

from ...util.atomic import atomic_write
from .cells import KIND_MARKERS
from .style import legend, plt, png_bytes


def delta_axis_figure(rows: list[dict], command: str):
    models = list(dict.fromkeys(r["model_name"] for r in rows))
    names = list(dict.fromkeys(r["condition"] for r in rows))
    fig, axes = plt.subplots(
        1, len(models), figsize=(4.2 * len(models) + 3.5, 0.28 * len(names) + 1.6), sharey=True, squeeze=False
    )
    positive = [r["mean_abs_diff"] for r in rows if r["mean_abs_diff"] > 0]
    left = min(positive) / 10 if positive else 1e-9
    y = {n: i for i, n in enumerate(reversed(names))}
    for ax, m in zip(axes[0], models):
        seen = set()
        for r in rows:
            if r["model_name"] != m:
                continue
            kind = r.get("kind", "?")
            ax.scatter(
                [r["mean_abs_diff"] or left],
                [y[r["condition"]]],
                marker=KIND_MARKERS.get(kind, "X"),
                color=f"C{sorted(KIND_MARKERS).index(kind) % 10}" if kind in KIND_MARKERS else "k",
                label=None if kind in seen else kind,
                zorder=3,
            )
            seen.add(kind)
        ax.set_xscale("log")
        ax.axvline(left, color="grey", linestyle=":", linewidth=0.8)
        ax.set(title=m, xlabel="mean |delta| over tokens (log; dotted = exactly 0)")
        ax.grid(axis="x", linewidth=0.3)
    axes[0][0].set_yticks(range(len(names)), list(reversed(names)))
    fig.suptitle(f"engine-trainer gap by condition ({command})")
    fig.tight_layout()
    for ax in axes[0]:
        legend(ax)  # gaps cluster at 0, 1e-6 and 1e-2..1: the emptiest corner, else outside
    return fig


def save_delta_axis(rows: list[dict], path: Path, command: str) -> None:
    atomic_write(path, png_bytes(delta_axis_figure(rows, command)))
