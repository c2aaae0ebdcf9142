"""Ray backend: one streaming task per cell; only the driver touches the results directory.

`address` is `local` (start a private Ray instance sized to `workers`), `auto`
(join the cluster this machine belongs to) or a cluster address (`HOST:PORT`).
If Ray is already initialised in this process (a test, a notebook), that
instance is used and left running.

No shared filesystem is assumed. The driver ships each cell's config, the files
it names that are not part of timbench (runners.ship.bundle: a checkpoint
directory, a plug-in remedy file; one object-store copy per distinct pair) and
the cell's last checkpoint and logs from the results directory. The worker
(runners.ray_cell) trains in a node-local scratch directory and streams back a
snapshot at every checkpoint the run saves and all files at the end (a Ray
generator task: each `yield` reaches the driver while the task runs). The
driver writes each snapshot into runs/<id>/ atomically, in the layout of the
local backend, so one grid directory can hold cells of both backends.

Faults: Ray does not retry a cell (max_retries=0); the driver does. A lost
worker or node (ray.get raises) costs the steps since the last snapshot the
driver received: the cell is resubmitted with that checkpoint, up to
`max_attempts` submissions in this invocation, then recorded failed with a
one-line reason. A failure of the run itself (bad config, non-finite loss) is
reported by the worker and not retried, as in the local backend; nor is an
exception of the task code itself (RayTaskError). A driver killed
even by kill -9 resumes with the same command: the results directory holds only
whole files, and a snapshot's logs are written before its checkpoint.
"""

from __future__ import annotations

import json
import os
import secrets
import sys
import time
from dataclasses import dataclass, field

from timbench.grid.layout import read_status, record_if_finished, run_dir, write_status
from timbench.rl.rundir import clear_end_markers

from .cell import one_line
from .progress import Progress
from .ray_cell import cell_task
from .ship import CKPT, bundle, checkpoint_step, read_run, write_run

MAX_ATTEMPTS = 3
"""Submissions of one cell per invocation when workers or nodes are lost (its own errors are not retried)."""


def _import_ray():
    try:
        import ray
    except ImportError:
        raise ValueError("--backend ray needs the optional extra: pip install 'timbench[ray]'") from None
    return ray


def _token_auth_for_a_local_cluster() -> None:
    """Start the local cluster with Ray's token authentication (a fresh random token unless RAY_AUTH_TOKEN is set).

    Ray's GCS, raylet and workers listen on every interface (`ss -ltnp` shows `*:port`; Ray 2.60 has no
    loopback-only switch), so without a token anyone who can reach this machine could submit code to them.
    With it, a client that lacks the token is refused (tests/test_grid.py checks a foreign `ray.init`).
    RAY_AUTH_MODE=disabled set by the user is respected. The mode is read into Ray's cached config, so it is
    set here and the cache refreshed (Ray's own `_enable_token_auth` does exactly that).
    """
    if os.environ.get("RAY_AUTH_MODE", "").lower() == "disabled":
        return
    os.environ.setdefault("RAY_AUTH_TOKEN", secrets.token_hex(32))
    from ray._private.authentication.authentication_token_setup import _enable_token_auth
    from ray._raylet import AuthenticationTokenLoader
    _enable_token_auth()
    AuthenticationTokenLoader.instance().reset_cache()


@dataclass
class _Cell:
    cell: dict
    submitted: float = field(default_factory=time.monotonic)
    tries: int = 0
    started: bool = False
    node: str | None = None


def parse_resources(text: str | None) -> dict[str, float]:
    """`--resources` JSON ({"name": amount, ...}) -> dict, or a one-line ValueError."""
    if not text:
        return {}
    try:
        res = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"--resources must be a JSON object such as '{{\"extra\": 1}}', got {text!r} ({e.msg})") from None
    if not isinstance(res, dict) or not all(isinstance(k, str) and isinstance(v, (int, float)) and v > 0
                                            for k, v in res.items()):
        raise ValueError(f"--resources must map resource names to positive numbers, got {text!r}")
    if {"CPU", "GPU"} & set(res):
        raise ValueError("--resources: CPU comes from the cell's `threads` and GPU is not used; "
                         "give custom resources only")
    return res


