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
exception of the task code itself (RayTaskError). A cell past its wall-clock
limit (runners.local.cell_timeouts) is cancelled, its worker process killed,
and recorded failed as in the local backend, not retried; its scratch directory
stays in the node's temp dir, as after any killed worker. A driver killed
even by kill -9 resumes with the same command: the results directory holds only
whole files, and a snapshot's logs are written before its checkpoint; a local
instance it started ends with it (runners.reaper), and listens on 127.0.0.1 only.

Ray's own transport (the task, its arguments, what a worker yields) is pickle: the nodes of a cluster are
trusted (docs/guides/ray.md). What timbench itself reads back, a checkpoint, is read without pickle's code.
"""

from __future__ import annotations

import json
import os
import secrets
import sys
import time
from dataclasses import dataclass, field

from timbench.grid.layout import read_status, record_done, record_if_finished, run_dir, write_status
from timbench.rl.rundir import clear_end_markers

from . import reaper
from .cell import one_line
from .local import record_timeout
from .progress import Progress
from .ray_cell import cell_task
from .ship import CKPT, bundle, checkpoint_step, read_run, write_run

MAX_ATTEMPTS = 3
"""Submissions of one cell per invocation when workers or nodes are lost (its own errors are not retried)."""
PROGRESS_EVERY_S = 5.0
"""With a progress line, the longest the driver waits for a message before printing it again (if changed)."""
LOOPBACK = {"_node_ip_address": "127.0.0.1"}
"""A local instance's node address (with `_loopback_only`): every port of it, the GCS's, the raylet's, the agents'
and the workers', listens on 127.0.0.1 only, not on the host's address."""
SINGLE_NODE = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
"""Ray's switch for a machine that is no cluster node (ray_constants.ENABLE_RAY_CLUSTER): off, Ray takes the
loopback address as the node's instead of resolving 127.0.0.1 to the host's address; on Linux it is on."""


def _import_ray():
    try:
        import ray
    except ImportError:
        raise ValueError("--backend ray needs the optional extra: pip install 'timbench[ray]'") from None
    return ray


def _token_auth_for_a_local_cluster() -> None:
    """Start the local cluster with Ray's token authentication (a fresh random token unless RAY_AUTH_TOKEN is set).

    A local instance listens on 127.0.0.1 only (`_loopback_only`), but every user of this machine can reach
    that, so without a token any of them could submit code to it. With it, a client that lacks the token is
    refused (tests/test_grid.py checks a foreign `ray.init`).
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


def parse_resources(text: str | None) -> dict[str, float]:
    """`--resources` JSON ({"name": amount, ...}) -> dict, or a one-line ValueError."""
    if not text:
        return {}
    try:
        res = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(
            f"--resources must be a JSON object such as '{{\"extra\": 1}}', got {text!r} ({e.msg})"
        ) from None
    if not isinstance(res, dict) or not all(
        isinstance(k, str) and isinstance(v, (int, float)) and v > 0 for k, v in res.items()
    ):
        raise ValueError(f"--resources must map resource names to positive numbers, got {text!r}")
    if {"CPU", "GPU"} & set(res):
        raise ValueError(
            "--resources: CPU comes from the cell's `threads` and GPU is not used; give custom resources only"
        )
    return res


def _connect(ray, address: str | None, workers: int | None) -> str | None:
    """Initialise Ray for `address` unless this process already has (then that instance is used and left
    running). Returns what the caller must shut down and remove: the private temp dir of a local instance this
    call started ("" for a cluster joined), None when it started nothing."""
    if ray.is_initialized():
        return None
    address = address or "local"
    if address == "local":
        _token_auth_for_a_local_cluster()
    # address="local" always starts a new cluster: without it ray.init joins whatever cluster RAY_ADDRESS or
    # /tmp/ray names (another user's on the same machine); joining one is what --address auto|HOST:PORT is for
    if address != "local":
        ray.init(include_dashboard=False, address=address)
        return ""
    # Ray's default temp dir (/tmp/ray) is shared by every user of the machine and world-writable; a local
    # instance keeps its sockets, logs and spilled objects in a fresh directory only this user can enter.
    temp = private_temp_dir()
    # Its processes outlive a driver killed by SIGKILL: the reaper, started first, ends them when this one ends.
    _REAPERS[temp] = (reaper.start(temp), _loopback_only())
    try:
        ray.init(include_dashboard=False, address="local", num_cpus=workers, _temp_dir=temp, **LOOPBACK)
    except BaseException:
        ray.shutdown()  # whatever part of the instance started
        release(temp)
        raise
    return temp


