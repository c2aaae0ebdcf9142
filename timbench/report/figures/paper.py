"""The paper figures (F1-F5 and the dose-response) with seed bands: mean and 95% interval across seeds.

Each curve is one setting (condition, remedy, mode) of a grid; its band is the Student t interval of the
per-step mean over the setting's seeds (timbench.report.stats.mean_interval), drawn only at steps every
seed reached. Training reward is smoothed per seed first with the collapse rule's trailing moving average
(the same curve the rule reads). On log axes mean and band are taken over log10 values (a geometric
mean over seeds and its interval) and an exact 0 is drawn at LOG_FLOOR, the bottom; on linear axes a band
is clipped to the quantity's domain (`DOMAINS`: a rate stays in [0, 1], a norm >= 0). Sizes, fonts and
legend placement come from timbench.report.figures.style. The figure functions take `Setting`s built by
timbench.studies.paper and return matplotlib Figures; F4 and F5, whose bar panels need more care, are in
timbench.report.figures.paper_bars.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ...metrics.schema import ACCURACY_T1, GRAD_NORM, K3_KL, REWARD_MEAN
from ..collapse import moving_average
from ..results import CellRun
from ..stats import Interval, mean_interval
from .curves import _no_data, plt
from .style import BAND_ALPHA, clip_band, place_labels

REWARD = REWARD_MEAN
DOMAINS = {REWARD: (0.0, 1.0), ACCURACY_T1: (0.0, 1.0), GRAD_NORM: (0.0, None), K3_KL: (0.0, None)}
"""Metric -> (lowest, highest) value it can take; a linear band is clipped to it (None: unbounded)."""
LOG_FLOOR = 1e-9
"""Smallest value drawn on a log axis; exact zeros and negative band bounds sit here."""


@dataclass
class Setting:
    """One curve: the cells of one (condition, remedy, mode) that finished, one per seed."""

    label: str
    cells: list[CellRun]
    color: object = "black"
    style: str = "-"
    summary: list[dict] = field(default_factory=list)
    """The cells' summary rows (timbench.report.summary), same order."""


def seed_band(
    cells: list[CellRun], key: str, rows: str = "metrics", smooth: int = 1, transform=None
) -> tuple[list[int], list[Interval]]:
    """Steps every seed logged `key` at, and the interval across seeds of each step's value."""
    per_seed = []
    for c in cells:
        src = c.metrics if rows == "metrics" else c.evals
        pts = [(r["step"], float(r[key])) for r in src if r.get(key) is not None]
        if not pts:
            continue
        steps, vals = [p[0] for p in pts], [p[1] for p in pts]
        if smooth > 1:
            vals = moving_average(vals, smooth)
        if transform is not None:
            vals = transform(vals)
        per_seed.append(dict(zip(steps, vals)))
    if not per_seed:
        return [], []
    common = sorted(set.intersection(*(set(d) for d in per_seed)))
    return common, [mean_interval([d[s] for d in per_seed]) for s in common]


def _log10(vals: list[float]) -> list[float]:
    return [math.log10(max(v, LOG_FLOOR)) if v == v else v for v in vals]


def draw_band(
    ax,
    s: Setting,
    key: str,
    rows: str = "metrics",
    smooth: int = 1,
    log: bool = False,
    transform=None,
    label: bool = True,
) -> None:
    """One setting's mean and 95% band; on a log axis both are taken over log10 values (a geometric mean and
    its interval, which stays positive), with exact zeros at LOG_FLOOR."""
    tf = transform
    if log:
        tf = (lambda v: _log10(transform(v))) if transform is not None else _log10
    steps, ivs = seed_band(s.cells, key, rows, smooth, tf)
    if not steps:
        return
    back = (lambda x: 10.0**x) if log else (lambda x: x)
    mean = [back(iv.mean) for iv in ivs]
    lo = [back(iv.mean if iv.lo is None else iv.lo) for iv in ivs]
    hi = [back(iv.mean if iv.hi is None else iv.hi) for iv in ivs]
    if not log and transform is None:
        lo, hi = clip_band(lo, hi, DOMAINS.get(key, (None, None)))
    n = min(iv.n for iv in ivs)
    ax.plot(
        steps,
        mean,
        s.style,
        color=s.color,
        linewidth=1.6 if s.color == "black" else 1.2,
        label=f"{s.label} (n={n})" if label else None,
    )
    ax.fill_between(steps, lo, hi, color=s.color, alpha=BAND_ALPHA, linewidth=0)
    if log:
        ax.set_yscale("log")


def empty(fig, title: str, what: str):
    """A figure with nothing to draw still carries its title (and the verdict line under it)."""
    fig.suptitle(title)
    return _no_data(fig, what)


