"""The paper figures (F1-F5 and the dose-response) with seed bands: mean and 95% interval across seeds.

Each curve is one setting (condition, remedy, mode) of a grid; its band is the Student t interval of the
per-step mean over the setting's seeds (timbench.report.stats.mean_interval), drawn only at steps every
seed reached. Training reward is smoothed per seed first with the collapse rule's trailing moving average
(the same curve the rule reads). On log axes mean and band are taken over log10 values (a geometric
mean over seeds and its interval) and an exact 0 is drawn at LOG_FLOOR, the bottom; on linear axes a band
is clipped to the quantity's domain (`DOMAINS`: a rate stays in [0, 1], a norm >= 0). Sizes, fonts and
legend placement come from timbench.report.style. The figure functions take `Setting`s built by
timbench.report.paper and return matplotlib Figures.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from .collapse import moving_average
from .plots import _no_data, plt
from .results import CellRun
from .stats import Interval, mean_interval
from .style import BAND_ALPHA, clip_band, legend, place_labels

REWARD = "critic/rewards/mean"
DOMAINS = {REWARD: (0.0, 1.0), "accuracy_t1": (0.0, 1.0), "actor/grad_norm": (0.0, None),
           "rollout_corr/k3_kl": (0.0, None)}
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


def seed_band(cells: list[CellRun], key: str, rows: str = "metrics", smooth: int = 1,
              transform=None) -> tuple[list[int], list[Interval]]:
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


def draw_band(ax, s: Setting, key: str, rows: str = "metrics", smooth: int = 1, log: bool = False,
              transform=None, label: bool = True) -> None:
    """One setting's mean and 95% band; on a log axis both are taken over log10 values (a geometric mean and
    its interval, which stays positive), with exact zeros at LOG_FLOOR."""
    tf = transform
    if log:
        tf = (lambda v: _log10(transform(v))) if transform is not None else _log10
    steps, ivs = seed_band(s.cells, key, rows, smooth, tf)
    if not steps:
        return
    back = (lambda x: 10.0 ** x) if log else (lambda x: x)
    mean = [back(iv.mean) for iv in ivs]
    lo = [back(iv.mean if iv.lo is None else iv.lo) for iv in ivs]
    hi = [back(iv.mean if iv.hi is None else iv.hi) for iv in ivs]
    if not log and transform is None:
        lo, hi = clip_band(lo, hi, DOMAINS.get(key, (None, None)))
    n = min(iv.n for iv in ivs)
    ax.plot(steps, mean, s.style, color=s.color, linewidth=1.6 if s.color == "black" else 1.2,
            label=f"{s.label} (n={n})" if label else None)
    ax.fill_between(steps, lo, hi, color=s.color, alpha=BAND_ALPHA, linewidth=0)
    if log:
        ax.set_yscale("log")


def _panels(settings: list[Setting], panels: list[tuple], title: str, width: float = 4.6):
    """One row of panels; each panel (ylabel, key, rows, smooth, log, transform)."""
    fig, axes = plt.subplots(1, len(panels), figsize=(width * len(panels), 3.6), squeeze=False)
    if not any(s.cells for s in settings):
        return _no_data(fig, "finished cells for this figure")
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
    return _panels(settings, [(f"training reward (moving avg {smooth})", REWARD, "metrics", smooth, False, None),
                              ("eval accuracy T=1", "accuracy_t1", "evals", 1, False, None),
                              ("rollout_corr/k3_kl (log; 0 drawn at 1e-9)", "rollout_corr/k3_kl", "metrics", 1, True, None),
                              ("actor/grad_norm (0 = nothing to learn)", "actor/grad_norm", "metrics", 1, False,
                               None)], title)


def modes_figure(settings: list[Setting], title: str, smooth: int):
    """F2: reward, eval accuracy, grad norm (log) and the PPO loss, recompute (solid) vs bypass (dashed)."""
    return _panels(settings, [(f"training reward (moving avg {smooth})", REWARD, "metrics", smooth, False, None),
                              ("eval accuracy T=1", "accuracy_t1", "evals", 1, False, None),
                              ("actor/grad_norm (0 = nothing to learn)", "actor/grad_norm", "metrics", 1, False,
                               None),
                              ("actor/pg_loss", "actor/pg_loss", "metrics", 1, False, None)], title)


def _relative_to_start(vals: list[float], first: int = 5) -> list[float]:
    base = math.fsum(vals[:first]) / max(1, len(vals[:first]))
    return [v / base if base > 0 else float("nan") for v in vals]


def kl_warning_figure(settings: list[Setting], title: str, smooth: int):
    """F3: per setting, smoothed reward (left) and K1 / K3 relative to their first 5 steps (right, log)."""
    n = max(1, len(settings))
    fig, axes = plt.subplots(1, n, figsize=(4.4 * n, 3.6), squeeze=False)
    if not settings:
        return _no_data(fig, "collapsed or degraded settings")
    twins = []
    for ax, s in zip(axes[0], settings):
        draw_band(ax, Setting("reward", s.cells, "black"), REWARD, smooth=smooth)
        ax.set_ylabel(f"training reward (moving avg {smooth})")
        ax.set_xlabel("step")
        right = ax.twinx()
        draw_band(right, Setting("k3_kl / first 5 steps", s.cells, "tab:red"), "rollout_corr/k3_kl",
                  smooth=smooth, log=True, transform=_relative_to_start)
        draw_band(right, Setting("|kl| / first 5 steps", s.cells, "tab:blue", "--"), "rollout_corr/kl",
                  smooth=smooth, log=True, transform=lambda v: _relative_to_start([abs(x) for x in v]))
        right.set_ylabel("KL relative to its first 5 steps (log)")
        right.grid(False)
        for r in s.summary:
            if r.get("collapse/collapsed") and r.get("collapse/step") is not None:
                ax.axvline(r["collapse/step"], color="gray", linestyle=":", linewidth=1)
        ax.set_title(f"{s.label}\n(dotted: collapse step of a seed)")
        twins.append(right)
    # the same three curves in every panel: one legend below them all (seed counts differ per panel: dropped)
    handles, labels = [], []
    for a in (axes[0][0], twins[0]):
        h, lab = a.get_legend_handles_labels()
        handles, labels = handles + h, labels + lab
    fig.suptitle(title)
    fig.tight_layout()
    fig.subplots_adjust(bottom=0.2)
    fig.legend(handles, [lab.split(" (n=")[0] for lab in labels], loc="lower center", ncol=3, frameon=False)
    return fig


def drift_figure(settings: list[Setting], bars: list[tuple[str, Interval, Interval]], title: str, smooth: int):
    """F4: C(r_train) - C(r_rollout) over steps for A > 0 and A < 0 tokens (linear: the drift is signed and
    small, a symlog axis showed decades of noise), and per-setting means."""
    fig, axes = plt.subplots(1, 3, figsize=(14.5, 3.8), squeeze=False)
    if not any(s.cells for s in settings):
        return _no_data(fig, "finished cells for this figure")
    for ax, key, sign in ((axes[0][0], "drift/diff_pos_adv_mean", "A > 0"),
                          (axes[0][1], "drift/diff_neg_adv_mean", "A < 0")):
        for s in settings:
            draw_band(ax, s, key, smooth=smooth, label=ax is axes[0][0])
        ax.axhline(0.0, color="gray", linewidth=0.6)
        ax.set_title(f"C(r_train) - C(r_rollout), tokens with {sign}\n(moving avg {smooth}, 95% band over seeds)")
        ax.set_xlabel("step")
        ax.ticklabel_format(axis="y", style="sci", scilimits=(-3, 3))
    ax = axes[0][2]
    for i, (label, pos, neg) in enumerate(bars):
        for off, iv, color in ((-0.18, pos, "tab:green"), (0.18, neg, "tab:purple")):
            if iv.mean is None:
                continue
            err = None if iv.lo is None else [[iv.mean - iv.lo], [iv.hi - iv.mean]]
            ax.bar(i + off, iv.mean, 0.34, color=color, yerr=err, capsize=2,
                   label=("A > 0" if off < 0 else "A < 0") if i == 0 else None)
    ax.set_xticks(range(len(bars)))
    ax.set_xticklabels([b[0] for b in bars], rotation=30, ha="right")
    ax.axhline(0.0, color="gray", linewidth=0.6)
    ax.ticklabel_format(axis="y", style="sci", scilimits=(-3, 3))
    ax.set_title("mean over steps, 95% interval over seeds")
    legend(ax)
    return _figure_legend(fig, axes[0][0], title)


def remedy_figure(settings: list[Setting], bars: list[tuple[str, Interval, str]], title: str):
    """F5: relative final accuracy per remedy (95% interval over seeds) and eval-accuracy bands."""
    fig, axes = plt.subplots(1, 2, figsize=(13.0, 0.9 + 0.42 * max(4, len(bars))), squeeze=False)
    if not bars:
        return _no_data(fig, "finished remedy cells")
    ax = axes[0][0]
    for i, (label, iv, note) in enumerate(bars):
        if iv.mean is None:
            continue
        err = None if iv.lo is None else [[iv.mean - iv.lo], [iv.hi - iv.mean]]
        ax.barh(i, iv.mean, color="tab:gray" if "none" in label.split(" ")[0] else "tab:blue", xerr=err, capsize=3)
        ax.text(0.01, i, f" {note}", va="center", fontsize=7, color="white")
    ax.axvline(1.0, color="black", linewidth=1.2, linestyle="--")
    ax.set_yticks(range(len(bars)))
    ax.set_yticklabels([b[0] for b in bars])
    ax.invert_yaxis()
    ax.set_xlabel("final eval accuracy T=1 / zero-mismatch reference (same seed)")
    ax = axes[0][1]
    for s in settings:
        draw_band(ax, s, "accuracy_t1", rows="evals")
    ax.set_xlabel("step")
    ax.set_ylabel("eval accuracy T=1")
    legend(ax)
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def dose_figure(points: list[dict], title: str):
    """Dose-response: relative accuracy vs realised mean |delta| (both with 95% intervals), per mode.

    `points`: {label, mode, kind, x: Interval, y: Interval, collapses, seeds}; noise settings are circles joined
    in sigma order, real conditions squares; each point is annotated with its collapse count.
    """
    modes = sorted({p["mode"] for p in points}) or ["recompute"]
    fig, axes = plt.subplots(1, len(modes), figsize=(6.6 * len(modes), 4.8), squeeze=False)
    if not points:
        return _no_data(fig, "finished mismatched cells")
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
            ax.errorbar(p["x"].mean, p["y"].mean, xerr=xerr, yerr=yerr, fmt="o" if p["kind"] == "noise" else "s",
                        color="tab:gray" if p["kind"] == "noise" else "tab:orange", capsize=2, markersize=5)
        ax.axhline(1.0, color="black", linewidth=1.0, linestyle="--")
        ax.set_xscale("log")
        ax.set_ylim(bottom=0.0)
        ax.set_xlabel("realised mean |delta| = |log pi_old - log mu| (log)")
        ax.set_ylabel("final accuracy / reference (same seed)")
        ax.set_title(f"mode={mode}: circles = gaussian noise sweep, squares = real\nconditions; "
                     "k/n = seeds collapsed; intervals clipped at 0")
    fig.suptitle(title)
    fig.tight_layout()
    for ax, mode in zip(axes[0], modes):  # labels last: they are placed against the final layout
        mine = [p for p in points if p["mode"] == mode and p["x"].mean is not None and p["y"].mean is not None]
        place_labels(ax, [(p["x"].mean, p["y"].mean) for p in mine],
                     [f"{p['label']} {p['collapses']}/{p['seeds']}" for p in mine])
    return fig
