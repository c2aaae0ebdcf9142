"""`timbench grid run`: plan the grid, write the layout, run every cell not yet done, report.

Resumable by construction: a cell's state lives in its own runs/<id>/ (cell.json,
the run's checkpoint and logs), so rerunning the same command after a kill at any
moment skips finished cells, resumes interrupted ones from their last checkpoint
and reruns failed ones only when asked (`retry_failed`).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from timbench.grid.layout import GridLock, integrity, prepare, read_status, reset_run, run_dir
from timbench.grid.spec import GridSpec, expand
from timbench.util import manifest

from . import get_backend
from .order import order_cells
from .progress import Progress


def select(cells: list[dict], out: str | Path, retry_failed: bool, stream=None) -> list[dict]:
    """Cells to run now: never done ones; failed ones only with retry_failed; stale `running` ones resume; done
    ones whose files no longer match their manifest are reset and redone (one line each on `stream`).

    A done cell with no manifest at all was made before manifests: that is refused (one line naming the
    adopt command) rather than silently trusted or silently rerun."""
    todo, legacy = [], []
    for c in cells:
        st = (read_status(out, c["id"]) or {}).get("status")
        if st == "done":
            bad = integrity(out, c)
            if not bad:
                continue
            if manifest.missing(run_dir(out, c["id"])):
                legacy.append(c["id"])
                continue
            for line in bad:
                print(f"grid: cell {c['id']}: {line}; redoing it", file=stream or sys.stderr)
            reset_run(out, c["id"])
        elif st == "failed" and not retry_failed:
            continue
        todo.append(c)
    if legacy:
        raise ValueError(
            f"{out}: {len(legacy)} done cell(s) have no manifest.json (made before integrity manifests, "
            f"e.g. {legacy[0]}); check and stamp them once with `timbench grid verify {out} --adopt`"
        )
    return todo


def run_cells(
    cells: list[dict],
    out: str | Path,
    label: str,
    workers: int,
    backend: str = "local",
    address: str | None = None,
    retry_failed: bool = False,
    stream=None,
    options: dict | None = None,
    announce=None,
) -> dict[str, dict]:
    """Run the cells of `cells` that are not done yet into `out` (whose cells.json already holds them, under the
    caller's lock); return {cell id: final cell.json status} for every cell given.

    The one way cells run, for `grid run`, `track run` and `submit`: `select` (manifest checks, retry rule),
    a progress line counting these cells, the backend, and the per-cell wall-clock limit of either backend
    (`options["cell_timeout"]`, see runners.local.cell_timeouts), in `options["order"]` (ORDERS). Other
    `options` are the backend's own keyword arguments (Ray: `resources`, `max_attempts`). `announce(n_todo)`,
    when given, is told how many cells will run before any does (submit's "k of n cells to run" line)."""
    run = get_backend(backend)
    options = dict(options or {})
    todo = order_cells(select(cells, out, retry_failed, stream), options.pop("order", "axes"))
    if announce is not None:
        announce(len(todo))
    todo_ids = {c["id"] for c in todo}
    before = {c["id"]: (read_status(out, c["id"]) or {}).get("status") for c in cells if c["id"] not in todo_ids}
    done = sum(1 for s in before.values() if s == "done")
    failed = sum(1 for s in before.values() if s == "failed")
    progress = Progress(label, len(cells), done, failed, workers, stream=stream)
    timeout = options.pop("cell_timeout", None)
    if todo:
        from .local import cell_timeouts

        options["timeouts"] = cell_timeouts(todo, timeout)
        run(todo, str(out), workers, address, progress, **options)
    return {c["id"]: read_status(out, c["id"]) for c in cells}


def run_grid(
    grid: GridSpec,
    out: str | Path,
    workers: int | None = None,
    backend: str = "local",
    address: str | None = None,
    retry_failed: bool = False,
    stream=None,
    options: dict | None = None,
) -> dict[str, dict]:
    """Run `grid` into `out`; return {cell id: final cell.json status} for every cell of the grid."""
    planned = expand(grid)
    cells = [c.to_dict() for c in planned]
    workers = workers or grid.workers or os.cpu_count() or 1
    with GridLock(out):
        prepare(out, grid, planned)
        return run_cells(cells, out, grid.name, workers, backend, address, retry_failed, stream, options)
