"""The leaderboard's forest plot: every remedy's score with its 95% interval on one axis, best first.

A remedy whose cells failed or trained on nothing is marked (hollow red, "k failed") rather than drawn as
a plain score; the submitted remedy (`highlight`) is drawn in orange and bold. Reads
timbench.report.leaderboard.remedy_ranking entries.
"""

from __future__ import annotations

from .curves import _no_data
from .style import plt


def forest_figure(ranked: list[dict], highlight: str | None = None):
    """Remedy scores (final accuracy / reference, capped collapse) with 95% intervals, ranks top to bottom."""
    shown = [e for e in ranked if e["score"] is not None]
    fig, ax = plt.subplots(figsize=(7.5, 0.9 + 0.36 * max(3, len(shown))))
    if not shown:
        return _no_data(fig, "scored remedies")
    for i, e in enumerate(shown):
        iv, mine, bad = e["interval"], e["remedy"] == highlight, e.get("failed", 0) > 0
        color = "tab:orange" if mine else ("tab:red" if bad else "tab:blue")
        if iv.lo is not None:
            ax.plot([max(iv.lo, 0.0), iv.hi], [i, i], color=color, linewidth=2.4 if mine else 1.6)
        ax.plot(
            [iv.mean],
            [i],
            "o",
            markersize=7 if mine else 5.5,
            color=color,
            markerfacecolor="white" if bad else color,
            markeredgewidth=1.5,
        )
        note = f"{iv.mean:.3f}" + (f"  ({e['failed']} failed)" if bad else "")
        ax.annotate(
            note,
            (iv.hi if iv.hi is not None else iv.mean, i),
            xytext=(5, 0),
            textcoords="offset points",
            va="center",
            fontsize=7.5,
            color=color,
        )
    ax.axvline(1.0, color="black", linestyle="--", linewidth=1.0)
    ax.set_yticks(
        range(len(shown)), [e["remedy"] + ("  (submitted)" if e["remedy"] == highlight else "") for e in shown]
    )
    for tick, e in zip(ax.get_yticklabels(), shown):
        if e["remedy"] == highlight:
            tick.set_fontweight("bold")
            tick.set_color("tab:orange")
    ax.invert_yaxis()
    ax.set_xlim(left=0.0)
    ax.set_xlabel("score: final accuracy / zero-mismatch reference (95% interval over seeds; dashed = reference)")
    ax.set_title("remedy scores, best first (hollow red: some cells failed or trained on nothing)")
    fig.tight_layout()
    return fig