_REAPERS: dict = {}
"""A local instance's private temp dir -> (its reaper process (runners.reaper), what `_loopback_only` changed)."""


def _loopback_only() -> tuple:
    """Make the instance about to start a single-node one on the loopback address (SINGLE_NODE), in this process's
    Ray (already imported: its constant is read at import) and in the processes it starts (the environment);
    returns what to restore (`release`), so a later `--address` run of this process joins clusters as before."""
    saved_env = os.environ.get(SINGLE_NODE)
    os.environ[SINGLE_NODE] = "0"
    try:
        from ray._private import ray_constants
    except ImportError:  # no Ray here (a test's stand-in): the environment alone
        return saved_env, None
    saved = ray_constants.ENABLE_RAY_CLUSTER
    ray_constants.ENABLE_RAY_CLUSTER = False
    return saved_env, saved


def _restore(saved: tuple) -> None:
    saved_env, saved_const = saved
    if saved_env is None:
        os.environ.pop(SINGLE_NODE, None)
    else:
        os.environ[SINGLE_NODE] = saved_env
    if saved_const is not None:
        from ray._private import ray_constants

        ray_constants.ENABLE_RAY_CLUSTER = saved_const


def release(temp: str, wait_s: float = 60.0) -> None:
    """After `ray.shutdown()` of the local instance in `temp`: its reaper kills whatever process of it is left and
    removes the dir; wait for that (a driver killed instead sets the reaper off by its death)."""
    import shutil
    import subprocess

    proc, saved = _REAPERS.pop(temp, (None, None))
    if saved is not None:
        _restore(saved)
    if proc is not None:
        proc.stdin.close()
        try:
            proc.wait(wait_s)
        except subprocess.TimeoutExpired:
            pass
    shutil.rmtree(temp, ignore_errors=True)


def private_temp_dir() -> str:
    """A new directory of mode 0700 under this process's temp root (TMPDIR, else /tmp), short enough for the unix
    socket paths Ray makes under it."""
    import tempfile

    return tempfile.mkdtemp(prefix="timbench-ray-")


@dataclass
class _Cell:
    """One cell on the driver, across its submissions in this invocation."""

    cell: dict
    submitted: float = field(default_factory=time.monotonic)
    tries: int = 0
    running_since: float | None = None
    """When the driver heard this submission start on a worker (monotonic); None while queued or after it ended."""
    node: str | None = None

    @property
    def id(self) -> str:
        return self.cell["id"]


