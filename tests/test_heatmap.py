"""The relative-accuracy heatmap draws only the cells a grid has (a partial grid drew empty rows): full condition x
remedy blocks, one square per cell, none for a pair the design lacks; squares without a score say why (failed, nothing
trained, pending, no reference), and failed ones stay hatched."""

import matplotlib.pyplot as plt
import numpy as np
import pytest
from gridfab import standard_grid

from timbench.report.figures.heatmap import heat_blocks, heat_text, relative_accuracy_heatmap
from timbench.report.seeds import NOTHING_TRAINED
from timbench.report.summary import summarize_grid

pytestmark = pytest.mark.unit  # builds no model (make test-unit)


def row(mode, cond, remedy, rel=0.9, status="done", error=None, collapsed=False, step=None, kind="real"):
    return {
        "mode": mode,
        "condition": cond,
        "remedy": remedy,
        "kind": kind,
        "relative_accuracy_t1": rel,
        "final_accuracy_t1": 0.5,
        "status": status,
        "error": error,
        "collapse/collapsed": collapsed,
        "collapse/step": step,
    }


def sweep_rows() -> list[dict]:
    """The paper grid's shape: a noise ladder with `none` only, one condition with a remedy sweep; a bypass
    mode with a different sweep; the reference under `none` only."""
    rows = [row("recompute", "baseline", "none", 1.0, kind="reference")]
    rows += [row("recompute", f"noise-g{s}", "none") for s in (1, 2, 3)]
    rows += [row("recompute", "nvfp4", r) for r in ("none", "tis_token", "icepop", "k3_rs", "geo_rs")]
    rows += [row("bypass", c, "none") for c in ("bf16", "fp8", "nvfp4")]
    rows += [row("bypass", "nvfp4", "ppo_clip", 0.3, status="failed", error="loss is nan at step 4")]
    return rows


def cells_of(rows):
    return {(r["mode"], r["condition"], r["remedy"]) for r in rows}


def test_blocks_are_full_and_hold_every_cell_once():
    rows = sweep_rows()
    blocks = heat_blocks(rows)
    drawn = [(m, c, r) for m, bs in blocks.items() for conds, rems in bs for c in conds for r in rems]
    assert len(drawn) == len(set(drawn)) == len(cells_of(rows)) and set(drawn) == cells_of(rows)
    assert blocks["recompute"] == [
        (["baseline", "noise-g1", "noise-g2", "noise-g3"], ["none"]),
        (["nvfp4"], ["none", "geo_rs", "icepop", "k3_rs", "tis_token"]),
    ]
    assert blocks["bypass"] == [(["bf16", "fp8"], ["none"]), (["nvfp4"], ["none", "ppo_clip"])]


def _squares(fig) -> list[tuple[object, np.ma.MaskedArray]]:
    """(axes, image data) of every heatmap block (the colour bar has no image)."""
    return [(ax, ax.images[0].get_array()) for ax in fig.axes if ax.images]


def test_the_figure_has_a_square_per_cell_and_no_blank_ones():
    rows = sweep_rows()
    fig = relative_accuracy_heatmap(rows)
    blocks = _squares(fig)
    assert sum(a.size for _, a in blocks) == len(cells_of(rows))  # 13 squares, not the 25 + 6 of one rectangle per mode
    for ax, a in blocks:
        blank = list(zip(*np.nonzero(np.ma.getmaskarray(a))))
        patched = {(round(p.get_y() + 0.5), round(p.get_x() + 0.5)) for p in ax.patches}
        assert all((int(i), int(j)) in patched for i, j in blank)  # an uncoloured square says why
        assert len(ax.texts) == a.size  # and every square has its words
    texts = [t.get_text() for ax, _ in blocks for t in ax.texts]
    assert "failed\n1/1" in texts  # the failed sweep cell is never a score, whatever its accuracy (0.3)
    plt.close(fig)


@pytest.mark.parametrize(
    "cell, text, kind",
    [
        ([row("m", "c", "r", 0.4, status="failed", error="boom")], "failed\n1/1", "failed"),
        ([row("m", "c", "r", 0.0, status="failed", error=NOTHING_TRAINED)] * 3, "nothing\ntrained\n3/3", "failed"),
        ([row("m", "c", "r", None, status="pending"), row("m", "c", "r")], "pending\n1/2", "waiting"),
        ([row("m", "c", "r", None)], "acc 0.50\nno ref", "no ratio"),
        ([row("m", "c", "r", 0.25, collapsed=True, step=7), row("m", "c", "r", 0.35)], "0.30\nC 1/2@7", "collapsed"),
        ([row("m", "c", "r", 0.25, status="failed", error="nan", collapsed=True, step=9)], "0.25\nC@9", "collapsed"),
    ],
)
def test_a_square_says_what_it_is(cell, text, kind):
    got_text, value, got_kind = heat_text(cell)
    assert (got_text, got_kind) == (text, kind)
    assert (value is None) == (kind in ("failed", "waiting", "no ratio"))


def test_a_real_report_hatches_failed_and_greys_pending(tmp_path):
    rows = summarize_grid(standard_grid(tmp_path / "fab"))  # a pending mis_seq cell under noise-3 only
    fig = relative_accuracy_heatmap(rows)
    blocks = _squares(fig)
    assert sum(a.size for _, a in blocks) == len(cells_of(rows)) == 10
    pending = [ax for ax, _ in blocks if any(t.get_text() == "pending\n1/1" for t in ax.texts)]
    assert len(pending) == 1 and [p.get_hatch() for p in pending[0].patches] == [None]  # not drawn as failed
    plt.close(fig)
