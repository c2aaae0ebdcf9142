"""Seed figures of a grid report: time to collapse as Kaplan-Meier survival curves across seeds.

One panel per mode; one step curve per (condition, remedy) seed group under mismatch: the fraction
of seeds not yet collapsed at each step. Seeds that never collapsed are censored at their last step
(the step budget for a finished run) and marked with a `+`. The legend names each group's collapse
count out of its finished seeds. Coinciding curves are drawn a hair apart (< 0.03) to stay visible.
"""

from __future__ import annotations

from ..seeds import SeedGroup
from .curves import _no_data, plt
from .style import legend


def survival_figure(groups: list[SeedGroup]):
    """(g) Kaplan-Meier time-to-collapse curves over seeds, per mode."""
    shown = [g for g in groups if g.kind != "reference" and g.seeds]
    modes = sorted({g.key["mode"] for g in shown})
    fig, axes = plt.subplots(1, max(len(modes), 1), figsize=(6.0 * max(len(modes), 1), 4.0), squeeze=False)
    if not shown:
        return _no_data(fig, "finished mismatched cells")
    cmap = plt.get_cmap("tab20")
    labels = sorted({(g.key["condition"], g.key["remedy"]) for g in shown})
    colors = {lab: cmap(i % cmap.N) for i, lab in enumerate(labels)}
    for ax, mode in zip(axes[0], modes):
        mine = [g for g in shown if g.key["mode"] == mode]
        for i, g in enumerate(mine):
            lab = (g.key["condition"], g.key["remedy"])
            end = max([t for t, _ in g.survival] + g.censor_steps)
            nudge = (i - (len(mine) - 1) / 2) * 0.008  # curves that coincide (all at 1.0) stay visible
            xs = [t for t, _ in g.survival] + [end]
            ys = [s + nudge for _, s in g.survival] + [g.survival[-1][1] + nudge]
            ax.step(
                xs,
                ys,
                where="post",
                color=colors[lab],
                linewidth=1.4,
                label=f"{lab[0]} / {lab[1]} ({g.collapses}/{g.seeds} collapsed)",
            )
            for t in sorted(set(g.censor_steps)):
                s = next(s for tt, s in reversed(g.survival) if tt <= t) + nudge
                ax.plot([t], [s], marker="+", color=colors[lab], markersize=9, linestyle="none")
        ax.set_title(f"mode={mode}: seeds not collapsed (+ = censored)")
        ax.set_xlabel("step")
        ax.set_ylabel("fraction of seeds")
        ax.set_ylim(-0.05, 1.05)
    fig.tight_layout()
    for ax in axes[0]:
        legend(ax)  # the emptiest corner, else outside: the curves sit at the top and the collapses at the bottom
    return fig
