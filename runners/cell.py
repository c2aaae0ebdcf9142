"""Run one grid cell: one `timbench.rl.loop.run` into runs/<id>/, bracketed by cell.json status writes.

Called in a fresh worker process (local pool) or a Ray task. It never raises
for a failed run: every exception, NonFiniteError included, becomes a one-line
error in cell.json (the traceback goes to runs/<id>/error.txt), so one bad cell
cannot take the grid down. A run whose summary.json says finished is skipped;
an interrupted one resumes from its last checkpoint through loop.run's own
resume, which writes each step exactly once.
"""

from __future__ import annotations

import json
import time
import traceback

from timbench.grid.layout import read_status, record_done, record_if_finished, run_dir, status_record, write_status
from timbench.rl.rundir import one_line  # the one-line error format cell.json and status.json share
from timbench.util.atomic import atomic_write


def run_cell(cell: dict, out: str) -> dict:
    """Run (or resume, or skip) `cell` (an entry of cells.json) under results dir `out`; return its status."""
    cid = cell["id"]
    finished = record_if_finished(out, cell)
    if finished is not None:
        return finished
    attempts = int((read_status(out, cid) or {}).get("attempts", 0)) + 1
    write_status(out, cid, "running", None, 0.0, attempts)
    t0 = time.perf_counter()

    def killed(reason: str) -> dict:  # a plug-in outlived its limit: this process ends now (remedies.deadline)
        rec = status_record("failed", f"PluginTimeout: {reason}", time.perf_counter() - t0, attempts)
        return {run_dir(out, cid) / "cell.json": json.dumps(rec, sort_keys=True) + "\n"}

    try:
        from timbench.remedies.deadline import last_words
        from timbench.rl.config import from_dict
        from timbench.rl.loop import run

        with last_words(killed):
            run(from_dict(dict(cell["config"]), f"cell {cid}"), run_dir(out, cid), progress=False)
    except Exception as e:  # noqa: BLE001 - isolation is the point; KeyboardInterrupt still propagates
        atomic_write(run_dir(out, cid) / "error.txt", traceback.format_exc())
        return write_status(out, cid, "failed", one_line(e), time.perf_counter() - t0, attempts)
    return record_done(out, cell, time.perf_counter() - t0, attempts)
