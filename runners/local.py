"""Local backend: each cell in its own fresh process (spawn), at most `workers` at a time.

A fresh process per cell keeps cells independent (thread settings, numba state,
memory) and lets the runner tell a crashed worker (segfault, OOM kill) from a
failed run: the worker writes its own cell.json; if it dies without doing so,
the runner records the cell as failed with the exit code. Workers die with the
runner (see `die_with_parent`), so a killed grid leaves no orphan writing.
"""

from __future__ import annotations

import ctypes
import multiprocessing as mp
import os
import signal
import sys
import threading
import time
from multiprocessing.connection import wait

from timbench.grid.layout import read_status, write_status
from timbench.rl.rundir import one_line

from .cell import run_cell
from .progress import Progress, steps_of

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def die_with_parent(parent_pid: int) -> None:
    """Make this worker process exit when the grid runner that started it dies (even by kill -9).

    Otherwise an orphaned worker would keep writing into runs/<id>/ while the
    rerun resumes the same cell: two writers, duplicated rows.
    """
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent_pid:  # the parent died before prctl took effect
            os._exit(1)
        return

    def watch():  # elsewhere: poll for being re-parented

        while os.getppid() == parent_pid:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, daemon=True).start()


def _worker(cell: dict, out: str, parent_pid: int) -> None:
    die_with_parent(parent_pid)
    try:
        run_cell(cell, out)
    except Exception as e:  # noqa: BLE001 - cell.json itself cannot be written (an unwritable run dir): one line
        print(f"grid: cell {cell['id']}: {one_line(e)}", file=sys.stderr, flush=True)
        sys.exit(1)


def _reap(proc, cell: dict, out: str, t0: float) -> dict:
    proc.join()
    try:
        st = read_status(out, cell["id"])
    except (OSError, ValueError):
        st = None
    if st is None or st["status"] == "running":  # a recorded result stands even if teardown crashed
        how = f"signal {-proc.exitcode}" if proc.exitcode and proc.exitcode < 0 else f"exit code {proc.exitcode}"
        st = _record_failed(
            out,
            cell["id"],
            f"worker process died ({how}) before recording a result",
            time.monotonic() - t0,
            (st or {}).get("attempts", 1),
        )
    return st


def _record_failed(out: str, cell_id: str, error: str, wall_s: float, attempts: int) -> dict:
    """cell.json := failed; where the run dir refuses the write, the failure is kept in memory (the grid's summary
    counts it) and the other cells go on: one bad directory must not stop its healthy siblings."""
    try:
        return write_status(out, cell_id, "failed", error, wall_s, attempts)
    except OSError as e:
        return {
            "status": "failed",
            "error": f"{error}; cell.json not written ({one_line(e)})",
            "wall_s": round(float(wall_s), 3),
            "attempts": int(attempts),
        }


TIMEOUT_FACTOR = 10.0
"""Default cell timeout = TIMEOUT_FACTOR x the cost model's single-thread estimate of the cell."""
TIMEOUT_FLOOR_S = 600.0
"""The default cell timeout's floor in seconds (a cheap cell on a busy machine may run many times its estimate)."""


def cell_timeouts(cells: list[dict], timeout_s: float | None) -> dict[str, float]:
    """Wall-clock limit per cell id: `timeout_s` for every cell when given (0 = none), else TIMEOUT_FACTOR x the
    cost model's estimate, at least TIMEOUT_FLOOR_S (the estimate is for a quiet core; a busy one is slower)."""
    if timeout_s is not None:
        if not 0 <= timeout_s < float("inf"):  # NaN too: it compares false, and read as "no limit" before
            raise ValueError(f"--cell-timeout must be >= 0 seconds and finite (0 = no limit), got {timeout_s:g}")
        return {} if timeout_s == 0 else {c["id"]: float(timeout_s) for c in cells}
    from timbench.grid.cost import cell_seconds

    return {c["id"]: max(TIMEOUT_FLOOR_S, TIMEOUT_FACTOR * cell_seconds(c["config"])) for c in cells}


def record_timeout(out: str, cell_id: str, limit: float, wall_s: float) -> dict:
    """Record a cell whose run was killed past its `limit` as failed, with the one-line reason of every backend
    (the Ray backend's too); its last checkpoint stays, so a rerun with --retry-failed resumes it."""
    prev = read_status(out, cell_id) or {}
    return write_status(
        out,
        cell_id,
        "failed",
        f"timed out after {limit:.0f} s (the cell timeout: --cell-timeout SECONDS sets it, 0 = none; "
        f"the default is {TIMEOUT_FACTOR:g}x the cost model's estimate, at least "
        f"{TIMEOUT_FLOOR_S:.0f} s)",
        wall_s,
        int(prev.get("attempts", 1)),
    )


def _timed_out(proc, cell: dict, out: str, t0: float, limit: float) -> dict:
    proc.kill()  # a cell past its limit (a plug-in that never returns): its last checkpoint stays for a rerun
    proc.join()
    return record_timeout(out, cell["id"], limit, time.monotonic() - t0)


def run_local(
    cells: list[dict],
    out: str,
    workers: int | None = None,
    address: str | None = None,
    progress: Progress | None = None,
    timeouts: dict[str, float] | None = None,
) -> list[dict]:
    """Run `cells` (cells.json entries) under `out`; return their final cell.json statuses, in order.

    `timeouts` maps a cell id to its wall-clock limit in seconds (absent: none); a cell past it is killed and
    recorded failed with a one-line reason, and the grid goes on."""
    timeouts = timeouts or {}
    if address is not None:
        raise ValueError("--address is only for --backend ray")
    workers = workers or os.cpu_count() or 1
    ctx = mp.get_context("spawn")  # never fork a process that has torch/numba thread pools running
    queue, running, results = list(cells), {}, {}
    if progress:  # the progress line counts the running cells' steps
        progress.running_steps = lambda: steps_of(out, [cell for _, cell, _ in running.values()])
    try:
        while queue or running:
            while queue and len(running) < workers:
                cell = queue.pop(0)
                proc = ctx.Process(target=_worker, args=(cell, str(out), os.getpid()), name=f"cell {cell['id']}")
                proc.start()
                running[proc.sentinel] = (proc, cell, time.monotonic())
                if progress:
                    progress.running += 1
            if progress:
                progress.emit()
            now = time.monotonic()
            deadlines = [t0 + timeouts[c["id"]] - now for _, c, t0 in running.values() if c["id"] in timeouts]
            waits = [w for w in (progress.every_s if progress else None, min(deadlines, default=None)) if w is not None]
            for sentinel in wait(list(running), timeout=max(0.0, min(waits)) if waits else None):
                proc, cell, t0 = running.pop(sentinel)
                results[cell["id"]] = _reap(proc, cell, str(out), t0)
                if progress:
                    progress.finished(results[cell["id"]])
            now = time.monotonic()
            for sentinel, (proc, cell, t0) in list(running.items()):
                limit = timeouts.get(cell["id"])
                if limit is not None and now - t0 >= limit:
                    del running[sentinel]
                    results[cell["id"]] = _timed_out(proc, cell, str(out), t0, limit)
                    if progress:
                        progress.finished(results[cell["id"]])
    finally:
        for proc, _, _ in running.values():  # interrupted: stop the workers; their cells resume next time
            proc.terminate()
            proc.join()
    if progress:
        progress.emit(force=True)
    return [results[c["id"]] for c in cells]
