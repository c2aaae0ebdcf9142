"""Merging grid result directories: several machines (or people) contribute cells to one leaderboard.

    timbench grid merge SRC [SRC ...] --out DST

Two result directories merge when they have the same *grid fingerprint*: the grid name, the reference
condition, the collapse rule, the shared run configuration (every cell's RunConfig minus the axis-owned
keys: task, preset, remedy, remedy_args, mode, algorithm, seed, engine, trainer; keys a grid's remedy_variants
set per remedy label are instead held to one value per label across the merged cells) and, for every condition
name used on both sides, the same kind and engine / trainer specs. The cell sets may differ: the result
holds their union. A cell present in several sources must be declared identically (axes, reference,
config), and when more than one source finished it, their run files must be byte-identical (every file
of runs/<id>/ except cell.json and timing.jsonl, which hold wall-clock times, and checkpoints/, resume state
that is never copied); a done copy wins over a
failed, running or pending one. Anything else is refused with a one-line error naming the cell or the
key that differs, before DST is touched. DST may already hold a merge (or a grid) with the same
fingerprint: it is then one of the sources, and nothing it holds is lost.

Every run directory is copied to runs/<id>.partial and renamed into place, and cells.json is written last
(atomically), so an interrupted merge leaves DST readable and a rerun completes it.
"""

from __future__ import annotations

import filecmp
import hashlib
import json
import shutil
from pathlib import Path

from ..remedies.identity import comparable_cell
from ..util import manifest
from ..util.atomic import atomic_write
from .layout import load_cells, read_status, run_dir

AXIS_KEYS = ("task", "preset", "remedy", "remedy_args", "mode", "algorithm", "seed", "engine", "trainer")
"""RunConfig keys a grid's axes set; everything else is shared run configuration (part of the fingerprint)."""
VOLATILE = ("cell.json", "timing.jsonl")
"""Run files that hold wall-clock times: not compared, taken from the chosen copy."""
RESUME_STATE = "checkpoints"
"""A run's resume state (model and optimizer checkpoints): neither compared nor copied (it is not a result)."""


VARIES = "varies_by_remedy"
"""Fingerprint entry (only when non-empty): config keys a grid's `remedy_variants` set per remedy label (e.g. a
tightened PPO clip's eps_low / eps_high). They are not shared, so they are left out of the comparison between
sources; instead every remedy label must carry one config across the merged cells (`label_configs`)."""


def label_configs(doc: dict, where: str) -> dict:
    """remedy label -> the RunConfig its cells share (the config minus AXIS_KEYS); cells of one label that
    disagree are an error: a grid (or a merge) gives each label one configuration."""
    by_label: dict = {}
    for c in doc.get("cells", []):
        cfg = {k: v for k, v in (c.get("config") or {}).items() if k not in AXIS_KEYS}
        label = (c.get("axes") or {}).get("remedy")
        prev = by_label.setdefault(label, cfg)
        if cfg != prev:
            key = sorted(k for k in set(cfg) | set(prev) if cfg.get(k) != prev.get(k))[0]
            raise ValueError(
                f"{where}: cell {c['id']} differs from the other {label!r} cells in config key {key!r}; not one grid"
            )
    return by_label


def shared_config(doc: dict, where: str) -> dict:
    """The RunConfig keys every cell shares, plus VARIES: the keys that differ between remedy labels (set by
    remedy_variants); cells of one label that disagree are an error."""
    configs = list(label_configs(doc, where).values())
    if not configs:
        return {}
    keys = set().union(*configs)
    first = configs[0]
    shared = {k: first.get(k) for k in sorted(keys) if all(k in c and c[k] == first[k] for c in configs)}
    varying = sorted(keys - set(shared))
    return {**shared, VARIES: varying} if varying else shared


def fingerprint(doc: dict, where: str = "grid") -> dict:
    """The parts of a cells.json document that must agree for two result dirs to merge (module docstring)."""
    conditions = {}
    for c in doc.get("cells", []):
        cond = c.get("condition") or {}
        conditions[cond.get("name")] = {k: cond.get(k) for k in ("kind", "engine", "trainer")}
    fp = {
        "grid": doc.get("grid"),
        "reference_condition": doc.get("reference_condition"),
        "collapse": doc.get("collapse") or {},
        "config": shared_config(doc, where),
        "conditions": conditions,
    }
    if doc.get("endpoint") is not None:  # a declared endpoint only: grids without one keep their fingerprint
        fp["endpoint"] = doc["endpoint"]
    return fp


def fingerprint_hash(fp: dict) -> str:
    """A short stable digest of a fingerprint's mergeable part (conditions are compared by name instead)."""
    part = {k: v for k, v in fp.items() if k != "conditions"}
    return hashlib.sha256(json.dumps(part, sort_keys=True).encode()).hexdigest()[:16]


def fingerprint_difference(a: dict, b: dict) -> str | None:
    """How two fingerprints disagree, in words, or None when they merge."""
    for key in ("grid", "reference_condition", "collapse", "endpoint"):
        if a.get(key) != b.get(key):
            return f"{key} {a.get(key)!r} vs {b.get(key)!r}"
    skip = {VARIES, *a["config"].get(VARIES, ()), *b["config"].get(VARIES, ())}  # per label: label_configs
    for key in sorted(set(a["config"]) | set(b["config"])):
        if key not in skip and a["config"].get(key) != b["config"].get(key):
            return f"config key {key!r} ({a['config'].get(key)!r} vs {b['config'].get(key)!r})"
    for name in sorted(set(a["conditions"]) & set(b["conditions"]), key=str):
        if a["conditions"][name] != b["conditions"][name]:
            return f"condition {name!r} ({a['conditions'][name]} vs {b['conditions'][name]})"
    return None


