"""The worker side of the Ray backend: one cell in a node-local scratch directory, streamed back.

`cell_task` is a Ray generator task. It materializes what the driver shipped
(runner.ship), restores the driver's last checkpoint and logs, and runs
`timbench.rl.loop.run` in a thread inside a fresh scratch directory under the
worker's own temp dir (tempfile). The generator watches the run's checkpoint
file: each time the loop atomically replaces it, the generator yields a
snapshot of the checkpoint and the log rows it covers; when the run ends it
yields every file and the outcome. Nothing is written outside the scratch
directory, which is removed at the end. An error of the run itself (a bad
config, a non-finite loss) is an outcome, never an exception: only a lost
worker or node makes the driver's `ray.get` raise.

Messages (dicts): {"kind": "started", "node"}, {"kind": "checkpoint", "files"},
{"kind": "end", "files", "status": done|failed, "error", "wall_s"}.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
import traceback
from pathlib import Path

import yaml

from .ship import CKPT, materialize, snapshot

POLL_S = 0.2
"""How often the generator looks for a new checkpoint (a missed one is superseded by the next)."""


def _signature(path: Path):
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return st.st_ino, st.st_mtime_ns, st.st_size


def cell_task(cell: dict, shipped: dict, resume: dict[str, bytes]):
    """Run (or resume from `resume`, the driver's run files) one cell; yield messages (module docstring)."""
    import ray

    from timbench.rl.config import from_dict
    from timbench.rl.rundir import one_line

    yield {"kind": "started", "node": ray.get_runtime_context().get_node_id()}
    scratch = Path(tempfile.mkdtemp(prefix=f"timbench-{cell['id']}-"))
    run = scratch / "run"
    t0 = time.perf_counter()
    outcome: dict = {}
    config_yaml = ""
    try:
        try:
            original = dict(cell["config"])
            loaded = from_dict(materialize(original, shipped, scratch), f"cell {cell['id']}")
            # config.yaml as the local backend writes it: the user's paths, not the scratch copies.
            config_yaml = yaml.safe_dump(
                {
                    **loaded.to_dict(),
                    "model": original.get("model", "default"),
                    "remedy": original.get("remedy", "none"),
                },
                sort_keys=True,
            )
            if CKPT in resume and resume.get("config.yaml", b"").decode() != config_yaml:
                raise ValueError(
                    f"runs/{cell['id']} holds a run with a different config.yaml; use another --out or delete it"
                )
            for name, data in resume.items():
                if name != "config.yaml":
                    (run / name).parent.mkdir(parents=True, exist_ok=True)
                    (run / name).write_bytes(data)
        except Exception as e:  # noqa: BLE001 - the cell's own failure, reported like the local backend's
            outcome = {"status": "failed", "error": one_line(e), "traceback": traceback.format_exc()}
            loaded = None

        def target():
            from timbench.rl.loop import run as train

            try:
                train(loaded, run, progress=False)
                outcome.update(status="done", error=None)
            except Exception as e:  # noqa: BLE001
                outcome.update(status="failed", error=one_line(e), traceback=traceback.format_exc())

        if loaded is not None:
            thread = threading.Thread(target=target, name=f"cell {cell['id']}", daemon=True)
            last = _signature(run / CKPT)
            thread.start()
            while thread.is_alive():
                thread.join(POLL_S)
                sig = _signature(run / CKPT)
                if sig is not None and sig != last and thread.is_alive():
                    last = sig
                    yield {"kind": "checkpoint", "files": snapshot(run, config_yaml, final=False)}
        files = snapshot(run, config_yaml, final=True) if loaded is not None else {}
        if outcome.get("traceback"):
            files["error.txt"] = outcome["traceback"].encode()
        yield {
            "kind": "end",
            "files": files,
            "status": outcome["status"],
            "error": outcome.get("error"),
            "wall_s": time.perf_counter() - t0,
        }
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
