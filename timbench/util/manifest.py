"""Integrity manifests: the sha256 of every file a finished run (or a report) wrote, written atomically last.

A finished result is trusted only as far as its bytes are the ones the run wrote. `stamp` records them in
`manifest.json` after everything else; `problems` re-hashes and names each file that is missing or differs
(a dropped metrics row, an edited accuracy). The grid runner redoes such a cell, the report and compare
refuse it, and `timbench grid verify` lists every problem at once. A result made before manifests has none:
`timbench grid verify DIR --adopt` stamps it once, after which it is held to the same check.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from .atomic import atomic_write

MANIFEST = "manifest.json"
RUN_FILES = ("metrics.jsonl", "eval.jsonl", "timing.jsonl", "summary.json", "status.json")
"""What a finished run's manifest covers. Not config.yaml: the Ray backend replaces the worker's copy (which
names scratch paths) with the driver's, and cells.json already holds every cell's config."""
REQUIRED_RUN_FILES = ("metrics.jsonl", "eval.jsonl", "summary.json")
"""What every finished run's manifest must list: the files its results are read from (a manifest that lists
none of them would vouch for nothing)."""
VERSION = 1


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def stamp(directory: str | Path, names: tuple[str, ...] | list[str]) -> Path:
    """Write `directory`/manifest.json over the files `names` that exist there; returns its path."""
    d = Path(directory)
    files = {n: sha256_file(d / n) for n in names if (d / n).is_file()}
    path = d / MANIFEST
    atomic_write(path, json.dumps({"manifest": VERSION, "files": files}, indent=1, sort_keys=True) + "\n")
    return path


def stamp_run(run_dir: str | Path) -> Path:
    return stamp(run_dir, RUN_FILES)


def read(directory: str | Path) -> dict | None:
    """The manifest's {name: sha256}, None when there is none; a malformed one is a one-line ValueError."""
    path = Path(directory) / MANIFEST
    if not path.is_file():
        return None
    try:
        doc = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: not valid JSON ({e.__class__.__name__}); `timbench grid run` redoes the cell")
    if not isinstance(doc, dict) or doc.get("manifest") != VERSION or not isinstance(doc.get("files"), dict):
        raise ValueError(f"{path}: expected {{\"manifest\": {VERSION}, \"files\": {{name: sha256}}}}")
    return doc["files"]


def problems(directory: str | Path) -> list[str]:
    """One line per file of `directory` that no longer matches its manifest ([] when all match).

    A missing manifest is one problem of its own ("no manifest.json"), so callers can tell a result made
    before manifests (adopt it) from one edited after (redo it)."""
    d = Path(directory)
    try:
        files = read(d)
    except ValueError as e:
        return [str(e)]
    if files is None:
        return [f"{d / MANIFEST}: no manifest.json (made before manifests, or the run never finished)"]
    out = []
    for name, digest in sorted(files.items()):
        p = d / name
        if not p.is_file():
            out.append(f"{p}: missing (listed in {MANIFEST})")
        elif sha256_file(p) != digest:
            out.append(f"{p}: sha256 differs from {MANIFEST} (edited or truncated after it was written)")
    return out


def missing(directory: str | Path) -> bool:
    return not (Path(directory) / MANIFEST).is_file()