class _RayRun:
    """One invocation of the Ray backend: the tasks in flight, what was shipped, the results so far.

    Each submitted cell is one generator task (`gens` maps it to its `_Cell`); `run` waits for the next
    message of any of them and hands it to `receive`, which writes it into runs/<id>/ and on the last one
    records the cell. Between messages, cells past their timeout are cancelled (`cancel_overdue`).
    """

    def __init__(
        self,
        ray,
        out: str,
        progress: Progress | None,
        resources: dict | None,
        max_attempts: int,
        timeouts: dict[str, float] | None,
    ):
        self.ray, self.out, self.progress = ray, out, progress
        self.resources, self.max_attempts, self.timeouts = dict(resources or {}), max_attempts, timeouts or {}
        self.task = ray.remote(cell_task)
        self.shipped: dict[str, object] = {}  # one object-store copy per distinct (model, remedy)
        self.gens: dict = {}
        self.results: dict[str, dict] = {}

    def run(self, cells: list[dict]) -> list[dict]:
        """Submit every cell, then follow them until each is recorded; their final statuses, in order."""
        for cell in cells:
            self.submit(_Cell(cell))
        while self.gens:
            if self.progress:
                self.progress.emit()
            ready, _ = self.ray.wait(list(self.gens), num_returns=1, timeout=self._wait_s())
            for gen in ready:
                self.receive(gen)
            self.cancel_overdue()
        return [self.results[c["id"]] for c in cells]

    def log(self, msg: str) -> None:
        print(msg, file=(self.progress.stream if self.progress else None) or sys.stderr, flush=True)

    def finish(self, c: _Cell, st: dict) -> None:
        """`c` ended with cell.json `st`: keep it and count it on the progress line."""
        self.results[c.id] = st
        if self.progress:
            self.progress.running += 0 if c.running_since is not None else 1  # finished() counts it out of running
            self.progress.finished(st)
        c.running_since = None

    def record(self, c: _Cell, status: str, error: str | None, wall_s: float) -> None:
        """Write `c`'s outcome to cell.json (attempts as counted when it started, at least 1) and finish it."""
        prev = read_status(self.out, c.id) or {}
        attempts = max(int(prev.get("attempts", 0)), 1)
        self.finish(
            c,
            record_done(self.out, c.cell, wall_s, attempts)
            if status == "done"
            else write_status(self.out, c.id, status, error, wall_s, attempts),
        )

    def submit(self, c: _Cell) -> None:
        """Submit `c` (again) with the run files the driver holds, unless its run already finished."""
        finished = record_if_finished(self.out, c.cell)
        if finished is not None:
            self.finish(c, finished)
            return
        cfg = c.cell["config"]
        key = json.dumps([cfg.get("model", "default"), cfg.get("remedy", "none")])
        try:
            if key not in self.shipped:
                self.shipped[key] = self.ray.put(bundle(cfg))
        except (OSError, ValueError) as e:  # a file the cell names is missing on the driver
            prev = read_status(self.out, c.id) or {}
            self.finish(c, write_status(self.out, c.id, "failed", one_line(e), 0.0, prev.get("attempts", 0) + 1))
            return
        c.tries, c.running_since, c.submitted = c.tries + 1, None, time.monotonic()
        resume = read_run(run_dir(self.out, c.id))
        gen = self.task.options(
            num_cpus=cfg.get("threads", 1), resources=dict(self.resources), max_retries=0, name=f"cell {c.id}"
        ).remote(c.cell, self.shipped[key], resume)
        self.gens[gen] = c

    def receive(self, gen) -> None:
        """Take the next message of `gen`'s task; a task that ended or died leaves `gens` here."""
        c = self.gens[gen]
        try:
            msg = self.ray.get(next(gen))
        except StopIteration:
            del self.gens[gen]
            self.lost(c, RuntimeError("the cell task ended without a result"))
            return
        except self.ray.exceptions.RayTaskError as e:  # our task code itself raised: retrying would repeat it
            del self.gens[gen]
            self.record(c, "failed", f"ray task raised {one_line(e.cause or e)}", time.monotonic() - c.submitted)
            return
        except Exception as e:  # noqa: BLE001 - a dead worker or node: resume elsewhere or record it
            del self.gens[gen]
            self.lost(c, e)
            return
        if msg["kind"] == "started":
            self.started(c, msg["node"])
        elif msg["kind"] == "checkpoint":
            write_run(run_dir(self.out, c.id), msg["files"])
        else:
            del self.gens[gen]
            write_run(run_dir(self.out, c.id), msg["files"])
            self.record(c, msg["status"], msg["error"], msg["wall_s"])

    def started(self, c: _Cell, node: str) -> None:
        """`c`'s task runs on a worker of `node`: a new attempt (cell.json `running`); its timeout counts from now."""
        c.running_since, c.node = time.monotonic(), node
        prev = read_status(self.out, c.id) or {}
        write_status(self.out, c.id, "running", None, 0.0, int(prev.get("attempts", 0)) + 1)
        # A new attempt: an earlier attempt's end markers no longer describe the run (rundir.begin).
        clear_end_markers(run_dir(self.out, c.id))
        if self.progress:
            self.progress.running += 1

    def lost(self, c: _Cell, err: BaseException) -> None:
        """`c`'s worker or node died: resubmit it from the last checkpoint the driver holds, or record it failed."""
        if self.progress and c.running_since is not None:
            self.progress.running -= 1
        c.running_since = None
        ckpt = run_dir(self.out, c.id) / CKPT
        try:
            step = checkpoint_step(ckpt.read_bytes(), str(ckpt)) if ckpt.is_file() else 0
        except ValueError:  # a damaged or crafted checkpoint: the resubmitted worker refuses it in one line
            step = "an unreadable checkpoint"
        where = f"node {c.node[:12]}" if c.node else "a worker"
        if c.tries < self.max_attempts:
            self.log(
                f"cell {c.id}: lost on {where} ({one_line(err)}); resuming from step {step} "
                f"(submission {c.tries + 1} of {self.max_attempts})"
            )
            self.submit(c)
            return
        self.record(
            c,
            "failed",
            f"ray: worker or node lost {c.tries} times (last on {where}: {one_line(err)})",
            time.monotonic() - c.submitted,
        )

    def _deadline(self, c: _Cell) -> float | None:
        limit = self.timeouts.get(c.id)
        return None if limit is None or c.running_since is None else c.running_since + limit

    def _wait_s(self) -> float | None:
        """How long to wait for a message: until the next progress line or the nearest deadline (None: no limit)."""
        now = time.monotonic()
        waits = [d - now for d in map(self._deadline, self.gens.values()) if d is not None]
        if self.progress:
            waits.append(PROGRESS_EVERY_S)
        return max(0.0, min(waits)) if waits else None

    def cancel_overdue(self) -> None:
        """Kill each task past its cell's timeout and record the cell failed as the local backend does (not a lost
        worker: it is not resubmitted); the others go on. A task with a message waiting is read first, so a run
        that ended before its deadline is never recorded as timed out."""
        now = time.monotonic()
        overdue = [gen for gen, c in self.gens.items() if (d := self._deadline(c)) is not None and now >= d]
        if not overdue:
            return
        waiting, _ = self.ray.wait(overdue, num_returns=len(overdue), timeout=0)
        for gen in overdue:
            if gen in waiting:
                continue
            c = self.gens.pop(gen)
            self.ray.cancel(gen, force=True)  # force: ends the worker process, whatever the run's thread is doing
            self.finish(c, record_timeout(self.out, c.id, self.timeouts[c.id], now - c.running_since))


def run_ray(
    cells: list[dict],
    out: str,
    workers: int | None = None,
    address: str | None = "local",
    progress: Progress | None = None,
    resources: dict | None = None,
    max_attempts: int = MAX_ATTEMPTS,
    timeouts: dict[str, float] | None = None,
) -> list[dict]:
    """Run `cells` as Ray tasks, each needing `resources` (custom, per cell) besides its threads' CPUs.

    `timeouts` maps a cell id to its wall-clock limit in seconds (runners.local.cell_timeouts; absent: none),
    counted from when the driver hears the cell's task start on a worker, so time queued for a free CPU does
    not count (each submission after a lost worker counts afresh). A cell past it is cancelled, its worker
    process killed, and recorded failed with the local backend's one-line reason; the grid goes on."""
    ray = _import_ray()
    out = os.path.abspath(out)
    if max_attempts < 1:
        raise ValueError(f"max_attempts must be >= 1, got {max_attempts}")
    started = _connect(ray, address, workers)
    try:
        results = _RayRun(ray, out, progress, resources, max_attempts, timeouts).run(cells)
    finally:
        if started is not None:
            ray.shutdown()
        if started:
            release(started)
    if progress:
        progress.emit(force=True)
    return results
