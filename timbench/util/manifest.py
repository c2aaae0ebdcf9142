"""Integrity manifests: the sha256 of every file a finished run (or a report) wrote, written atomically last.

A finished result is trusted only as far as its bytes are the ones the run wrote. `stamp` records them in
`manifest.json` after everything else; `problems` re-hashes and names each file that is missing or differs
(a dropped metrics row, an edited accuracy). The grid runner redoes such a cell, the report and compare
refuse it, and `timbench grid verify` lists every problem at once. A result made before manifests has none:
`timbench grid verify DIR --adopt` stamps it once, after which it is held to the same check.

A grid run's manifest also binds its cell (`bind`: the cell id and a fingerprint of its config), so a run directory
copied under another cell's id is not that cell's result; manifests made before bindings have none and are
checked as before. `update` adds files to a directory's manifest without dropping the others (the grid's
cells.json beside its report).
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


def update(directory: str | Path, names: tuple[str, ...] | list[str]) -> Path:
    """Add (or refresh) `names` in `directory`/manifest.json, keeping its other entries; creates one if none."""
    d = Path(directory)
    path = d / MANIFEST
    try:
        doc = json.loads(path.read_text()) if path.is_file() else {}
    except (OSError, ValueError):
        doc = {}
    files = doc.get("files") if isinstance(doc, dict) and isinstance(doc.get("files"), dict) else {}
    files.update({n: sha256_file(d / n) for n in names if (d / n).is_file()})
    atomic_write(
        path,
        json.dumps(
            {**(doc if isinstance(doc, dict) else {}), "manifest": VERSION, "files": files}, indent=1, sort_keys=True
        )
        + "\n",
    )
    return path


def bind(directory: str | Path, cell: dict) -> None:
    """Record in `directory`/manifest.json which cell it holds (`cell`: {"id", "config"}, grid.layout.cell_binding).
    Written after the run sealed its files (the worker of a Ray run knows its scratch paths, not the cell's)."""
    path = Path(directory) / MANIFEST
    if not path.is_file():  # nothing sealed to bind: `grid verify` names the missing manifest
        return
    doc = json.loads(path.read_text())
    if isinstance(doc, dict) and doc.get("cell") != cell:
        atomic_write(path, json.dumps({**doc, "cell": cell}, indent=1, sort_keys=True) + "\n")


def binding(directory: str | Path) -> dict | None:
    """The cell a run's manifest is bound to ({"id", "config"}), None when unbound (made before bindings)."""
    path = Path(directory) / MANIFEST
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return doc.get("cell") if isinstance(doc, dict) else None


def read(directory: str | Path) -> dict | None:
    """The manifest's {name: sha256}, None when there is none; a malformed one is a one-line ValueError."""
    path = Path(directory) / MANIFEST
    if not path.is_file():
        return None
    try:
        doc = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(
            f"{path}: not valid JSON ({e.__class__.__name__}); `timbench grid run` redoes the cell"
        ) from None
    if not isinstance(doc, dict) or doc.get("manifest") != VERSION or not isinstance(doc.get("files"), dict):
        raise ValueError(f'{path}: expected {{"manifest": {VERSION}, "files": {{name: sha256}}}}')
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


def refuse_changed(directory: str | Path, names: list[str], what: str) -> None:
    """A one-line ValueError when `directory`'s manifest lists one of `names` and that file no longer matches it (an
    align table or gate run edited after it was written). No manifest, or a name it does not list: made before
    manifests, read as before."""
    d = Path(directory)
    bad = [line for line in problems(d) if any(line.startswith(f"{d / n}: ") for n in names)]
    if bad and not missing(d):
        raise ValueError(f"{bad[0]}; this {what} is not read (rerun the command that wrote it)")


def missing(directory: str | Path) -> bool:
    return not (Path(directory) / MANIFEST).is_file()
