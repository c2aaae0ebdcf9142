"""The relative-accuracy heatmap of a grid report (figure (c)): final accuracy / reference, drawing only the
cells that exist.

A grid's design is rarely a full condition x remedy rectangle: a remedy sweep runs under one or two conditions,
the reference and the noise ladder only with `none`. Drawn as one rectangle per mode, most of it would be blank
squares that stand for no cell. So each mode's conditions are grouped by the set of remedies they have cells
for (`heat_blocks`), and each group is drawn as its own full block: those conditions x that remedy set, with
its own remedy labels, stacked in the mode's column. Every square is a cell of the design, one square size
across the figure (laid out in inches, so a 2-cell block is as readable as a 60-cell one).

A square that has no score says why instead of taking a colour: failed or nothing-trained cells are hatched
grey with what happened and how many seeds; cells in the design that have not run yet (pending / running) and
finished cells with no reference accuracy to divide by are plain grey with those words.
"""

from __future__ import annotations

import math

import numpy as np
from matplotlib.colors import Normalize
from matplotlib.font_manager import FontProperties
from matplotlib.textpath import text_to_path

from ..seeds import is_finished, trained_nothing
from ..stats import mean
from .curves import _no_data, plt

CELL_W, CELL_H = 0.82, 0.46
"""One square in inches: wide enough for "C 3/3@16" in bold, tall enough for three lines of 7.5-pt text."""
LABEL_PT = 8.0  # tick labels: style.RC's xtick/ytick size
ROTATION = 35.0  # remedy labels, slanted so long names need no more than a square's width each
TITLE_H, BLOCK_GAP, MODE_GAP, PAD = 0.32, 0.22, 0.45, 0.08
FAILED = dict(facecolor="#e0e0e0", hatch="///", edgecolor="#9e9e9e", linewidth=0)
NO_SCORE = dict(facecolor="#f2f2f2", edgecolor="none", linewidth=0)


def _mean(xs):
    return mean([x for x in xs if x is not None])


def heat_text(cell: list[dict]) -> tuple[str, float | None, str]:
    """(text, value to colour or None, kind) of one square from its seeds' summary rows.

    kind: "failed" (a failed or nothing-trained seed: never coloured as a score, whatever its accuracy),
    "waiting" (a seed pending or running), "no ratio" (finished, no reference accuracy to divide by),
    "collapsed" (a score with collapsed seeds) or "" (a score)."""
    failed = [r for r in cell if trained_nothing(r) or (r["status"] == "failed" and not is_finished(r))]
    if failed:
        what = "nothing\ntrained" if trained_nothing(failed[0]) else "failed"
        return f"{what}\n{len(failed)}/{len(cell)}", None, "failed"
    waiting = [r for r in cell if not is_finished(r)]
    if waiting:
        return f"{waiting[0]['status']}\n{len(waiting)}/{len(cell)}", None, "waiting"
    rel = _mean([r["relative_accuracy_t1"] for r in cell])
    if rel is None:
        acc = _mean([r["final_accuracy_t1"] for r in cell])
        return ("no eval" if acc is None else f"acc {acc:.2f}\nno ref"), None, "no ratio"
    text = f"{rel:.2f}"
    collapsed = [r["collapse/step"] for r in cell if r["collapse/collapsed"]]
    if collapsed:  # one seed: the step; several: how many seeds collapsed, from the first step
        text += f"\nC@{min(collapsed)}" if len(cell) == 1 else f"\nC {len(collapsed)}/{len(cell)}@{min(collapsed)}"
    return text, rel, "collapsed" if collapsed else ""


def heat_blocks(rows: list[dict]) -> dict[str, list[tuple[list[str], list[str]]]]:
    """mode -> blocks (conditions, remedies): the mode's conditions grouped by the exact set of remedies they
    have cells for, so every block is full and every cell of the mode is in exactly one block.

    Conditions keep their order (reference first, then by name), blocks the order of their first condition,
    remedies `none` first."""
    refs = {r["condition"] for r in rows if r["kind"] == "reference"}
    out = {}
    for mode in sorted({r["mode"] for r in rows}):
        have: dict[str, set[str]] = {}
        for r in rows:
            if r["mode"] == mode:
                have.setdefault(r["condition"], set()).add(r["remedy"])
        groups: dict[tuple[str, ...], list[str]] = {}
        for cond in sorted(have, key=lambda c: (c not in refs, c)):
            groups.setdefault(tuple(sorted(have[cond], key=lambda x: (x != "none", x))), []).append(cond)
        out[mode] = [(conds, list(remedies)) for remedies, conds in groups.items()]
    return out


def _inches(text: str) -> tuple[float, float]:
    """(width, height) of a tick label in inches, from the font's outlines (no renderer needed)."""
    w, h, d = text_to_path.get_text_width_height_descent(text, FontProperties(size=LABEL_PT), ismath=False)
    return w / 72, (h + d) / 72


def _xlabel_room(remedies: list[str]) -> tuple[float, float]:
    """(height below a block, reach left of its first column) of its slanted remedy labels, in inches."""
    s, c = math.sin(math.radians(ROTATION)), math.cos(math.radians(ROTATION))
    sizes = [_inches(r) for r in remedies]
    below = max(w * s + h * c for w, h in sizes) + PAD
    left = max(w * c + h * s - (j + 0.5) * CELL_W for j, (w, h) in enumerate(sizes))
    return below, left


