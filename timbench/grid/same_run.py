"""The same run given twice counts once: a run's identity by content, and input directories given once.

Commands that pool several result directories (`claims`, `early-warning`, `proxy-fidelity`, `gate matrix`,
`grid merge`, `risk` over a results tree) could meet one run twice: a directory named twice (`results/paper
./results/paper/`), or two grids that hold the same runs (results/f5_powered holds results/paper's seeds 0-5;
dual_clip and claims_grid replay paper's control cells bit for bit). A directory named twice is refused in one
line (`distinct_dirs`): it is a slip, and no answer is right for it. Runs held by several grids are identified
by content (`run_identity`: the config the run ran, plug-in directory dropped as in every resume check, and its
logs) and count once wherever runs are pooled; a grid's own reading (its leaderboard, its settings) keeps them.
Two cells with the same logs but another config (a condition that happens to be bitwise the reference) are two
runs, and two grids whose cells share an id but not the logs are two runs too. An align or diagnose table that
lists a model or a condition twice is refused in one line (`refuse_repeats`): its rows would be measured twice.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from ..remedies.identity import comparable_config


def run_identity(config: dict, metrics: list[dict], evals: list[dict]) -> str:
    """sha256 of a run's content: its config (comparable_config) and the rows of its metrics and eval logs."""
    h = hashlib.sha256()
    for part in (comparable_config(config), metrics, evals):
        h.update(json.dumps(part, sort_keys=True, separators=(",", ":")).encode())
        h.update(b"\0")
    return h.hexdigest()


def cell_identity(cell) -> str:
    """run_identity of a report's CellRun (report.results)."""
    return run_identity(cell.config, cell.metrics, cell.evals)


def distinct_dirs(dirs: list, what: str = "result directory") -> list:
    """`dirs` as given, or a one-line ValueError when two name the same directory (compared resolved, so
    `results/paper`, `./results/paper/` and a symlink to it are one): its runs would count twice."""
    seen: dict[str, str] = {}
    for d in dirs:
        key = os.path.realpath(Path(d))
        if key in seen:
            same = "twice" if str(d).rstrip("/") == seen[key].rstrip("/") else f"twice (as {seen[key]} and {d})"
            raise ValueError(
                f"{d}: the same {what} given {same}; each counts once, so name it once "
                "(runs held by several different directories already count once)"
            )
        seen[key] = str(d)
    return list(dirs)


def refuse_repeats(names: list, what: str, where: str) -> None:
    """A one-line ValueError when `names` (an align or diagnose table's models or condition names) holds one
    twice: its rows would be measured and listed twice."""
    if not isinstance(names, list):  # not a list: the table's own checks say what is valid
        return
    seen = set()
    for n in names:
        if repr(n) in seen:
            raise ValueError(f"{where}: {what} {n!r} is listed twice; each counts once, so list it once")
        seen.add(repr(n))