def run_ray(cells: list[dict], out: str, workers: int | None = None, address: str | None = "local",
            progress: Progress | None = None, resources: dict | None = None,
            max_attempts: int = MAX_ATTEMPTS) -> list[dict]:
    """Run `cells` as Ray tasks, each needing `resources` (custom, per cell) besides its threads' CPUs."""
    ray = _import_ray()
    out = os.path.abspath(out)
    if max_attempts < 1:
        raise ValueError(f"max_attempts must be >= 1, got {max_attempts}")
    started = False
    if not ray.is_initialized():
        address = address or "local"
        if address == "local":
            _token_auth_for_a_local_cluster()
        # address="local" always starts a new cluster: without it ray.init joins whatever cluster RAY_ADDRESS or
        # /tmp/ray names (another user's on the same machine); joining one is what --address auto|HOST:PORT is for
        kw = {"address": "local", "num_cpus": workers} if address == "local" else {"address": address}
        ray.init(include_dashboard=False, **kw)
        started = True
    log = lambda msg: print(msg, file=(progress.stream if progress else None) or sys.stderr, flush=True)
    results: dict[str, dict] = {}
    try:
        task = ray.remote(cell_task)
        shipped: dict[str, object] = {}  # one object-store copy per distinct (model, remedy)
        gens: dict = {}

        def finish(c: _Cell, st: dict) -> None:
            results[c.cell["id"]] = st
            if progress:
                progress.running += 0 if c.started else 1  # finished() counts it out of running
                progress.finished(st)
            c.started = False

        def submit(c: _Cell) -> None:
            cid, cfg = c.cell["id"], c.cell["config"]
            rd = run_dir(out, cid)
            finished = record_if_finished(out, cid)
            if finished is not None:
                finish(c, finished)
                return
            prev = read_status(out, cid) or {}
            key = json.dumps([cfg.get("model", "default"), cfg.get("remedy", "none")])
            try:
                if key not in shipped:
                    shipped[key] = ray.put(bundle(cfg))
            except (OSError, ValueError) as e:  # a file the cell names is missing on the driver
                finish(c, write_status(out, cid, "failed", one_line(e), 0.0, prev.get("attempts", 0) + 1))
                return
            c.tries, c.started, c.submitted = c.tries + 1, False, time.monotonic()
            gen = task.options(num_cpus=cfg.get("threads", 1), resources=dict(resources or {}), max_retries=0,
                               name=f"cell {cid}").remote(c.cell, shipped[key], read_run(rd))
            gens[gen] = c

        def lost(c: _Cell, err: BaseException) -> None:
            cid = c.cell["id"]
            if progress and c.started:
                progress.running -= 1
            c.started = False
            ckpt = run_dir(out, cid) / CKPT
            step = checkpoint_step(ckpt.read_bytes()) if ckpt.is_file() else 0
            where = f"node {c.node[:12]}" if c.node else "a worker"
            if c.tries < max_attempts:
                log(f"cell {cid}: lost on {where} ({one_line(err)}); resuming from step {step} "
                    f"(submission {c.tries + 1} of {max_attempts})")
                submit(c)
                return
            prev = read_status(out, cid) or {}
            finish(c, write_status(out, cid, "failed",
                                   f"ray: worker or node lost {c.tries} times (last on {where}: {one_line(err)})",
                                   time.monotonic() - c.submitted, max(prev.get("attempts", 0), 1)))

        for cell in cells:
            submit(_Cell(cell))
        while gens:
            if progress:
                progress.emit()
            ready, _ = ray.wait(list(gens), num_returns=1, timeout=5.0 if progress else None)
            for gen in ready:
                c = gens[gen]
                cid = c.cell["id"]
                try:
                    msg = ray.get(next(gen))
                except StopIteration:
                    del gens[gen]
                    lost(c, RuntimeError("the cell task ended without a result"))
                    continue
                except ray.exceptions.RayTaskError as e:  # our task code itself raised: retrying would repeat it
                    del gens[gen]
                    prev = read_status(out, cid) or {}
                    finish(c, write_status(out, cid, "failed", f"ray task raised {one_line(e.cause or e)}",
                                           time.monotonic() - c.submitted, max(prev.get("attempts", 0), 1)))
                    continue
                except Exception as e:  # noqa: BLE001 - a dead worker or node: resume elsewhere or record it
                    del gens[gen]
                    lost(c, e)
                    continue
                if msg["kind"] == "started":
                    c.started, c.node = True, msg["node"]
                    prev = read_status(out, cid) or {}
                    write_status(out, cid, "running", None, 0.0, int(prev.get("attempts", 0)) + 1)
                    # A new attempt: an earlier attempt's end markers no longer describe the run (rundir.begin).
                    clear_end_markers(run_dir(out, cid))
                    if progress:
                        progress.running += 1
                elif msg["kind"] == "checkpoint":
                    write_run(run_dir(out, cid), msg["files"])
                else:
                    del gens[gen]
                    write_run(run_dir(out, cid), msg["files"])
                    prev = read_status(out, cid) or {}
                    finish(c, write_status(out, cid, msg["status"], msg["error"], msg["wall_s"],
                                           max(int(prev.get("attempts", 0)), 1)))
    finally:
        if started:
            ray.shutdown()
    if progress:
        progress.emit(force=True)
    return [results[c["id"]] for c in cells]
