"""Curve figures of a grid report: reward/accuracy, KL and grad norm, C(r) drift by advantage sign.

Each figure draws one line per condition against the zero-mismatch reference (black), using for
each (mode, condition) one representative cell: remedy `none` when the grid has it (the mismatch
untreated), else the first remedy by name, and the lowest seed. Every function returns a
matplotlib Figure; `png_bytes` renders it (Agg backend, no timestamp in the metadata, so the same
input gives the same bytes).
"""

from __future__ import annotations

import io

import matplotlib

matplotlib.use("Agg")  # headless and deterministic; set before pyplot is imported anywhere here
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.transforms import blended_transform_factory  # noqa: E402

from .results import CellRun  # noqa: E402

REFERENCE_STYLE = {"color": "black", "linewidth": 2.2, "zorder": 5}
ZERO_NOTE = "= 0 exactly (drawn at the bottom: log scale)"


def png_bytes(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, metadata={"Software": None})
    plt.close(fig)
    return buf.getvalue()


def representatives(cells: list[CellRun]) -> dict[str, list[CellRun]]:
    """mode -> one cell per condition (remedy `none` else first by name, lowest seed), with metrics."""
    out: dict[str, dict[str, CellRun]] = {}
    remedies = sorted({c.axes["remedy"] for c in cells}, key=lambda r: (r != "none", r))
    rank = {r: i for i, r in enumerate(remedies)}
    for c in sorted(cells, key=lambda c: (rank[c.axes["remedy"]], c.axes.get("seed") or 0, c.id)):
        if c.metrics:
            out.setdefault(c.axes["mode"], {}).setdefault(c.axes["condition"], c)
    return {mode: sorted(by_cond.values(), key=lambda c: (c.condition.get("kind") != "reference",
                                                          c.axes["condition"]))
            for mode, by_cond in sorted(out.items())}


def condition_colors(cells: list[CellRun]) -> dict[str, object]:
    names = sorted({c.axes["condition"] for c in cells if c.condition.get("kind") != "reference"})
    cmap = plt.get_cmap("tab10" if len(names) <= 10 else "tab20")
    colors = {n: cmap(i % cmap.N) for i, n in enumerate(names)}
    colors.update({c.axes["condition"]: "black" for c in cells if c.condition.get("kind") == "reference"})
    return colors


def _style(cell: CellRun, colors) -> dict:
    if cell.condition.get("kind") == "reference":
        return dict(REFERENCE_STYLE, label=f"{cell.axes['condition']} (zero mismatch)")
    return {"color": colors[cell.axes["condition"]], "linewidth": 1.2, "label": cell.axes["condition"]}


def _series(cell: CellRun, key: str, rows=None) -> tuple[list, list]:
    rows = cell.metrics if rows is None else rows
    pts = [(r["step"], float(r[key])) for r in rows if r.get(key) is not None]
    return [p[0] for p in pts], [p[1] for p in pts]


def _grid_axes(n_rows: int, n_cols: int, width: float = 5.2, height: float = 3.4):
    fig, axes = plt.subplots(n_rows, n_cols, figsize=(width * n_cols, height * n_rows), squeeze=False)
    return fig, axes


def _no_data(fig, what: str):
    fig.text(0.5, 0.5, f"no {what} yet (no cell has metrics)", ha="center", va="center")
    return fig


def reward_accuracy_figure(cells: list[CellRun]):
    """(a) training reward and eval accuracy (T=1) per condition, one row per mode."""
    reps, colors = representatives(cells), condition_colors(cells)
    fig, axes = _grid_axes(max(len(reps), 1), 2)
    if not reps:
        return _no_data(fig, "training curves")
    for row, (mode, group) in enumerate(reps.items()):
        ax_r, ax_a = axes[row]
        for c in group:
            ax_r.plot(*_series(c, "critic/rewards/mean"), **_style(c, colors))
            ax_a.plot(*_series(c, "accuracy_t1", c.evals), marker="o", markersize=3, **_style(c, colors))
        remedy = group[0].axes["remedy"]
        ax_r.set(title=f"training reward ({mode}, remedy {remedy})", xlabel="step", ylabel="critic/rewards/mean")
        ax_a.set(title=f"eval accuracy T=1 ({mode}, remedy {remedy})", xlabel="step", ylabel="accuracy_t1")
        ax_r.legend(fontsize=7)
    fig.tight_layout()
    return fig


def _log_with_zeros(ax, cell: CellRun, key: str, colors) -> None:
    """Plot positive values on a log axis; mark exact zeros at the bottom instead of dropping them."""
    steps, ys = _series(cell, key)
    style = _style(cell, colors)
    pos = [(s, y) for s, y in zip(steps, ys) if y > 0]
    zeros = [s for s, y in zip(steps, ys) if y == 0]
    if pos:
        ax.plot([p[0] for p in pos], [p[1] for p in pos], **style)
    if zeros:
        trans = blended_transform_factory(ax.transData, ax.transAxes)
        label = f"{cell.axes['condition']}: {key.split('/')[-1]} {ZERO_NOTE}"
        ax.plot(zeros, [0.02] * len(zeros), transform=trans, linestyle="none", marker="v", markersize=4,
                color=style["color"], label=label, clip_on=False)


def kl_grad_figure(cells: list[CellRun]):
    """(b) rollout_corr/k3_kl and actor/grad_norm on log scale, one row per mode."""
    reps, colors = representatives(cells), condition_colors(cells)
    fig, axes = _grid_axes(max(len(reps), 1), 2)
    if not reps:
        return _no_data(fig, "KL / grad curves")
    for row, (mode, group) in enumerate(reps.items()):
        for ax, key in zip(axes[row], ("rollout_corr/k3_kl", "actor/grad_norm")):
            ax.set_yscale("log")
            for c in group:
                _log_with_zeros(ax, c, key, colors)
            ax.set(title=f"{key} ({mode})", xlabel="step", ylabel=key)
            ax.legend(fontsize=6)
    fig.tight_layout()
    return fig


def drift_figure(cells: list[CellRun]):
    """(d) C(r_train) - C(r_rollout) split by advantage sign: A>0 solid, A<0 dashed; symlog y."""
    reps, colors = representatives(cells), condition_colors(cells)
    fig, axes = _grid_axes(max(len(reps), 1), 1, width=9.0)
    if not reps:
        return _no_data(fig, "drift curves")
    for row, (mode, group) in enumerate(reps.items()):
        ax = axes[row][0]
        ax.set_yscale("symlog", linthresh=1e-8)  # drift is signed and exactly 0 for the reference
        for c in group:
            style = _style(c, colors)
            ax.plot(*_series(c, "drift/diff_pos_adv_mean"), **style)
            ax.plot(*_series(c, "drift/diff_neg_adv_mean"), **dict(style, linestyle="--", label=None))
        ax.axhline(0.0, color="grey", linewidth=0.6)
        ax.set(title=f"C(r) drift by advantage sign ({mode}): solid A>0, dashed A<0", xlabel="step",
               ylabel="C(r_train) - C(r_rollout)")
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig
