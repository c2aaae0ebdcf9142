"""The paper figures with bar panels: F4 (objective drift by the sign of A) and F5 (remedies).

F4 draws the real conditions' bars in a panel of their own: beside the noise sweep's (up to 0.11) their means
(~1e-3) were flat lines at zero. F5 writes each bar's note (seeds, collapses, rejected share) in black beside
the end of its bar and error bar, never inside it: a near-zero bar has no inside, and an error bar crossed the
white in-bar text. Curves and bands come from timbench.report.figures.paper; both functions return Figures.
"""

from __future__ import annotations

from ...metrics.schema import ACCURACY_T1
from ..stats import Interval
from .curves import plt
from .paper import Setting, _figure_legend, draw_band, empty
from .style import legend

NOTE_PAD = 4
"""Points between the end of a bar (or of its error bar) and its note."""


def _err(iv: Interval):
    return None if iv.lo is None else [[iv.mean - iv.lo], [iv.hi - iv.mean]]


def _drift_bars(ax, bars: list[tuple[str, Interval, Interval]], title: str) -> None:
    """Per condition the mean over steps of the A > 0 and the A < 0 drift, with their 95% intervals."""
    for i, (_label, pos, neg) in enumerate(bars):
        for off, iv, color in ((-0.18, pos, "tab:green"), (0.18, neg, "tab:purple")):
            if iv.mean is None:
                continue
            ax.bar(
                i + off,
                iv.mean,
                0.34,
                color=color,
                yerr=_err(iv),
                capsize=2,
                label=("A > 0" if off < 0 else "A < 0") if i == 0 else None,
            )
    ax.set_xticks(range(len(bars)))
    ax.set_xticklabels([b[0] for b in bars], rotation=30, ha="right")
    ax.axhline(0.0, color="gray", linewidth=0.6)
    ax.ticklabel_format(axis="y", style="sci", scilimits=(-3, 3))
    ax.set_title(title)
    legend(ax)


def drift_figure(settings: list[Setting], bars: list[tuple[str, str, Interval, Interval]], title: str, smooth: int):
    """F4: C(r_train) - C(r_rollout) over steps for A > 0 and A < 0 tokens (linear: the drift is signed and
    small, a symlog axis showed decades of noise), and per-condition means: `bars` are (label, kind, A > 0,
    A < 0); real conditions and the noise sweep get a panel each, on their own scales."""
    real = [(lab, p, n) for lab, kind, p, n in bars if kind != "noise"]
    noise = [(lab, p, n) for lab, kind, p, n in bars if kind == "noise"]
    panels = 2 + bool(real) + bool(noise)
    fig, axes = plt.subplots(1, panels, figsize=(4.0 * panels, 3.9), squeeze=False)
    if not any(s.cells for s in settings):
        return empty(fig, title, "finished cells for this figure")
    for ax, key, sign in (
        (axes[0][0], "drift/diff_pos_adv_mean", "A > 0"),
        (axes[0][1], "drift/diff_neg_adv_mean", "A < 0"),
    ):
        for s in settings:
            draw_band(ax, s, key, smooth=smooth, label=ax is axes[0][0])
        ax.axhline(0.0, color="gray", linewidth=0.6)
        ax.set_title(f"C(r_train) - C(r_rollout), tokens with {sign}\n(moving avg {smooth}, 95% band over seeds)")
        ax.set_xlabel("step")
        ax.ticklabel_format(axis="y", style="sci", scilimits=(-3, 3))
    k = 2
    for group, name in ((real, "real conditions"), (noise, "gaussian noise sweep")):
        if group:
            _drift_bars(axes[0][k], group, f"{name}: mean over steps\n(95% interval over seeds; own scale)")
            k += 1
    return _figure_legend(fig, axes[0][0], title)


def _notes_inside(ax, notes: list) -> None:
    """Widen the x axis until every note ends inside it (notes are placed in points, limits are in data)."""
    fig = ax.figure
    renderer = fig.canvas.get_renderer()
    for _ in range(4):
        frame = ax.get_window_extent(renderer)
        right = max((n.get_window_extent(renderer).x1 for n in notes), default=frame.x1)
        if right <= frame.x1:
            return
        lo, hi = ax.get_xlim()
        ax.set_xlim(lo, lo + (hi - lo) * (right - frame.x0 + 12) / (frame.x1 - frame.x0))
        fig.canvas.draw()


def remedy_figure(settings: list[Setting], bars: list[tuple[str, Interval, str]], title: str):
    """F5: relative final accuracy per remedy (95% interval over seeds; `bars` are (label, interval, note)) and
    eval-accuracy bands. A note sits right of its bar's end and of its error bar, in black."""
    fig, axes = plt.subplots(1, 2, figsize=(13.0, 0.9 + 0.42 * max(4, len(bars))), squeeze=False)
    if not bars:
        return empty(fig, title, "finished remedy cells")
    ax = axes[0][0]
    ends = []
    for i, (label, iv, note) in enumerate(bars):
        if iv.mean is None:
            continue
        ax.barh(
            i,
            iv.mean,
            color="tab:gray" if "none" in label.split(" ")[0] else "tab:blue",
            xerr=_err(iv),
            capsize=3,
            hatch="//" if label.endswith("(bypass)") else None,
            edgecolor="white",
        )
        ends.append((i, max(iv.mean, iv.hi if iv.hi is not None else iv.mean), note))
    ax.axvline(1.0, color="black", linewidth=1.2, linestyle="--")
    ax.set_yticks(range(len(bars)))
    ax.set_yticklabels([b[0] for b in bars])
    ax.invert_yaxis()
    ax.set_xlabel("final eval accuracy T=1 / zero-mismatch reference (same seed)")
    ax = axes[0][1]
    for s in settings:
        draw_band(ax, s, ACCURACY_T1, rows="evals")
    ax.set_xlabel("step")
    ax.set_ylabel("eval accuracy T=1")
    legend(ax)
    fig.suptitle(title)
    fig.tight_layout()
    ax = axes[0][0]  # notes last: they are placed in points against the final layout
    notes = [
        ax.annotate(
            note, (end, i), xytext=(NOTE_PAD, 0), textcoords="offset points", va="center", fontsize=7, color="black"
        )
        for i, end, note in ends
    ]
    fig.canvas.draw()
    _notes_inside(ax, notes)
    return fig