def _files(d: Path) -> list[str]:
    return sorted(
        str(p.relative_to(d))
        for p in d.rglob("*")
        if p.is_file()
        and p.name not in VOLATILE
        and not p.name.startswith(".")  # a run's .lock is not a result
        and RESUME_STATE not in p.relative_to(d).parts
    )


def runs_identical(a: Path, b: Path) -> str | None:
    """None when two run dirs hold the same bytes (VOLATILE files aside), else the first file that differs."""
    fa, fb = _files(a), _files(b)
    if fa != fb:
        return f"files {sorted(set(fa) ^ set(fb))[0]!r} in only one copy"
    for name in fa:
        if not filecmp.cmp(a / name, b / name, shallow=False):
            return f"{name} differs"
    return None


def _status(src: Path, cid: str) -> str:
    st = read_status(src, cid)
    return (st or {}).get("status") or "pending"


def plan_merge(sources: list[Path]) -> tuple[dict, dict[str, Path | None]]:
    """(merged cells.json document, {cell id: source dir whose run to take, or None}); raises on a conflict."""
    docs = [(src, load_cells(src)) for src in sources]
    fps = [(src, fingerprint(doc, str(src / "cells.json"))) for src, doc in docs]
    for src, fp in fps[1:]:
        diff = fingerprint_difference(fps[0][1], fp)
        if diff:
            raise ValueError(f"cannot merge {src} into {fps[0][0]}: different grid fingerprint ({diff})")
    cells: dict[str, dict] = {}
    chosen: dict[str, Path | None] = {}
    for src, doc in docs:
        for c in doc["cells"]:
            cid = c["id"]
            if cid in cells:
                have, new = comparable_cell(cells[cid]), comparable_cell(c)  # a plug-in's path aside: id has name@hash
                for key in ("axes", "reference", "config"):
                    if have.get(key) != new.get(key):
                        raise ValueError(
                            f"cannot merge {src}: cell {cid} is declared differently in {key} "
                            f"than in {chosen[cid] or 'an earlier source'}"
                        )
            else:
                cells[cid], chosen[cid] = c, None
            if not run_dir(src, cid).is_dir():
                continue
            prev = chosen[cid]
            if prev is None or (_status(prev, cid) != "done" and _status(src, cid) == "done"):
                chosen[cid] = src
            elif _status(prev, cid) == "done" and _status(src, cid) == "done":
                diff = runs_identical(run_dir(prev, cid), run_dir(src, cid))
                if diff:
                    raise ValueError(
                        f"cannot merge: cell {cid} finished in both {prev} and {src} with different "
                        f"results ({diff}); keep one of them"
                    )
    first = docs[0][1]
    doc = {
        "grid": first["grid"],
        "reference_condition": first["reference_condition"],
        "collapse": first.get("collapse") or {},
        "cells": list(cells.values()),
    }
    if first.get("endpoint") is not None:
        doc["endpoint"] = first["endpoint"]
    label_configs(doc, "cannot merge: the merged cells")  # a remedy label with two configs across the sources
    return doc, chosen


def merge(sources: list[str | Path], out: str | Path) -> dict:
    """Merge the result dirs `sources` (and `out` itself, if it already holds one) into `out`; a summary dict."""
    from .same_run import distinct_dirs

    out = Path(out)
    srcs = [Path(s) for s in distinct_dirs(sources, "grid result directory")]
    for s in srcs:
        if not (s / "cells.json").is_file():
            raise FileNotFoundError(f"{s}: not a grid result directory (no cells.json)")
    if (out / "cells.json").is_file():
        srcs = [out] + [s for s in srcs if s.resolve() != out.resolve()]
    elif out.exists() and any(not p.name.startswith(".") for p in out.iterdir()):  # its .lock aside
        raise ValueError(f"{out} exists and is not a grid result directory; use an empty or new --out")
    doc, chosen = plan_merge(srcs)
    copied = 0
    for cid, src in chosen.items():
        if src is None or src.resolve() == out.resolve():
            continue
        dst = run_dir(out, cid)
        tmp = dst.with_name(dst.name + ".partial")
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(run_dir(src, cid), tmp, ignore=shutil.ignore_patterns(RESUME_STATE))
        if dst.exists():
            shutil.rmtree(dst)
        tmp.rename(dst)
        copied += 1
    out.mkdir(parents=True, exist_ok=True)
    fp = fingerprint(doc)
    atomic_write(
        out / "merged.json",
        json.dumps({"fingerprint": fingerprint_hash(fp), "sources": [str(s) for s in srcs]}, indent=1, sort_keys=True)
        + "\n",
    )
    atomic_write(out / "cells.json", json.dumps(doc, indent=1, sort_keys=True) + "\n")
    manifest.update(out, ["cells.json"])
    done = sum(1 for cid in chosen if _status(out, cid) == "done")
    return {"cells": len(doc["cells"]), "done": done, "copied": copied, "fingerprint": fingerprint_hash(fp)}
