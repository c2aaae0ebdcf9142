"""Does a committed result still reproduce at this code? Replay the first step(s) of one cell and compare values.

Training is bitwise deterministic on any x86-64 CPU, so one replayed step of a cell whose arithmetic is
CPU-independent (exact kernels on both sides, timbench's own engine) must log the committed values exactly.
The comparison is by metric key, not by raw line: a key the code logs now and the committed run did not
(a metric added since) is not a change; a committed key that is gone, or whose value differs by one bit, is,
and is reported by key with both values. Used by `timbench submit`'s preflight (timbench.submit.track) and by
the test that replays every committed grid and track (tests/test_committed_replay.py).
"""

from __future__ import annotations

import json
import math
import tempfile
from pathlib import Path

from ..util.readfile import read_json, read_yaml


def _cpu_independent(cell: dict) -> bool:
    """Exact kernels on both sides and timbench's own engine on the CPU: the same bits on any x86-64 CPU."""
    return _config_cpu_independent(cell["config"])


def _config_cpu_independent(cfg: dict) -> bool:
    eng, tr = cfg.get("engine") or {}, cfg.get("trainer") or {}
    return (
        eng.get("kernels", "exact") == "exact"
        and tr.get("kernels", "exact") == "exact"
        and eng.get("engine", "timbench") == "timbench"
        and eng.get("device", "cpu") == "cpu"
        and tr.get("device", "cpu") == "cpu"
    )


def replay_cell(cells: list[dict]) -> dict | None:
    """The cell to replay: the first `none`-remedy cell under a mismatched condition whose arithmetic is
    CPU-independent (it exercises the mismatch path), else the first CPU-independent cell, else None."""
    exact = [c for c in cells if _cpu_independent(c)]
    mismatched = [c for c in exact if c["axes"].get("remedy", "none") == "none" and c.get("reference") is not None]
    return (mismatched or exact or [None])[0]


def _same(a, b) -> bool:
    # JSON has no NaN literal of its own; a NaN logged twice is the same value, not a change.
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b


def compare_rows(committed: list[dict], now: list[dict]) -> list[str]:
    """One line per committed metric whose value is gone or differs (step, key, committed -> now); a key only
    `now` logs is not a difference."""
    out = []
    for step, (a, b) in enumerate(zip(committed, now)):
        for key in sorted(a):
            if key not in b:
                out.append(f"step {step} {key}: logged {a[key]!r}, not logged now")
            elif not _same(a[key], b[key]):
                out.append(f"step {step} {key}: {a[key]!r} -> {b[key]!r}")
    if len(now) < len(committed):
        out.append(f"the replay logged {len(now)} steps, the committed run {len(committed)}")
    return out


def _rows(path: Path, steps: int) -> list[dict]:
    lines = [x for x in path.read_text().splitlines() if x.strip()][:steps]
    return [json.loads(x) for x in lines]


def replay(results: str | Path, cell: dict, steps: int = 1) -> list[str]:
    """Run the first `steps` steps of `cell` now and compare with the committed `results/runs/<id>/metrics.jsonl`;
    returns the differences (empty: the committed result reproduces at this code)."""
    from .layout import run_dir  # deferred: torch is heavy

    return _replay_config(cell["config"], run_dir(results, cell["id"]) / "metrics.jsonl", steps, f"cell {cell['id']}")


def replay_run(run: str | Path, steps: int = 1) -> list[str]:
    """The same for one run directory (`timbench train --out DIR`: its config.yaml and metrics.jsonl); a run whose
    arithmetic depends on the CPU (fast kernels, another engine) cannot be compared bit for bit: ValueError."""
    run = Path(run)
    cfg = read_yaml(run / "config.yaml", "run config")
    if not isinstance(cfg, dict):
        raise ValueError(f"{run / 'config.yaml'}: a run config is a mapping of keys to values")
    if not _config_cpu_independent(cfg):
        raise ValueError(
            f"{run}: not exact kernels on timbench's CPU engine on both sides, so its values depend "
            "on the CPU and a replay cannot be compared bit for bit"
        )
    return _replay_config(cfg, run / "metrics.jsonl", steps, f"run {run}")


def _replay_config(config: dict, metrics: Path, steps: int, what: str) -> list[str]:
    from ..rl.config import from_dict  # deferred: torch is heavy
    from ..rl.loop import run  # deferred: torch is heavy

    committed = _rows(metrics, steps)
    if not committed:
        return [f"{what} has no committed metrics to replay"]
    cfg = dict(config, steps=len(committed))
    with tempfile.TemporaryDirectory(prefix="timbench-replay-") as tmp:
        run(from_dict(cfg, f"replay of {what}"), Path(tmp) / "run", progress=False)
        now = _rows(Path(tmp) / "run" / "metrics.jsonl", len(committed))
    return compare_rows(committed, now)


def summarize(cell_id: str, diffs: list[str], shown: int = 3) -> str:
    """One line: the cell, how many values differ, the first few by key."""
    more = f" (and {len(diffs) - shown} more)" if len(diffs) > shown else ""
    return f"a replay of cell {cell_id} differs from its committed metrics.jsonl: " + "; ".join(diffs[:shown]) + more


def replay_grid(results: str | Path, steps: int = 1) -> tuple[str | None, list[str]]:
    """Replay the grid's replay cell (`replay_cell`): (cell id or None when no cell is CPU-independent, diffs)."""
    cells = read_json(Path(results) / "cells.json", "grid cells file")["cells"]
    cell = replay_cell(cells)
    return (None, []) if cell is None else (cell["id"], replay(results, cell, steps))


__all__ = ["compare_rows", "replay", "replay_cell", "replay_grid", "replay_run", "summarize"]
