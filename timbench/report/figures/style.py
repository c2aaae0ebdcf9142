"""The project's figure style: one place for resolution, fonts, legend placement, interval clipping and
non-colliding labels, used by every plotting module (report/figures/*.py, diagnose/figures.py).

- `DPI` (150) and `RC` (9-pt text, light grid) are applied when pyplot is first imported here, so a figure
  of 4.6 x 3.6 inches reads at its committed size.
- `legend(ax)` puts a legend in the corner of the axes the data leaves emptiest, or outside on the right
  when every corner holds data.
- `clip_band(lo, hi, domain)` clips an interval to the quantity's domain (a rate cannot go below 0);
  ratios take geometric intervals instead (timbench.report.stats on logs) before they get here.
- `place_labels(ax, points, texts)` annotates points with labels moved apart until no two overlap.
"""

from __future__ import annotations

import io

import matplotlib
import matplotlib.transforms

matplotlib.use("Agg")  # headless and deterministic; set before pyplot is imported anywhere
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.text import Text  # noqa: E402

DPI = 150
RC = {
    "figure.dpi": DPI,
    "savefig.dpi": DPI,
    "font.size": 9,
    "axes.titlesize": 9,
    "axes.labelsize": 9,
    "xtick.labelsize": 8,
    "ytick.labelsize": 8,
    "legend.fontsize": 8,
    "legend.framealpha": 0.85,
    "figure.titlesize": 10,
    "axes.grid": True,
    "grid.alpha": 0.25,
    "grid.linewidth": 0.6,
}
plt.rcParams.update(RC)

BAND_ALPHA = 0.18
CORNERS = {
    "upper right": (0.6, 1.0, 0.6, 1.0),
    "upper left": (0.0, 0.4, 0.6, 1.0),
    "lower left": (0.0, 0.4, 0.0, 0.4),
    "lower right": (0.6, 1.0, 0.0, 0.4),
}
"""Legend corners as (x0, x1, y0, y1) in axes fractions: the box a legend of a few lines covers."""


def png_bytes(fig) -> bytes:
    """The figure as PNG at `DPI`, without a version stamp in the metadata (the same input, the same bytes)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, metadata={"Software": None}, bbox_inches="tight", pad_inches=0.08)
    plt.close(fig)
    return buf.getvalue()


def _data_fractions(ax) -> list[tuple[float, float]]:
    """Every drawn point of the axes' lines and bands, in axes fractions (0..1 inside the axes)."""
    ax.autoscale_view()  # limits are computed lazily; the fractions need the final ones
    to_axes = ax.transAxes.inverted()
    pts = []
    for line in ax.get_lines():
        xy = line.get_xydata()
        if len(xy):
            frac = to_axes.transform(line.get_transform().transform(xy))
            pts.extend(frac)
            if line.get_linestyle() not in ("None", "none", "", " "):  # a drawn segment covers what lies between
                for (x0, y0), (x1, y1) in zip(frac[:-1], frac[1:]):
                    pts.extend((x0 + (x1 - x0) * t / 8, y0 + (y1 - y0) * t / 8) for t in range(1, 8))
    for coll in ax.collections:
        offsets = coll.get_offsets()
        if len(offsets) and not (len(offsets) == 1 and not offsets[0].any()):  # scatter: points are the offsets
            pts.extend(to_axes.transform(coll.get_offset_transform().transform(offsets)))
            continue
        for path in coll.get_paths():  # bands (fill_between) and other path collections: their vertices
            if len(path.vertices):
                pts.extend(to_axes.transform(coll.get_transform().transform(path.vertices)))
    return [(float(x), float(y)) for x, y in pts if x == x and y == y]


def emptiest_corner(ax) -> tuple[str, int]:
    """The corner of `ax` with the fewest data points, and how many it has."""
    pts = _data_fractions(ax)
    counts = {
        name: sum(1 for x, y in pts if x0 <= x <= x1 and y0 <= y <= y1) for name, (x0, x1, y0, y1) in CORNERS.items()
    }
    best = min(CORNERS, key=lambda n: (counts[n], list(CORNERS).index(n)))
    return best, counts[best]


