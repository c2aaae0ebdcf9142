"""A run directory: resolved config, append-only JSONL logs, atomic status, summary and checkpoints.

Logs are appended line by line; after a crash, `JsonlLog` drops a torn last
line and every line at or past the step being resumed, so a resumed run writes
each step exactly once. `status.json` is the run's state for the user and the
grid: `{"status": running|finished|failed, "error": one line or null}`. It is
written `running` when the run starts, and `finished` or `failed` as it ends; a
run killed too hard to write it stays `running` with no summary.json. Rerunning
the same command is always safe: it resumes from the last checkpoint (or starts
over when there is none) and rewrites the status.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import pickle
import re
from pathlib import Path

import torch
import yaml

from ..metrics.log_summary import from_logs
from ..remedies.identity import comparable_config
from ..util import manifest
from ..util.atomic import atomic_write, write_error
from ..util.manifest import MANIFEST, stamp_run
from .config import load

STATUSES = ("running", "finished", "failed")


def one_line(exc: BaseException) -> str:
    """`Type: message` on one line, at most 500 characters."""
    msg = " ".join(str(exc).split()) or repr(exc)
    line = f"{type(exc).__name__}: {msg}"
    return line if len(line) <= 500 else line[:497] + "..."


def dumps(d: dict) -> str:
    return json.dumps(d, sort_keys=True, allow_nan=True)


class JsonlLog:
    def __init__(self, path: Path, resume_step: int):
        self.path = path
        kept = []
        if path.is_file():
            for line in path.read_text().splitlines():
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:
                    break  # a torn last line from a kill
                if row.get("step", -1) < resume_step:
                    kept.append(line)
        atomic_write(path, "".join(line + "\n" for line in kept))
        self.f = open(path, "a")  # noqa: SIM115 - held open for the run's appends; close() closes it

    def write(self, row: dict) -> None:
        try:
            self.f.write(dumps(row) + "\n")
            self.f.flush()
        except OSError as e:  # disk full mid-run: one line naming the log (a rerun resumes from the checkpoint)
            raise write_error(e, "appending to", self.path) from e

    def close(self) -> None:
        self.f.close()


def _comparable_text(config) -> str:
    return yaml.safe_dump(comparable_config(config), sort_keys=True)


def clear_end_markers(path: str | os.PathLike) -> None:
    """Remove what says a run ended (its manifest, then its summary.json): a new attempt starts here (RunDir.begin,
    and the Ray backend's driver when a worker starts the cell)."""
    (Path(path) / MANIFEST).unlink(missing_ok=True)
    (Path(path) / "summary.json").unlink(missing_ok=True)


def read_checkpoint(data: bytes, where) -> object:
    """A run checkpoint's object, unpickled with torch's weights-only loader: tensors, dicts, lists, tuples,
    numbers, strings and None only, so a crafted file cannot run code when a run resumes (a driver reads the
    checkpoints Ray workers send back the same way). Anything else is a one-line ValueError naming `where`."""
    try:
        return torch.load(io.BytesIO(data), weights_only=True)
    except pickle.UnpicklingError as e:
        if "Weights only load failed" in str(e):  # a global outside the allow-list: what a code-running pickle needs
            name = re.search(r"GLOBAL (\S+)", str(e))
            raise ValueError(
                f"{where}: refused: the checkpoint names {name.group(1) if name else 'an object'}, "
                "not a tensor or plain value (a pickle that would run code when loaded); it was not "
                "loaded; delete it to rerun the run from step 0"
            ) from None
        raise ValueError(
            f"{where}: unreadable checkpoint ({one_line(e)[:200]}); delete it to rerun the run from step 0"
        ) from None
    except Exception as e:  # noqa: BLE001 - truncated or foreign bytes: torch raises EOF/unpickling/zip errors
        raise ValueError(
            f"{where}: unreadable checkpoint ({one_line(e)[:200]}); delete it to rerun the run from step 0"
        ) from None


CKPT_DIGEST = "sha256"
"""The checkpoint key holding `state_digest` of the rest: checked before a resume trusts the state."""


def state_digest(obj) -> str:
    """sha256 over a checkpoint's content: every tensor's dtype, shape and bytes, every plain value's repr, in the
    dicts' own order (pickling keeps it), so a bit flipped in the file after it was saved shows on load."""
    h = hashlib.sha256()
    _feed(h, obj)
    return h.hexdigest()


def _feed(h, obj) -> None:
    if isinstance(obj, torch.Tensor):
        t = obj.detach().cpu().contiguous().reshape(-1)
        h.update(f"T{t.dtype}{tuple(obj.shape)};".encode())
        h.update(t.view(torch.uint8).numpy().tobytes())
    elif isinstance(obj, dict):
        h.update(f"D{len(obj)};".encode())
        for k, v in obj.items():
            _feed(h, k)
            _feed(h, v)
    elif isinstance(obj, (list, tuple)):
        h.update(f"{type(obj).__name__[0]}{len(obj)};".encode())
        for v in obj:
            _feed(h, v)
    else:
        h.update(f"{type(obj).__name__}:{obj!r};".encode())


class RunDir:
    def __init__(self, out: str | os.PathLike, config: dict):
        self.path = Path(out)
        self.path.mkdir(parents=True, exist_ok=True)
        self.ckpt = self.path / "checkpoints" / "state.pt"
        cfg_path = self.path / "config.yaml"
        text = yaml.safe_dump(config, sort_keys=True)
        # A plug-in file's directory is not compared: the same file moved elsewhere resumes (remedies.identity).
        if (
            cfg_path.is_file()
            and self.ckpt.is_file()
            and _comparable_text(yaml.safe_load(cfg_path.read_text())) != _comparable_text(config)
        ):
            raise ValueError(f"{self.path} holds a run with a different config.yaml; use another --out or delete it")
        atomic_write(cfg_path, text)

    def load_state(self) -> dict | None:
        if not self.ckpt.is_file():
            return None
        state = read_checkpoint(self.ckpt.read_bytes(), self.ckpt)
        if not isinstance(state, dict) or "step" not in state or "lanes" not in state:
            raise ValueError(
                f"{self.ckpt}: not a timbench run checkpoint (no step/lanes); delete it to rerun the run from step 0"
            )
        digest = state.pop(CKPT_DIGEST, None)  # absent in checkpoints saved before digests: resumed as before
        if digest is not None and digest != state_digest(state):
            raise ValueError(
                f"{self.ckpt}: refused: its content no longer matches the sha256 it was saved with "
                "(a flipped bit or an edit); not resumed; delete it to rerun the run from step 0"
            )
        return state

    def check_sealed(self) -> None:
        """Refuse (one line) a run that ended and was sealed but whose files no longer match its manifest: a resume
        would re-summarise the edited or truncated logs and seal them as if the run had written them."""
        if manifest.missing(self.path):
            return
        bad = manifest.problems(self.path)
        if bad:
            raise ValueError(
                f"{self.path}: an ended run whose files no longer match {MANIFEST} ({bad[0]}); "
                "not resumed or re-sealed: restore the files, or delete the run directory to rerun it"
            )

    def sealed_summary(self, state: dict | None, steps: int) -> dict | None:
        """summary.json of a run that finished all `steps` and is sealed intact (check_sealed first); None when the
        run has to start or resume. A rerun of a finished run then touches nothing."""
        if state is None or state["step"] != steps or manifest.missing(self.path):
            return None
        try:
            summary = json.loads((self.path / "summary.json").read_text())
        except (OSError, ValueError):
            return None
        return summary if isinstance(summary, dict) and summary.get("status") == "finished" else None

    def save_state(self, state: dict) -> None:
        buf = io.BytesIO()
        torch.save({**state, CKPT_DIGEST: state_digest(state)}, buf)
        atomic_write(self.ckpt, buf.getvalue())

    def logs(self, resume_step: int) -> dict[str, JsonlLog]:
        """Logs truncated for a resume at `resume_step` (steps done so far).

        metrics/timing rows are keyed by step index (< resume_step survive); eval rows
        by steps done, and the eval at resume_step was written before its checkpoint.
        """
        eval_keep = resume_step + 1 if resume_step > 0 else 0
        return {
            "metrics": JsonlLog(self.path / "metrics.jsonl", resume_step),
            "timing": JsonlLog(self.path / "timing.jsonl", resume_step),
            "eval": JsonlLog(self.path / "eval.jsonl", eval_keep),
        }

    def write_summary(self, summary: dict) -> None:
        atomic_write(self.path / "summary.json", json.dumps(summary, indent=2, sort_keys=True) + "\n")

    def begin(self) -> None:
        """Mark the run running; the end markers of an earlier attempt no longer describe it."""
        clear_end_markers(self.path)
        self.write_status("running")

    def seal(self) -> None:
        """The run ended (finished, or failed on a non-finite value): hash its files into manifest.json, last."""
        stamp_run(self.path)

    def write_status(self, status: str, error: str | None = None) -> None:
        write_status(self.path, status, error)


def status_text(status: str, error: str | None = None) -> str:
    """The text of a run directory's status.json: {"status", "error"}."""
    if status not in STATUSES:
        raise ValueError(f"run status {status!r}; valid: {', '.join(STATUSES)}")
    return json.dumps({"status": status, "error": error}, sort_keys=True) + "\n"


def write_status(path: str | os.PathLike, status: str, error: str | None = None) -> None:
    """A run directory's status.json := {"status", "error"}."""
    atomic_write(Path(path) / "status.json", status_text(status, error))


def read_status(path: str | os.PathLike) -> dict | None:
    """A run directory's status.json ({"status", "error"}), or None where there is none."""
    p = Path(path) / "status.json"
    return json.loads(p.read_text()) if p.is_file() else None


def summarize(path, cfg, status: str, error, extra: dict) -> dict:
    """summary.json of a run that ended: what it ran (`cfg`, a RunConfig or Loaded) and aggregates of its logs."""
    loaded = load(cfg)
    rows = [json.loads(l) for l in (path / "metrics.jsonl").read_text().splitlines()]
    evals = [json.loads(l) for l in (path / "eval.jsonl").read_text().splitlines()]
    s = {
        "status": status,
        "error": error,
        "task": loaded.task,
        "task_version": loaded.task_impl.version,
        "algorithm": loaded.algorithm,
        "mode": loaded.mode,
        "engine": loaded.config.engine.to_dict(),
        "trainer": loaded.config.trainer.to_dict(),
        "seed": loaded.seed,
        **extra,
    }
    s.update(from_logs(rows, evals))  # the part `grid verify` recomputes (timbench.metrics.log_summary)
    return s
