"""What travels between the grid driver and a worker without a shared filesystem, as plain bytes.

Driver -> worker: a cell's *bundle* (`bundle`): the files its config points at
that an installed timbench does not have (a `model` checkpoint directory other
than `default`, a plug-in remedy `path/to/file.py:Class`), read on the driver
(relative paths mean the driver's working directory). The worker writes them
into its scratch directory and points the config there (`materialize`).
Driver -> worker also: the cell's run files from the results directory
(`read_run`), so a resumed cell continues from the last checkpoint the driver holds.

Worker -> driver: snapshots of the run directory (`snapshot`) at each
checkpoint and at the end; the driver writes them into runs/<id>/ (`write_run`),
logs first and the checkpoint after them, so a driver killed between two writes
never holds a checkpoint newer than its logs (a resume drops log rows past the
checkpoint, never needs rows it lacks).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from timbench.util.atomic import atomic_write

CKPT = "checkpoints/state.pt"
LOGS = ("metrics.jsonl", "timing.jsonl", "eval.jsonl")
# Written in this order by write_run: the checkpoint after the logs it covers, the end markers last.
_ORDER = ("config.yaml", "error.txt", *LOGS, "status.json", CKPT, "summary.json", "manifest.json")


def remedy_file(remedy: str) -> tuple[str, str] | None:
    """(file, class) when `remedy` names a plug-in file (`path/to/file.py:Class`), else None."""
    target, sep, cls = remedy.rpartition(":")
    if sep and (target.endswith(".py") or "/" in target or "\\" in target):
        return target, cls
    return None


def bundle(config: dict) -> dict:
    """{"model": {relpath: bytes} | None, "remedy": (filename, bytes, class) | None} for `config`."""
    out = {"model": None, "remedy": None}
    model = config.get("model", "default")
    if model != "default":
        root = Path(model)
        if not root.is_dir():
            raise ValueError(
                f"model {model!r}: checkpoint directory not found on the driver "
                f"(cwd {os.getcwd()}); give a directory or `default`"
            )
        out["model"] = {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}
    plug = remedy_file(str(config.get("remedy", "none")))
    if plug is not None:
        path = Path(plug[0])
        if not path.is_file():
            raise ValueError(f"remedy file {path} does not exist on the driver (cwd {os.getcwd()})")
        out["remedy"] = (path.name, path.read_bytes(), plug[1])
    return out


def materialize(config: dict, shipped: dict, scratch: Path) -> dict:
    """Write `shipped` (a `bundle`) under `scratch`; return `config` pointing at those copies."""
    config = dict(config)
    if shipped["model"] is not None:
        root = scratch / "model"
        for rel, data in shipped["model"].items():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_bytes(data)
        config["model"] = str(root)
    if shipped["remedy"] is not None:
        name, data, cls = shipped["remedy"]
        (scratch / "remedy").mkdir(parents=True, exist_ok=True)
        (scratch / "remedy" / name).write_bytes(data)
        config["remedy"] = f"{scratch / 'remedy' / name}:{cls}"
    return config


def read_run(run: Path) -> dict[str, bytes]:
    """The files a resume needs from a run directory: checkpoint, logs and config.yaml (those present)."""
    names = (CKPT, *LOGS, "config.yaml")
    return {n: (run / n).read_bytes() for n in names if (run / n).is_file()}


def _kept(text: str, limit: int) -> str:
    """Rows of a JSONL log with step < limit, up to a torn line (what rundir.JsonlLog keeps on resume)."""
    kept = []
    for line in text.splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            break
        if row.get("step", -1) < limit:
            kept.append(line + "\n")
    return "".join(kept)


def checkpoint_step(data: bytes, where: str = CKPT) -> int:
    """The step a checkpoint was saved at, read without running code (rundir.read_checkpoint: a one-line
    ValueError for a crafted or damaged file, which a driver must never unpickle as it comes)."""
    from timbench.rl.rundir import read_checkpoint

    state = read_checkpoint(data, where)
    if not isinstance(state, dict) or not isinstance(state.get("step"), int):
        raise ValueError(f"{where}: not a timbench run checkpoint (no integer step)")
    return state["step"]


def snapshot(run: Path, config_yaml: str, final: bool) -> dict[str, bytes]:
    """The run directory as the driver should hold it now.

    Mid-run (`final` False): the checkpoint and exactly the log rows it covers (those a resume from it
    keeps), so the snapshot is consistent however far the run has gone since. At the end: every file.
    `config_yaml` replaces the worker's config.yaml, which names the scratch paths.
    """
    files: dict[str, bytes] = {}
    if final:
        files = {
            p.relative_to(run).as_posix(): p.read_bytes()
            for p in sorted(run.rglob("*"))
            if p.is_file() and not p.name.startswith(".")
        }
    else:
        ckpt = (run / CKPT).read_bytes()  # an atomic replace: a whole checkpoint, read before the logs
        step = checkpoint_step(ckpt)
        for name in LOGS:
            limit = (step + 1 if step > 0 else 0) if name == "eval.jsonl" else step
            text = (run / name).read_text() if (run / name).is_file() else ""
            files[name] = _kept(text, limit).encode()
        if (run / "status.json").is_file():
            files["status.json"] = (run / "status.json").read_bytes()
        files[CKPT] = ckpt
    files["config.yaml"] = config_yaml.encode()
    return files


def write_run(run: Path, files: dict[str, bytes]) -> None:
    """Write a snapshot into the results run directory, each file atomically, in a kill-safe order."""
    for name in sorted(files, key=lambda n: (_ORDER.index(n) if n in _ORDER else -1, n)):
        if Path(name).is_absolute() or ".." in Path(name).parts:
            raise ValueError(f"snapshot file name {name!r} leaves the run directory")
        atomic_write(run / name, files[name])