def legend(ax, handles=None, labels=None, outside_if_crowded: bool = True, **kw):
    """A legend that never sits on the data: the emptiest corner if it is empty, else outside on the right."""
    if handles is None:
        handles, labels = ax.get_legend_handles_labels()
    if not handles:
        return None
    loc, n = emptiest_corner(ax)
    if n == 0 or not outside_if_crowded:
        return ax.legend(handles, labels, loc=loc, **kw)
    right, below = _neighbours(ax)
    if not right:
        return ax.legend(handles, labels, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0, **kw)
    if not below:  # a panel to the right would be covered: go under the x label instead
        return ax.legend(
            handles,
            labels,
            loc="upper center",
            bbox_to_anchor=(0.5, -0.16),
            borderaxespad=0.0,
            ncol=kw.pop("ncol", 2 if len(handles) > 3 else 1),
            **kw,
        )
    return ax.legend(handles, labels, loc=loc, **kw)  # boxed in on both sides: the emptiest corner after all


def _neighbours(ax) -> tuple[bool, bool]:
    """Whether another visible axes of the figure sits to the right of `ax` (sharing rows) or below it."""
    me = ax.get_position()
    right = below = False
    for other in ax.figure.axes:
        if other is ax or not other.get_visible():
            continue
        box = other.get_position()
        if box.x0 >= me.x1 and box.y0 < me.y1 and box.y1 > me.y0:
            right = True
        if box.y1 <= me.y0 and box.x0 < me.x1 and box.x1 > me.x0:
            below = True
    return right, below


def clip_band(lo: list[float], hi: list[float], domain: tuple[float | None, float | None]) -> tuple[list, list]:
    """`lo`/`hi` clipped to the quantity's domain (None: unbounded on that side), e.g. (0, 1) for an accuracy."""
    a, b = domain

    def clip(v):
        if v != v:
            return v
        if a is not None and v < a:
            return a
        if b is not None and v > b:
            return b
        return v

    return [clip(v) for v in lo], [clip(v) for v in hi]


def place_labels(ax, points: list[tuple[float, float]], texts: list[str], color="black", fontsize=7.5) -> list:
    """Annotate each data point with its text, nudging labels up/down in steps of a line until none overlap."""
    fig = ax.figure
    fig.canvas.draw()  # call after the layout is final: offsets are in points, positions in data
    renderer = fig.canvas.get_renderer()
    # the points themselves (with their markers) are obstacles too, so no label covers another's point
    boxes = (
        [matplotlib.transforms.Bbox.from_bounds(px - 5, py - 5, 10, 10) for px, py in ax.transData.transform(points)]
        if points
        else []
    )
    placed = []
    frame = ax.get_window_extent(renderer)  # a label must stay inside the axes, never under an axis line
    order = sorted(range(len(points)), key=lambda i: (points[i][0], points[i][1]))
    for i in order:
        (x, y), text = points[i], texts[i]
        for k in range(40):
            dy = (k + 1) // 2 * (1 if k % 2 else -1) * 9 + 4  # 4, 13, -5, 22, -14, ... points
            ann = ax.annotate(
                text,
                (x, y),
                xytext=(4, dy),
                textcoords="offset points",
                fontsize=fontsize,
                color=color,
                arrowprops=dict(arrowstyle="-", color="0.6", lw=0.5) if dy != 4 else None,
            )
            ann.update_positions(renderer)  # an annotation's text position is computed at draw time
            box = Text.get_window_extent(ann, renderer).expanded(1.02, 1.15)  # the text, not its leader line
            inside = frame.y0 <= box.y0 and box.y1 <= frame.y1
            if (inside and not any(box.overlaps(b) for b in boxes)) or k == 39:  # the last try stays if crowded
                break
            ann.remove()
        boxes.append(box)
        placed.append(ann)
    return placed
