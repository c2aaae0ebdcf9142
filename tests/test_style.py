"""The figure style (timbench.report.figures.style): resolution, legends off the data, domain-clipped bands,
labels that do not collide."""

import pytest
from matplotlib.text import Text

from timbench.report.figures.style import DPI, clip_band, emptiest_corner, legend, place_labels, plt, png_bytes

pytestmark = pytest.mark.unit  # builds no model (make test-unit)


def test_resolution_is_at_least_150_dpi():
    import struct

    fig, ax = plt.subplots(figsize=(2.0, 1.0))
    ax.plot([0, 1], [0, 1])
    png = png_bytes(fig)
    assert DPI >= 150
    width = struct.unpack(">I", png[16:20])[0]  # IHDR width: 2 inches at DPI, give or take the tight box
    assert width >= 1.5 * DPI


def test_legend_goes_to_the_empty_corner_or_outside():
    fig, ax = plt.subplots()
    ax.plot(range(10), range(10), label="diagonal")  # lower left to upper right: the other corners are empty
    corner, n = emptiest_corner(ax)
    assert corner in ("upper left", "lower right") and n == 0
    assert legend(ax)._loc in (2, 4)  # matplotlib's codes for upper left / lower right
    fig2, ax2 = plt.subplots()
    for y in (0.0, 0.5, 1.0):
        ax2.plot([0, 1], [y, y], label=str(y))
    ax2.plot([0, 0, 1, 1], [0, 1, 0, 1], "o", label="corners")  # every corner holds data
    leg = legend(ax2)
    assert leg.get_bbox_to_anchor().x0 > ax2.get_window_extent().x1  # outside, right of the axes
    plt.close(fig)
    plt.close(fig2)


def test_bands_are_clipped_to_the_domain():
    lo, hi = clip_band([-0.2, 0.1, float("nan")], [0.5, 1.3, float("nan")], (0.0, 1.0))
    assert lo[:2] == [0.0, 0.1] and hi[:2] == [0.5, 1.0] and lo[2] != lo[2]
    assert clip_band([-1.0], [2.0], (0.0, None)) == ([0.0], [2.0])


def test_labels_never_overlap():
    fig, ax = plt.subplots(figsize=(4, 3))
    pts = [(0.1, 0.0), (0.105, 0.0), (0.11, 0.01), (0.5, 0.5)]  # three points on top of each other
    ax.plot(*zip(*pts), "o")
    fig.tight_layout()
    anns = place_labels(ax, pts, ["nvfp4-rollout 3/3", "int4-rollout 3/3", "noise-g2 3/3", "alone"])
    r = fig.canvas.get_renderer()
    boxes = [Text.get_window_extent(a, r) for a in anns]
    assert len(anns) == 4
    assert not any(boxes[i].overlaps(boxes[j]) for i in range(4) for j in range(i + 1, 4))
    frame = ax.get_window_extent(r)
    assert all(frame.y0 <= b.y0 and b.y1 <= frame.y1 for b in boxes)  # none below the x axis (points at y=0)
    plt.close(fig)


def test_scatter_points_count_as_data_and_a_right_neighbour_sends_the_legend_below():
    fig, (left, right) = plt.subplots(1, 2)
    left.scatter([0, 0, 1, 1], [0, 1, 0, 1], label="corners")  # a scatter's points are its offsets
    left.scatter([0.5], [0.5], label="centre")
    assert emptiest_corner(left)[1] > 0
    right.plot([0, 1], [0, 1])
    leg = legend(left)
    fig.canvas.draw()
    box = leg.get_window_extent(fig.canvas.get_renderer())
    assert box.y1 < left.get_window_extent().y0  # under the axes, not over the right-hand panel
    plt.close(fig)
