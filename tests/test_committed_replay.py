"""Every committed grid, track and run still reproduces at this code (a result no code can remake is not a result).

One cell of each committed grid (timbench.grid.replay.replay_cell: a `none` cell under a mismatched condition,
exact kernels on timbench's CPU engine, so the same bits on any x86-64 CPU) replays its first two steps and must
log every committed metric value unchanged; a metric added since is not a change. A commit that moves training
fails here naming the grid and the keys, instead of leaving results/ that `timbench submit` refuses and
`timbench paper` no longer reproduces. A few seconds per grid.
"""

from pathlib import Path

import pytest

from timbench.grid.replay import replay_grid, replay_run, summarize

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "results"
STEPS = 2
# The grids and tracks committed when this test was written: discovery below must keep finding them (a grid
# moved or its cells.json lost would otherwise drop out of the replay without a word).
KNOWN = {
    "claims_grid",
    "long_horizon",
    "long_pilot",
    "lowprec",
    "nvfp4",
    "paper",
    "paper_vllm",
    "proxy_dense",
    "proxy_moe",
    "quick",
    "rise_collapse",
    "size_ladder/grid",
    "staleness_quick",
    "tracks/mini",
    "tracks/quick",
    "vllm_moe",
}
GRIDS = sorted(str(p.parent.relative_to(RESULTS)) for p in RESULTS.glob("**/cells.json") if "runs" not in p.parts)
RUNS = sorted(str(p.parent.relative_to(RESULTS)) for p in RESULTS.glob("runs/*/config.yaml"))


def test_every_committed_grid_is_found():
    assert KNOWN <= set(GRIDS), f"committed grids no longer found by their cells.json: {sorted(KNOWN - set(GRIDS))}"
    assert "runs/baseline" in RUNS


@pytest.mark.slow
@pytest.mark.parametrize("grid", GRIDS)
def test_committed_grid_replays_at_head(grid):
    cell, diffs = replay_grid(RESULTS / grid, steps=STEPS)
    # No CPU-independent cell means nothing here can be checked bit for bit: say so rather than pass silently.
    assert cell is not None, f"results/{grid} has no cell with exact kernels on timbench's CPU engine to replay"
    assert not diffs, (
        f"results/{grid} no longer reproduces at this code ({summarize(cell, diffs)}); "
        f"regenerate it or mark its page as made by an older version"
    )


@pytest.mark.slow
@pytest.mark.parametrize("run", RUNS)
def test_committed_run_replays_at_head(run):
    diffs = replay_run(RESULTS / run, steps=STEPS)
    assert not diffs, f"results/{run} no longer reproduces at this code: {'; '.join(diffs[:3])}"


@pytest.mark.slow
def test_a_changed_committed_value_is_named(tmp_path):
    # The check above can fail: one committed value off by a factor is reported by key with both values.
    import json
    import shutil

    run = tmp_path / "baseline"
    shutil.copytree(RESULTS / "runs/baseline", run)
    lines = (run / "metrics.jsonl").read_text().splitlines(keepends=True)
    first = json.loads(lines[0])
    (run / "metrics.jsonl").write_text(json.dumps(dict(first, **{"actor/grad_norm": 2.0})) + "\n" + "".join(lines[1:]))
    assert replay_run(run, steps=1) == [f"step 0 actor/grad_norm: 2.0 -> {first['actor/grad_norm']!r}"]


def test_a_cpu_dependent_run_is_not_replayed(tmp_path):
    (tmp_path / "config.yaml").write_text("engine: {kernels: torch}\ntrainer: {kernels: exact}\n")
    with pytest.raises(ValueError, match="not exact kernels .* cannot be compared bit for bit"):
        replay_run(tmp_path)
