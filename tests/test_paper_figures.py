"""The paper figures' artists, inspected on the matplotlib objects: each figure's verdict line, F3's warning
level and a minority collapse, F4's real conditions on their own scale, F5's notes and title.

The grid is test_paper's fabricated one (its curves pin every verdict); F3's minority collapse is built here.
"""

from __future__ import annotations

import pytest
from gridfab import write_cells_json
from test_paper import SEEDS, curve, paper_grid, write

from timbench.report.collapse import moving_average
from timbench.report.figures.curves import plt
from timbench.report.figures.paper import Setting, kl_warning_figure
from timbench.report.results import CellRun
from timbench.studies.paper import _figures, paper_data, remedy_variants, verdicts
from timbench.studies.paper_claims import KL_RISE, kl_alarm_step

pytestmark = pytest.mark.unit  # builds no model (make test-unit)


@pytest.fixture(scope="module")
def drawn(tmp_path_factory):
    """claim -> (its Figure, its headline verdict) for the fabricated paper grid."""
    d, _ = paper_data(paper_grid(tmp_path_factory.mktemp("paper")))
    heads = {v.claim: v.verdict for v in verdicts(d)}
    figs = {claim: build() for claim, build in _figures(d, remedy_variants(d), heads).items()}
    yield {c: (f, heads[c]) for c, f in figs.items()}
    for f in figs.values():
        plt.close(f)


def test_every_figure_carries_the_verdict_its_page_prints(drawn):
    assert set(drawn) == {"F1", "F2", "F3", "F4", "F5", "dose-response"}
    for claim, (fig, head) in drawn.items():
        assert fig.get_suptitle().splitlines()[-1] == f"verdict: {head}", claim


def test_a_figure_with_nothing_to_draw_still_carries_its_verdict(tmp_path):
    """A recompute-only grid (results/rise_collapse, results/paper_vllm) has no remedies: F5 was a bare canvas."""
    decls = []
    for s in range(3):
        write(tmp_path, "baseline", "none", "recompute", s, curve(s), 0.60 + 0.01 * s, decls)
        write(tmp_path, "q4", "none", "recompute", s, curve(s, collapse_at=26, k3=0.02, delta=0.11), 0.1, decls)
    write_cells_json(tmp_path, decls, name="rise_collapse")
    d, _ = paper_data(tmp_path)
    heads = {v.claim: v.verdict for v in verdicts(d)}
    fig = _figures(d, remedy_variants(d), heads)["F5"]()
    assert fig.get_suptitle().splitlines()[-1] == f"verdict: {heads['F5']}" and heads["F5"] == "not tested"
    assert any("no finished remedy cells" in t.get_text() for t in fig.texts)
    plt.close(fig)


def test_f5_notes_sit_in_black_beside_their_bars_with_collapse_counts(drawn):
    fig, _ = drawn["F5"]
    ax = fig.axes[0]
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    frame = ax.get_window_extent(renderer)
    labels = [t.get_text() for t in ax.get_yticklabels()]
    notes = [t for t in ax.texts]
    assert len(notes) == len(labels) == 8
    bars = sorted(ax.patches, key=lambda p: p.get_y())  # one per label, top (y=0) first
    for note, bar, label in zip(sorted(notes, key=lambda t: t.xy[1]), bars, labels):
        assert note.get_color() == "black" and note.xy[1] == pytest.approx(bar.get_y() + bar.get_height() / 2)
        box = note.get_window_extent(renderer)
        # beside the bar's end and its error bar's, never on them, and inside the axes
        assert box.x0 > bar.get_window_extent(renderer).x1 and box.x1 <= frame.x1, (label, box, frame)
        assert note.xy[0] >= bar.get_width()
        assert " collapsed" in note.get_text() and note.get_text().split(" ")[0].count("/") == 1
    by_label = dict(zip(labels, (t.get_text() for t in sorted(notes, key=lambda t: t.xy[1]))))
    assert by_label["none (bypass)"].startswith(f"{SEEDS}/{SEEDS} collapsed")  # every seed of the fabricated grid
    assert by_label["tis+rs_k3 (recompute)"] == f"0/{SEEDS} collapsed, rejects 30% of seqs"
    caps = [xy for ln in ax.lines if ln.get_linestyle() != "--" for xy in ln.get_xydata()]  # not the 1.0 line
    bars_err = [xy for c in ax.collections for seg in c.get_segments() for xy in seg]
    assert len(caps) == len(bars_err) == 2 * len(labels)
    for x, y in caps + bars_err:  # every error bar ends left of its note
        note = min(notes, key=lambda t: abs(t.xy[1] - y))
        assert x <= note.xy[0] + 1e-12


def test_f5_title_names_the_modes_of_its_bars(drawn):
    fig, _ = drawn["F5"]
    title = fig.get_suptitle().splitlines()[0]
    assert "recompute and bypass modes (bars)" in title and "recompute mode (curves)" in title


def test_f4_draws_the_real_conditions_on_their_own_scale(drawn):
    fig, _ = drawn["F4"]
    panels = {ax.get_title().split(":")[0]: ax for ax in fig.axes if ":" in ax.get_title()}
    real, noise = panels["real conditions"], panels["gaussian noise sweep"]
    assert [t.get_text() for t in real.get_xticklabels()] == ["q4"]
    assert [t.get_text() for t in noise.get_xticklabels()] == ["noise-g1", "noise-g2", "noise-g3"]
    lo, hi = real.get_ylim()
    tallest = max(abs(p.get_height()) for p in real.patches)
    assert tallest > 0.25 * (hi - lo)  # beside noise-g3's 0.22 it was 5% of the axis


def _cell(seed: int, **kw) -> CellRun:
    return CellRun(f"s{seed}", {"seed": seed}, {}, None, {}, metrics=curve(seed, **kw))


def test_f3_draws_the_warning_level_and_a_minority_collapse_per_seed():
    cells = [_cell(0, k3=0.02), _cell(1, k3=0.02, k3_rise_at=20, collapse_at=30), _cell(2, k3=0.02)]
    rows = [
        {
            "seed": c.axes["seed"],
            "collapse/collapsed": c.axes["seed"] == 1,
            "collapse/step": 32 if c.axes["seed"] == 1 else None,
        }
        for c in cells
    ]
    fig = kl_warning_figure([Setting("q4 / recompute", cells, summary=rows)], "F3", 5, KL_RISE)
    ax, twin = fig.axes
    assert "1/3 seeds collapsed" in ax.get_title()
    level = [ln for ln in twin.lines if set(ln.get_ydata()) == {KL_RISE}]
    assert len(level) == 1 and "warning level" in level[0].get_label()
    seed = next(ln for ln in ax.lines if ln.get_label() == "seed 1 reward (collapsed at step 32)")
    own = moving_average([r["critic/rewards/mean"] for r in cells[1].metrics], 5)
    assert list(seed.get_ydata()) == pytest.approx(own)
    k3 = next(ln for ln in twin.lines if ln.get_label() == "seed 1 k3_kl / first 5 steps")
    # the drawn ratio crosses the level where the F3 rule's alarm goes off
    first = next(i for i, y in enumerate(k3.get_ydata()) if y > KL_RISE)
    assert first == kl_alarm_step(cells[1], 5)
    plt.close(fig)
    every = kl_warning_figure(
        [Setting("q4", cells, summary=[dict(r, **{"collapse/collapsed": True, "collapse/step": 32}) for r in rows])],
        "F3",
        5,
        KL_RISE,
    )
    assert not [ln for ln in every.axes[0].lines if ln.get_label().startswith("seed ")]  # the mean shows it
    plt.close(every)
