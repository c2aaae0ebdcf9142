"""Tracks: versioned standard cell sets every remedy is scored on, and the fingerprint that ties results to them.

A track file (bench/tracks/<name>.yaml) is a grid spec without a remedy axis, plus the remedies whose
results are committed under results/tracks/<name>/:

    track: quick
    version: 1
    remedies: [none, tis_token, ...]      # committed; `none` first (it owns the reference cells)
    grid: {name: track-quick-v1, base: {...}, axes: {condition: [...], mode: [...], seed: [...]}, ...}

The grid of a remedy list R is the track grid with axes.remedy = R, the reference condition run by `none`
only. Committed results carry a manifest (track.json) with the track version, the grid fingerprint
(timbench.grid.merge: grid name, reference, collapse rule, shared run config, conditions), every task's
version, the timbench version and a hash of the code that produced them. `check_committed` compares all of
these with what the current code and files would produce; a different code hash is not by itself a
refusal: one step of a committed exact-kernel cell is replayed and must log every committed metric with the
same value (training is bitwise deterministic on any x86-64 CPU; a metric added since is not a change:
timbench.grid.replay), so only code that changes results is refused. Every refusal is one line naming what differs.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path

from .. import __version__
from ..eta import Eta
from ..grid.merge import fingerprint, fingerprint_difference
from ..grid.replay import replay, replay_cell, summarize
from ..grid.spec import GridSpec, expand, parse_grid
from ..tasks import get_task
from ..util.atomic import atomic_write
from ..util.readfile import read_json, read_yaml

TRACKS_DIR = Path("bench/tracks")
"""Where `--track NAME` is looked up (relative to the working directory), unless NAME is a path."""
RESULTS_DIR = Path("results/tracks")
MANIFEST = "track.json"


@dataclass
class Track:
    name: str
    version: int
    remedies: list[str]
    grid: dict
    path: Path

    def spec(self, remedies: list[str]) -> GridSpec:
        """The track's grid for `remedies` (none first; only none runs the reference condition)."""
        doc = json.loads(json.dumps(self.grid))  # a deep copy
        doc.setdefault("axes", {})["remedy"] = list(remedies)
        others = [r for r in remedies if r != "none"]
        if others:
            doc["exclude"] = list(doc.get("exclude") or []) + [
                {"condition": doc.get("reference", "baseline"), "remedy": others}
            ]
        return parse_grid(doc, f"track {self.name}", self.path.resolve().parent)

    def committed_dir(self) -> Path:
        return RESULTS_DIR / self.name


def load_track(name_or_path: str) -> Track:
    """A track by name (bench/tracks/NAME.yaml) or by path; every problem is a one-line error."""
    p = Path(name_or_path)
    if not p.suffix:
        p = TRACKS_DIR / f"{name_or_path}.yaml"
    if not p.is_file():
        known = sorted(x.stem for x in TRACKS_DIR.glob("*.yaml")) if TRACKS_DIR.is_dir() else []
        raise FileNotFoundError(f"track {name_or_path!r} not found ({p}); tracks: {', '.join(known) or 'none'}")
    doc = read_yaml(p, "track file")
    keys = ("track", "version", "remedies", "grid")
    if not isinstance(doc, dict) or sorted(doc) != sorted(keys):
        raise ValueError(f"{p}: a track file has exactly the keys {', '.join(keys)}")
    remedies = doc["remedies"]
    if not isinstance(remedies, list) or not remedies or remedies[0] != "none":
        raise ValueError(f"{p}: remedies must be a list starting with none (it runs the reference cells)")
    if "remedy" in (doc["grid"].get("axes") or {}):
        raise ValueError(f"{p}: the track grid has no remedy axis (remedies are listed under `remedies`)")
    if not isinstance(doc["version"], int) or isinstance(doc["version"], bool):
        raise ValueError(f"{p}: version must be an integer")
    return Track(str(doc["track"]), doc["version"], [str(r) for r in remedies], dict(doc["grid"]), p)


# ---------------------------------------------------------------- code version


def _package_dirs() -> list[Path]:
    # Located, not imported: the library never imports the runners (it only hashes their files here).
    return sorted(
        {
            Path(loc).resolve()
            for name in ("timbench", "timbench.tasks", "timbench.runners")
            for loc in importlib.util.find_spec(name).submodule_search_locations
        }
    )


def code_hash() -> str:
    """sha256 (16 hex) of every .py file of timbench, timbench.tasks and timbench.runners, by relative path."""
    h = hashlib.sha256()
    for root in _package_dirs():
        for f in sorted(root.rglob("*.py")):
            if "__pycache__" in f.parts:
                continue
            h.update(f"{root.name}/{f.relative_to(root)}\n".encode())
            h.update(f.read_bytes())
    return h.hexdigest()[:16]