def _mode_box(title: str, blocks) -> dict:
    """Inches a mode's column needs: left margin (condition labels, slanted remedy labels), width, height and
    each block's top offset."""
    ylab = max(_inches(c)[0] for conds, _ in blocks for c in conds) + PAD
    rooms = [_xlabel_room(remedies) for _, remedies in blocks]
    left = max([ylab] + [ylab + reach for _, reach in rooms])
    tops, y = [], TITLE_H
    for (conds, _), (below, _) in zip(blocks, rooms):
        tops.append(y)
        y += len(conds) * CELL_H + below + BLOCK_GAP
    width = left + max(len(remedies) for _, remedies in blocks) * CELL_W
    return {"left": left, "width": max(width, left + _inches(title)[0]), "height": y, "tops": tops}


def _draw_block(ax, mode_rows: list[dict], conds: list[str], remedies: list[str], cmap, norm) -> set[str]:
    """Draw one full block into `ax`; returns the kinds of square it drew (`heat_text`)."""
    grid, kinds = np.full((len(conds), len(remedies)), np.nan), set()
    for i, cond in enumerate(conds):
        for j, rem in enumerate(remedies):
            text, rel, kind = heat_text([r for r in mode_rows if (r["condition"], r["remedy"]) == (cond, rem)])
            kinds.add(kind)
            if rel is not None:
                grid[i, j] = rel
            else:
                ax.add_patch(plt.Rectangle((j - 0.5, i - 0.5), 1, 1, **(FAILED if kind == "failed" else NO_SCORE)))
            # dark squares (either end of RdYlGn) get white text, light ones black: always readable
            dark = rel is not None and not 0.25 < norm(rel) < 0.8
            ax.text(
                j,
                i,
                text,
                ha="center",
                va="center",
                fontsize=7.5,
                color="white" if dark else "black",
                fontweight="bold" if kind in ("failed", "collapsed") else None,
            )
    ax.imshow(np.ma.masked_invalid(grid), cmap=cmap, norm=norm, aspect="auto", interpolation="nearest")
    ax.set_xticks(range(len(remedies)), remedies, rotation=ROTATION, ha="right", rotation_mode="default")
    ax.set_yticks(range(len(conds)), conds)
    ax.tick_params(length=2, pad=2)
    ax.grid(False)
    return kinds


def relative_accuracy_heatmap(rows: list[dict]):
    """(c) final accuracy / reference (mean over seeds) for every cell of the grid, one column per mode, each
    made of full condition x remedy blocks (`heat_blocks`). A collapsed group reads C@n with one seed, C k/m@n
    with several (k of m seeds, the first at step n)."""
    if not rows:
        return _no_data(plt.figure(figsize=(6, 2)), "cells")
    blocks = heat_blocks(rows)
    boxes = {mode: _mode_box(f"mode: {mode}", b) for mode, b in blocks.items()}
    top = 0.62  # the suptitle's two lines
    body_h = max(b["height"] for b in boxes.values())
    width = sum(b["width"] for b in boxes.values()) + MODE_GAP * (len(boxes) - 1) + 1.0  # + the colour bar
    height = top + body_h
    fig = plt.figure(figsize=(width, height))
    cmap = plt.get_cmap("RdYlGn")
    norm = Normalize(0.0, max(1.2, max((r["relative_accuracy_t1"] or 0 for r in rows), default=1)))
    x, kinds = 0.0, set()
    for mode, mode_blocks in blocks.items():
        box = boxes[mode]
        mode_rows = [r for r in rows if r["mode"] == mode]
        fig.text(
            (x + box["left"] + (box["width"] - box["left"]) / 2) / width,
            1 - (top + TITLE_H / 2) / height,
            f"mode: {mode}",
            ha="center",
            va="center",
            fontsize=9,
        )
        for (conds, remedies), y in zip(mode_blocks, box["tops"]):
            h = len(conds) * CELL_H
            ax = fig.add_axes(
                ((x + box["left"]) / width, 1 - (top + y + h) / height, len(remedies) * CELL_W / width, h / height)
            )
            kinds |= _draw_block(ax, mode_rows, conds, remedies, cmap, norm)
        x += box["width"] + MODE_GAP
    bar_h = min(max(body_h - TITLE_H - 0.9, 1.0), 3.5)  # beside the blocks, not their last labels
    cax = fig.add_axes(
        ((x - MODE_GAP + 0.3) / width, 1 - (top + TITLE_H + bar_h) / height, 0.16 / width, bar_h / height)
    )
    fig.colorbar(plt.cm.ScalarMappable(norm=norm, cmap=cmap), cax=cax)
    notes = ["C@n: collapsed at step n", "hatched: failed / nothing trained"]
    notes += ["grey: not run yet"] if "waiting" in kinds else []
    notes += ["grey 'no ref': finished, no reference accuracy"] if "no ratio" in kinds else []
    fig.suptitle(
        "final accuracy / zero-mismatch reference, only the cells the grid has\n(" + "; ".join(notes) + ")",
        y=1 - 0.06 / height,
        va="top",
    )
    return fig