def _panels(settings: list[Setting], panels: list[tuple], title: str, width: float = 4.6):
    """One row of panels; each panel (ylabel, key, rows, smooth, log, transform)."""
    fig, axes = plt.subplots(1, len(panels), figsize=(width * len(panels), 3.6), squeeze=False)
    if not any(s.cells for s in settings):
        return empty(fig, title, "finished cells for this figure")
    for i, (ax, (ylabel, key, rows, smooth, log, transform)) in enumerate(zip(axes[0], panels)):
        for s in settings:
            draw_band(ax, s, key, rows, smooth, log, transform, label=i == 0)
        ax.set_xlabel("step")
        ax.set_ylabel(ylabel)
    return _figure_legend(fig, axes[0][0], title)


def _figure_legend(fig, ax, title: str, ncol: int = 3):
    """One legend for a row of panels that share their curves, below the panels (never on the data)."""
    handles, labels = ax.get_legend_handles_labels()
    fig.suptitle(title)
    fig.tight_layout()
    if handles:
        rows = -(-len(handles) // ncol)
        fig.subplots_adjust(bottom=0.12 + 0.065 * rows)
        fig.legend(handles, labels, loc="lower center", ncol=ncol, frameon=False)
    return fig


def curves_figure(settings: list[Setting], title: str, smooth: int):
    """F1: training reward (smoothed), eval accuracy T=1, K3 KL (log), grad norm (log)."""
    return _panels(
        settings,
        [
            (f"training reward (moving avg {smooth})", REWARD, "metrics", smooth, False, None),
            ("eval accuracy T=1", ACCURACY_T1, "evals", 1, False, None),
            ("rollout_corr/k3_kl (log; 0 drawn at 1e-9)", K3_KL, "metrics", 1, True, None),
            ("actor/grad_norm (0 = nothing to learn)", GRAD_NORM, "metrics", 1, False, None),
        ],
        title,
    )


def modes_figure(settings: list[Setting], title: str, smooth: int):
    """F2: reward, eval accuracy, grad norm (log) and the PPO loss, recompute (solid) vs bypass (dashed)."""
    return _panels(
        settings,
        [
            (f"training reward (moving avg {smooth})", REWARD, "metrics", smooth, False, None),
            ("eval accuracy T=1", ACCURACY_T1, "evals", 1, False, None),
            ("actor/grad_norm (0 = nothing to learn)", GRAD_NORM, "metrics", 1, False, None),
            ("actor/pg_loss", "actor/pg_loss", "metrics", 1, False, None),
        ],
        title,
    )


def _relative_to_start(vals: list[float], smooth: int = 1, first: int = 5) -> list[float]:
    """The trailing moving average over `smooth` steps of `vals`, divided by the mean of its first `first` raw
    values: the quantity the F3 rule (timbench.studies.paper_claims.kl_alarm_step) compares with KL_RISE."""
    base = math.fsum(vals[:first]) / max(1, len(vals[:first]))
    return [v / base if base > 0 else float("nan") for v in moving_average(vals, smooth)]


def _seed_curve(cell: CellRun, key: str, transform) -> tuple[list[int], list[float]]:
    pts = [(r["step"], float(r[key])) for r in cell.metrics if r.get(key) is not None]
    return [p[0] for p in pts], transform([p[1] for p in pts]) if pts else []


def kl_warning_figure(settings: list[Setting], title: str, smooth: int, threshold: float | None = None):
    """F3: per setting, smoothed reward (left) and K1 / K3 relative to their first 5 steps (right, log), with the
    warning level `threshold` (the rule's KL_RISE) as a dotted line. When some but not all seeds collapsed, each
    collapsed seed's own reward and K3 are drawn too (thin): the mean over seeds would average its fall away."""
    n = max(1, len(settings))
    fig, axes = plt.subplots(1, n, figsize=(4.4 * n, 3.9), squeeze=False)
    if not settings:
        return empty(fig, title, "collapsed or degraded settings")
    twins = []
    k3_rel = lambda v: _relative_to_start(v, smooth)  # noqa: E731
    for ax, s in zip(axes[0], settings):
        draw_band(ax, Setting("reward (mean over seeds)", s.cells, "black"), REWARD, smooth=smooth)
        ax.set_ylabel(f"training reward (moving avg {smooth})")
        ax.set_xlabel("step")
        right = ax.twinx()
        draw_band(right, Setting("k3_kl / first 5 steps", s.cells, "tab:red"), K3_KL, log=True, transform=k3_rel)
        draw_band(
            right,
            Setting("|kl| / first 5 steps", s.cells, "tab:blue", "--"),
            "rollout_corr/kl",
            log=True,
            transform=lambda v: _relative_to_start([abs(x) for x in v], smooth),
        )
        if threshold is not None:
            right.axhline(
                threshold,
                color="tab:red",
                linestyle=":",
                linewidth=1.2,
                label=f"KL warning level ({threshold:g}x its first 5 steps)",
            )
        right.set_ylabel("KL relative to its first 5 steps (log)")
        right.grid(False)
        fell = [r for r in s.summary if r.get("collapse/collapsed") and r.get("collapse/step") is not None]
        by_seed = {c.axes.get("seed"): c for c in s.cells}
        for r in fell:
            ax.axvline(r["collapse/step"], color="gray", linestyle=":", linewidth=1)
            if len(fell) < len(s.summary) and by_seed.get(r["seed"]):  # a minority: the mean hides it
                cell = by_seed[r["seed"]]
                ax.plot(
                    *_seed_curve(cell, REWARD, lambda v: moving_average(v, smooth)),
                    color="black",
                    linewidth=0.8,
                    alpha=0.7,
                    linestyle=(0, (4, 1.5)),
                    label=f"seed {r['seed']} reward (collapsed at step {r['collapse/step']})",
                )
                right.plot(
                    *_seed_curve(cell, K3_KL, k3_rel),
                    color="tab:red",
                    linewidth=0.8,
                    alpha=0.7,
                    linestyle=(0, (4, 1.5)),
                    label=f"seed {r['seed']} k3_kl / first 5 steps",
                )
        ax.set_title(f"{s.label}: {len(fell)}/{len(s.summary)} seeds collapsed\n(dotted: a seed's collapse step)")
        twins.append(right)
    # the same curves in every panel: one legend below them all (seed counts differ per panel: dropped)
    handles, labels = [], []
    for a in [x for pair in zip(axes[0], twins) for x in pair]:
        for h, lab in zip(*a.get_legend_handles_labels()):
            lab = lab.split(" (n=")[0]
            if lab not in labels:
                handles, labels = handles + [h], labels + [lab]
    fig.suptitle(title)
    fig.tight_layout()
    fig.subplots_adjust(bottom=0.16 + 0.05 * -(-len(handles) // 3))
    fig.legend(handles, labels, loc="lower center", ncol=3, frameon=False)
    return fig


def dose_figure(points: list[dict], title: str):
    """Dose-response: relative accuracy vs realised mean |delta| (both with 95% intervals), per mode.

    `points`: {label, mode, kind, x: Interval, y: Interval, collapses, seeds}; noise settings are circles joined
    in sigma order, real conditions squares; each point is annotated with its collapse count.
    """
    modes = sorted({p["mode"] for p in points}) or ["recompute"]
    fig, axes = plt.subplots(1, len(modes), figsize=(6.6 * len(modes), 4.8), squeeze=False)
    if not points:
        return empty(fig, title, "finished mismatched cells")
    for ax, mode in zip(axes[0], modes):
        mine = [p for p in points if p["mode"] == mode and p["x"].mean is not None and p["y"].mean is not None]
        noise = sorted((p for p in mine if p["kind"] == "noise"), key=lambda p: p["x"].mean)
        if noise:
            ax.plot([p["x"].mean for p in noise], [p["y"].mean for p in noise], "-", color="tab:gray", linewidth=0.8)
        for p in mine:
            xerr = None if p["x"].lo is None else [[p["x"].mean - max(p["x"].lo, 1e-12)], [p["x"].hi - p["x"].mean]]
            # a ratio of accuracies cannot go below 0: the t interval is clipped to its domain
            (lo,), (hi,) = clip_band([p["y"].lo], [p["y"].hi], (0.0, None)) if p["y"].lo is not None else ((0,), (0,))
            yerr = None if p["y"].lo is None else [[p["y"].mean - lo], [hi - p["y"].mean]]
            ax.errorbar(
                p["x"].mean,
                p["y"].mean,
                xerr=xerr,
                yerr=yerr,
                fmt="o" if p["kind"] == "noise" else "s",
                color="tab:gray" if p["kind"] == "noise" else "tab:orange",
                capsize=2,
                markersize=5,
            )
        ax.axhline(1.0, color="black", linewidth=1.0, linestyle="--")
        ax.set_xscale("log")
        ax.set_ylim(bottom=0.0)
        ax.set_xlabel("realised mean |delta| = |log pi_old - log mu| (log)")
        ax.set_ylabel("final accuracy / reference (same seed)")
        ax.set_title(
            f"mode={mode}: circles = gaussian noise sweep, squares = real\nconditions; "
            "k/n = seeds collapsed; intervals clipped at 0"
        )
    fig.suptitle(title)
    fig.tight_layout()
    for ax, mode in zip(axes[0], modes):  # labels last: they are placed against the final layout
        mine = [p for p in points if p["mode"] == mode and p["x"].mean is not None and p["y"].mean is not None]
        place_labels(
            ax,
            [(p["x"].mean, p["y"].mean) for p in mine],
            [f"{p['label']} {p['collapses']}/{p['seeds']}" for p in mine],
        )
    return fig