def _task_versions(cells: list[dict]) -> dict[str, int]:
    return {t: get_task(t).version for t in sorted({c["axes"]["task"] for c in cells})}


def manifest(track: Track, cells_doc: dict) -> dict:
    cell = replay_cell(cells_doc["cells"])
    return {
        "track": track.name,
        "version": track.version,
        "fingerprint": fingerprint(cells_doc),
        "tasks": _task_versions(cells_doc["cells"]),
        "timbench_version": __version__,
        "code": code_hash(),
        "replay_cell": cell["id"] if cell else None,
    }


def write_manifest(track: Track, out: Path, cells_doc: dict) -> dict:
    m = manifest(track, cells_doc)
    atomic_write(Path(out) / MANIFEST, json.dumps(m, indent=1, sort_keys=True) + "\n")
    return m


def replay_matches(committed: Path, cell: dict) -> str | None:
    """None when the first step of `cell`, run now, logs every committed metric of its first line with the same
    value (timbench.grid.replay: a metric added since is not a change); else one line naming the keys."""
    diffs = replay(committed, cell, steps=1)
    return summarize(cell["id"], diffs) if diffs else None


def check_committed(track: Track, committed: Path, say=None) -> list[str]:
    """Refuse (one-line ValueError) committed results that another track version, config or code produced.

    Returns notes for the user (e.g. that the code hash differs but the replayed step matched). `say` (a
    callable taking one line) hears what the preflight does while it runs: the replay takes a minute or two.
    """
    path = committed / MANIFEST
    if not path.is_file():
        raise FileNotFoundError(
            f"no committed results for track {track.name} at {committed} (no {MANIFEST}); "
            f"make them with `timbench track run {track.name} --out {committed}`"
        )
    m = read_json(path, "track manifest")
    cells_doc = read_json(committed / "cells.json", "grid cells file")
    expected = manifest_now(track)
    where = f"committed results {committed} were made"
    if m.get("version") != track.version:
        raise ValueError(
            f"{where} for track {track.name} version {m.get('version')}, the track file is version {track.version}"
        )
    diff = fingerprint_difference(m.get("fingerprint") or {}, expected["fingerprint"])
    if diff:
        raise ValueError(f"{where} with a different track config: {diff}")
    if fingerprint(cells_doc) != m["fingerprint"]:
        raise ValueError(f"{committed}/cells.json does not match its {MANIFEST} (edited by hand?)")
    for task, v in expected["tasks"].items():
        if m.get("tasks", {}).get(task) != v:
            raise ValueError(f"{where} with task {task} version {m.get('tasks', {}).get(task)}, now version {v}")
    if m.get("timbench_version") != expected["timbench_version"]:
        raise ValueError(f"{where} by timbench {m.get('timbench_version')}, this is {expected['timbench_version']}")
    if m.get("code") == expected["code"]:
        return []
    cell = next((c for c in cells_doc["cells"] if c["id"] == m.get("replay_cell")), None)
    if cell is None:
        problem = "no replay cell recorded"
    else:
        say = say or (lambda line: None)
        eta = Eta(1)
        say(
            f"preflight: the code differs from the committed run's; replaying step 0 of {cell['id']} "
            f"(step 0/1, ETA ~1-2 min) to check that {committed} still reproduces"
        )
        problem = replay_matches(committed, cell)
        say(f"preflight: step {eta.tick()}: {'every committed value matched' if problem is None else 'differed'}")
    if problem:
        raise ValueError(
            f"{where} by other code (code hash {m.get('code')}, this is {expected['code']}) that "
            f"changes results: {problem}"
        )
    return [
        f"code hash {m.get('code')} of the committed results differs from this code's {expected['code']}, "
        f"but one replayed step of {cell['id']} logged every committed value unchanged"
    ]


def manifest_now(track: Track) -> dict:
    """The manifest the current code and track file would write for the committed remedies' `none` cells."""
    grid = track.spec(["none"])
    doc = {
        "grid": grid.name,
        "reference_condition": grid.reference,
        "collapse": dict(grid.collapse),
        "cells": [c.to_dict() for c in expand(grid)],
    }
    return manifest(track, doc)


__all__ = [
    "MANIFEST",
    "RESULTS_DIR",
    "TRACKS_DIR",
    "Track",
    "check_committed",
    "code_hash",
    "load_track",
    "manifest",
    "replay_matches",
    "write_manifest",
]
