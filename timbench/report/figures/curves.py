"""Curve figures of a grid report: reward/accuracy, KL and grad norm, C(r) drift by advantage sign.

Each figure draws one curve per condition against the zero-mismatch reference (black): for each
(mode, condition) the remedy `none` when the grid has it (the mismatch untreated), else the first remedy
by name, as the mean over its seeds with a 95% band (timbench.report.figures.paper.draw_band). Every
function returns a matplotlib Figure; `png_bytes` (timbench.report.figures.style) renders it at the project's
resolution, with no timestamp in the metadata, so the same input gives the same bytes.
"""

from __future__ import annotations

from ...metrics.schema import ACCURACY_T1, GRAD_NORM, K3_KL, REWARD_MEAN
from ..results import CellRun
from .style import legend, plt, png_bytes  # noqa: F401  (png_bytes: part of this module's API)


def representatives(cells: list[CellRun]) -> dict[str, list[CellRun]]:
    """mode -> one cell per condition (remedy `none` else first by name, lowest seed), with metrics."""
    out: dict[str, dict[str, CellRun]] = {}
    remedies = sorted({c.axes["remedy"] for c in cells}, key=lambda r: (r != "none", r))
    rank = {r: i for i, r in enumerate(remedies)}
    for c in sorted(cells, key=lambda c: (rank[c.axes["remedy"]], c.axes.get("seed") or 0, c.id)):
        if c.metrics:
            out.setdefault(c.axes["mode"], {}).setdefault(c.axes["condition"], c)
    return {
        mode: sorted(by_cond.values(), key=lambda c: (c.condition.get("kind") != "reference", c.axes["condition"]))
        for mode, by_cond in sorted(out.items())
    }


def condition_colors(cells: list[CellRun]) -> dict[str, object]:
    names = sorted({c.axes["condition"] for c in cells if c.condition.get("kind") != "reference"})
    cmap = plt.get_cmap("tab10" if len(names) <= 10 else "tab20")
    colors = {n: cmap(i % cmap.N) for i, n in enumerate(names)}
    colors.update({c.axes["condition"]: "black" for c in cells if c.condition.get("kind") == "reference"})
    return colors


def _grid_axes(n_rows: int, n_cols: int, width: float = 5.2, height: float = 3.4):
    fig, axes = plt.subplots(n_rows, n_cols, figsize=(width * n_cols, height * n_rows), squeeze=False)
    return fig, axes


def _no_data(fig, what: str):
    fig.text(0.5, 0.5, f"no {what} yet (no cell has metrics)", ha="center", va="center")
    return fig


def mode_settings(cells: list[CellRun]) -> dict[str, list]:
    """mode -> one seed-band Setting per condition: every seed of the representative's remedy (`none` when the
    grid has it), reference first, so each curve is a mean with its 95% interval over seeds."""
    from .paper import Setting  # cycle: timbench.report.figures.paper imports this module

    colors = condition_colors(cells)
    out = {}
    for mode, group in representatives(cells).items():
        out[mode] = []
        for rep in group:
            mine = sorted(
                (
                    c
                    for c in cells
                    if c.metrics
                    and c.axes["mode"] == mode
                    and c.axes["condition"] == rep.axes["condition"]
                    and c.axes["remedy"] == rep.axes["remedy"]
                ),
                key=lambda c: (c.axes.get("seed") or 0, c.id),
            )
            ref = rep.condition.get("kind") == "reference"
            out[mode].append(
                Setting(
                    f"{rep.axes['condition']}" + (" (zero mismatch)" if ref else ""),
                    mine,
                    colors[rep.axes["condition"]],
                )
            )
    return out


def _band_rows(cells: list[CellRun], panels: list[tuple], width: float = 5.2):
    """One row per mode, one panel per (title, key, rows, log) with every condition's seed band; the legend
    of each row goes where its first panel has no data (or outside)."""
    from .paper import Setting, draw_band  # cycle: timbench.report.figures.paper imports this module

    by_mode = mode_settings(cells)
    fig, axes = _grid_axes(max(len(by_mode), 1), len(panels), width=width)
    if not by_mode:
        return _no_data(fig, "training curves")
    for row, (mode, settings) in enumerate(by_mode.items()):
        remedy = next((c.axes["remedy"] for s in settings for c in s.cells), "none")
        for ax, (title, key, rows, log, style) in zip(axes[row], panels):
            for s in settings:
                draw_band(ax, Setting(s.label, s.cells, s.color, style), key, rows, log=log)
            ax.set(title=f"{title} ({mode}, remedy {remedy})", xlabel="step", ylabel=key)
        fig.tight_layout()
        legend(axes[row][-1])  # the last panel: an outside legend then sits right of the row
    fig.tight_layout()
    return fig


def reward_accuracy_figure(cells: list[CellRun]):
    """(a) training reward and eval accuracy (T=1) per condition with 95% seed bands, one row per mode."""
    return _band_rows(
        cells,
        [
            ("training reward", REWARD_MEAN, "metrics", False, "-"),
            ("eval accuracy T=1", ACCURACY_T1, "evals", False, "-"),
        ],
    )


def kl_grad_figure(cells: list[CellRun]):
    """(b) rollout_corr/k3_kl (log, geometric band; exact zeros at the bottom) and actor/grad_norm (linear)."""
    return _band_rows(
        cells,
        [
            ("k3 KL (log; 0 drawn at 1e-9)", K3_KL, "metrics", True, "-"),
            ("grad norm", GRAD_NORM, "metrics", False, "-"),
        ],
    )


def drift_figure(cells: list[CellRun]):
    """(d) C(r_train) - C(r_rollout) for A > 0 and A < 0 tokens (linear: signed and small), seed bands."""
    return _band_rows(
        cells,
        [
            ("C(r) drift, A > 0", "drift/diff_pos_adv_mean", "metrics", False, "-"),
            ("C(r) drift, A < 0", "drift/diff_neg_adv_mean", "metrics", False, "-"),
        ],
    )
