"""Ray backend: one remote task per cell (num_cpus = the cell's threads), results on a shared path.

`address` is `local` (start a private Ray instance sized to `workers`), `auto`
(join the cluster this machine belongs to) or a cluster address. If Ray is
already initialised in this process (a test, a notebook), that instance is used
and left running. Every node must see the results directory at the same path
(a shared filesystem): workers write runs/<id>/ themselves, exactly as the
local backend's processes do. Tasks are not retried by Ray (max_retries=0): a
lost worker is a failed cell, rerun with `--retry-failed`, which resumes it
from its checkpoint.
"""

from __future__ import annotations

import os
import time

from timbench.grid.layout import read_status, write_status

from .cell import one_line, run_cell
from .progress import Progress


def _import_ray():
    try:
        import ray
    except ImportError:
        raise ValueError("--backend ray needs the optional extra: pip install 'timbench[ray]'") from None
    return ray


def _remote_cell(cell: dict, out: str, cwd: str) -> dict:
    if os.path.isdir(cwd):  # relative checkpoint paths in configs mean the driver's directory
        os.chdir(cwd)
    return run_cell(cell, out)


def run_ray(cells: list[dict], out: str, workers: int | None = None, address: str | None = "local",
            progress: Progress | None = None) -> list[dict]:
    """Run `cells` as Ray tasks; return their final cell.json statuses, in order."""
    ray = _import_ray()
    out = os.path.abspath(out)
    started = False
    if not ray.is_initialized():
        address = address or "local"
        kw = {"num_cpus": workers} if address == "local" else {"address": address}
        ray.init(include_dashboard=False, **kw)
        started = True
    try:
        task = ray.remote(_remote_cell)
        refs = {task.options(num_cpus=c["config"].get("threads", 1), max_retries=0, name=c["id"])
                .remote(c, out, os.getcwd()): c for c in cells}
        results, t0 = {}, time.monotonic()

        def refresh():  # Ray schedules on its own; a cell is running once its worker wrote cell.json
            progress.running = sum(1 for c in refs.values()
                                   if (read_status(out, c["id"]) or {}).get("status") == "running")
        while refs:
            if progress:
                refresh()
                progress.emit()
            # Poll every few seconds: cells start without telling the driver, and the line shows them.
            done, _ = ray.wait(list(refs), num_returns=1, timeout=5.0 if progress else None)
            for ref in done:
                cell = refs.pop(ref)
                try:
                    st = ray.get(ref)
                except Exception as e:  # noqa: BLE001 - a dead worker or node: record it, keep going
                    prev = read_status(out, cell["id"]) or {}  # wall_s: since submission (start unknown)
                    st = write_status(out, cell["id"], "failed", f"ray task failed: {one_line(e)}",
                                      time.monotonic() - t0, prev.get("attempts", 1))
                results[cell["id"]] = st
                if progress:
                    progress.finished(st)
        if progress:
            refresh()
    finally:
        if started:
            ray.shutdown()
    if progress:
        progress.emit(force=True)
    return [results[c["id"]] for c in cells]
