"""The grid result layout: the one contract between the grid runner and the report, and its only owner.

    results/<NAME>/grid.yaml          resolved grid spec (self-contained, reloads to the same cells)
    results/<NAME>/cells.json         {"grid", "reference_condition", "collapse", "cells": [...]}
    results/<NAME>/runs/<id>/         the run directory of timbench.rl.loop.run
    results/<NAME>/runs/<id>/cell.json  {"status": running|done|failed, "error", "wall_s", "attempts"}

Every file here is written atomically, so a reader (or a run resumed after
kill -9) sees a whole old file or a whole new one.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import yaml

from ..metrics import log_summary
from ..remedies.identity import comparable_cell, comparable_config
from ..util import manifest
from ..util.atomic import atomic_write
from ..util.dirlock import DirLock
from ..util.readfile import read_json
from .spec import Cell, GridSpec

STATUSES = ("running", "done", "failed")
"""What a runner writes into cell.json."""
_CELL_ID = re.compile(r"[A-Za-z0-9_.@+-]+")
PENDING = "pending"
"""What a reader calls a cell without cell.json: the runner never started it."""


def cells_document(grid: GridSpec, cells: list[Cell]) -> dict:
    doc = {
        "grid": grid.name,
        "reference_condition": grid.reference,
        "collapse": dict(grid.collapse),
        "cells": [c.to_dict() for c in cells],
    }
    if grid.endpoint is not None:  # the pre-registered endpoint, only when declared (older grids keep their bytes)
        doc["endpoint"] = grid.endpoint
    return doc


def _dumps(doc: dict) -> str:
    return json.dumps(doc, indent=1, sort_keys=True) + "\n"


def _comparable(doc: dict) -> dict:
    """`doc` with each cell's plug-in path dropped (the cell id holds its name@hash): a moved file resumes. Cells
    are compared in id order: `grid merge` writes the union of its sources, not the spec's expansion order."""
    cells = doc.get("cells")
    if not isinstance(cells, list):
        return doc
    return {**doc, "cells": sorted((comparable_cell(c) for c in cells), key=lambda c: str(c.get("id")))}


def _first_difference(old: dict, new: dict) -> str:
    if old.get("grid") != new["grid"]:
        return f"grid {old.get('grid')!r} vs {new['grid']!r}"
    old_cells = {c["id"]: c for c in old.get("cells", [])}
    for c in new["cells"]:
        if c["id"] not in old_cells:
            return f"cell {c['id']} is new"
        if old_cells[c["id"]] != c:
            keys = sorted(k for k in c["config"] if c["config"][k] != old_cells[c["id"]]["config"].get(k))
            return f"cell {c['id']} differs" + (f" in {', '.join(keys)}" if keys else "")
    return f"{len(old_cells)} cells vs {len(new['cells'])}, or the reference/collapse settings"


def experiment_difference(a: dict, b: dict) -> str | None:
    """How two cells.json documents describe different experiments, or None if they are the same one.

    Same experiment: the same grid name, reference condition, collapse rule and cell ids, and for each
    cell the same axes, reference and full RunConfig. Condition docs (prose) may differ.
    """
    if a.get("grid") != b.get("grid"):
        return f"grid name {a.get('grid')!r} vs {b.get('grid')!r}"
    for key in ("reference_condition", "collapse", "endpoint"):
        if a.get(key) != b.get(key):
            return f"{key} {a.get(key)!r} vs {b.get(key)!r}"
    ca, cb = ({c["id"]: c for c in d.get("cells", [])} for d in (a, b))
    only = sorted(set(ca) ^ set(cb))
    if only:
        return f"cell sets differ ({len(ca)} vs {len(cb)} cells; {only[0]} is in only one)"
    for cid, c in ca.items():
        for key in ("axes", "reference"):
            if c.get(key) != cb[cid].get(key):
                return f"cell {cid} differs in {key}"
        ka, kb = comparable_config(c.get("config") or {}), comparable_config(cb[cid].get("config") or {})
        keys = sorted(k for k in set(ka) | set(kb) if ka.get(k) != kb.get(k))
        if keys:
            return f"cell {cid} config differs in {', '.join(keys)} ({ka.get(keys[0])!r} vs {kb.get(keys[0])!r})"
    return None


def prepare(out: str | Path, grid: GridSpec, cells: list[Cell]) -> Path:
    """Write grid.yaml and cells.json into `out`; refuse a directory that holds another grid's cells."""
    out = Path(out)
    doc = cells_document(grid, cells)
    path = out / "cells.json"
    if path.is_file():
        try:
            old = json.loads(path.read_text())
        except json.JSONDecodeError:
            old = {}
        if not isinstance(old, dict) or _dumps(_comparable(old)) != _dumps(_comparable(doc)):
            raise ValueError(
                f"{path} was written by a different grid ({_first_difference(old, doc)}); "
                "use another --out or delete that directory"
            )
    out.mkdir(parents=True, exist_ok=True)
    atomic_write(out / "grid.yaml", yaml.safe_dump(grid.to_dict(), sort_keys=False))
    text = _dumps(doc)
    if not path.is_file() or path.read_text() != text:  # unchanged: an older grid's manifest is left as it was
        atomic_write(path, text)
        manifest.update(out, ["cells.json"])  # swapped axes, a removed cell or another list then fail verify
    return out


def load_cells(out: str | Path) -> dict:
    """Read results/<NAME>/cells.json: an object whose `cells` list holds objects with a valid `id` each."""
    path = Path(out) / "cells.json"
    doc = read_json(path, "grid cells file")
    cells = doc.get("cells") if isinstance(doc, dict) else None
    if not isinstance(cells, list):
        raise ValueError(f"{path}: expected an object with a 'cells' list")
    for i, c in enumerate(cells):
        if not isinstance(c, dict) or "id" not in c:
            raise ValueError(f"{path}: cells[{i}] has no 'id' (each cell is an object with id, axes and config)")
        check_cell_id(c["id"], f"{path}: cells[{i}]")
    return doc


def check_cell_id(cell_id, where: str) -> str:
    """`cell_id` if it names one directory under runs/ (what grid.spec.cell_id makes), else a one-line ValueError:
    ids come from data (cells.json), so `../x`, `a/b` or an empty id must not reach a path."""
    if not isinstance(cell_id, str) or not _CELL_ID.fullmatch(cell_id) or cell_id in (".", ".."):
        raise ValueError(
            f"{where}: cell id {cell_id!r} is not a directory name of [A-Za-z0-9_.@+-] "
            "(no path separators, not empty, not . or ..)"
        )
    return cell_id


def run_dir(out: str | Path, cell_id: str) -> Path:
    """results/<NAME>/runs/<id>, refused (one line) when the id or a symlink there would lead outside runs/."""
    runs = Path(out) / "runs"
    d = runs / check_cell_id(cell_id, str(runs))
    if d.is_symlink() and runs.resolve() not in d.resolve().parents:
        raise ValueError(f"{d}: a link to {d.resolve()}, outside {runs}; a run directory must lie inside it")
    return d


def read_status(out: str | Path, cell_id: str) -> dict | None:
    """The cell's cell.json, or None if it never started (a torn file cannot exist: writes are atomic).

    A file that is not JSON or holds no valid status is a one-line error naming it.
    """
    path = run_dir(out, cell_id) / "cell.json"
    if not path.is_file():
        return None
    st = read_json(path, "cell status file")
    if not isinstance(st, dict) or st.get("status") not in STATUSES:
        raise ValueError(f"{path}: status must be one of {'|'.join(STATUSES)}")
    return st


def status_record(status: str, error: str | None, wall_s: float, attempts: int) -> dict:
    """A cell.json record (write_status writes it)."""
    if status not in STATUSES:
        raise ValueError(f"cell status {status!r} is invalid; valid: {', '.join(STATUSES)}")
    return {"status": status, "error": error, "wall_s": round(float(wall_s), 3), "attempts": int(attempts)}


def write_status(out: str | Path, cell_id: str, status: str, error: str | None, wall_s: float, attempts: int) -> dict:
    rec = status_record(status, error, wall_s, attempts)
    atomic_write(run_dir(out, cell_id) / "cell.json", json.dumps(rec, sort_keys=True) + "\n")
    return rec


def cell_binding(cell: dict) -> dict:
    """What a run's manifest binds it to: the cell id and a sha256 of its config (plug-in directory dropped, as
    in every resume check: a moved file is the same cell). `grid merge` and copied grids keep both identical."""
    config = json.dumps(comparable_config(cell.get("config") or {}), sort_keys=True)
    return {"id": cell["id"], "config": hashlib.sha256(config.encode()).hexdigest()}


def binding_problems(d: Path, cell: dict) -> list[str]:
    """[] when `d`'s manifest is bound to `cell`, or to no cell (made before bindings); else one line."""
    bound, want = manifest.binding(d), cell_binding(cell)
    if bound is None or bound == want:
        return []
    other = bound.get("id") if isinstance(bound, dict) else bound
    what = "cell id" if not isinstance(bound, dict) or bound.get("id") != want["id"] else "config"
    return [
        f"{d / manifest.MANIFEST}: bound to cell {other!r} with another {what}, not to cell {want['id']!r} "
        "(a run directory copied from another cell is not this cell's result)"
    ]


def run_finished(out: str | Path, cell: dict) -> bool:
    """True when the run's summary.json says it finished, its manifest still matches every file and it is bound
    to `cell` or unbound (the run itself is the source of truth; one killed between its summary and its manifest
    is resumed, which seals it)."""
    path = run_dir(out, cell["id"]) / "summary.json"
    try:
        finished = json.loads(path.read_text()).get("status") == "finished"
    except (OSError, json.JSONDecodeError, AttributeError):
        return False
    return finished and not manifest.problems(path.parent) and not binding_problems(path.parent, cell)


def record_if_finished(out: str | Path, cell: dict) -> dict | None:
    """The cell's status if its run already finished (sealed, intact, bound to `cell`), recording it `done` first
    when a kill landed between the run's end and cell.json; None when the run has to (re)start. A run bound to
    another cell is removed first (a resume would return its sealed result as this cell's). Every backend asks
    this before starting a cell, so the rule lives here once."""
    cid = cell["id"]
    if manifest.binding(run_dir(out, cid)) is not None and binding_problems(run_dir(out, cid), cell):
        reset_run(out, cid)
        return None
    if not run_finished(out, cell):
        return None
    prev = read_status(out, cid) or {}
    if prev.get("status") == "done":  # an unbound (older) manifest stays as it was: results are not rewritten
        return prev
    return record_done(out, cell, prev.get("wall_s", 0.0), max(int(prev.get("attempts", 0)), 1))


def record_done(out: str | Path, cell: dict, wall_s: float, attempts: int) -> dict:
    """Bind the finished run's manifest to `cell`, then write cell.json done (a kill between: the next grid run
    finds the run finished and records it)."""
    manifest.bind(run_dir(out, cell["id"]), cell_binding(cell))
    return write_status(out, cell["id"], "done", None, wall_s, attempts)


def integrity(out: str | Path, cell: dict) -> list[str]:
    """Problems of a cell whose cell.json says done ([] when intact): done_problems of its run directory."""
    return done_problems(run_dir(out, cell["id"]), cell)


def done_problems(d: Path, cell: dict | None = None) -> list[str]:
    """Why a run directory does not hold a finished run (of `cell`, when given): files that differ from its
    manifest, a manifest that does not list every run file (an emptied one passes no check), a summary that does
    not say finished (a failed run whose cell.json was flipped to done) or that its logs no longer give, or a
    manifest bound to another cell."""
    bad = manifest.problems(d)
    if bad:
        return bad
    lacking = [n for n in manifest.REQUIRED_RUN_FILES if n not in (manifest.read(d) or {})]
    if lacking:
        return [
            f"{d / manifest.MANIFEST}: lists no {', '.join(lacking)} (a finished run's manifest covers "
            f"{', '.join(manifest.REQUIRED_RUN_FILES)} at least)"
        ]
    try:
        status = json.loads((d / "summary.json").read_text()).get("status")
    except (OSError, ValueError, AttributeError):
        status = None
    if status != "finished":
        return [f"{d / 'summary.json'}: the run ended {status!r}, not 'finished', though cell.json says done"]
    return (binding_problems(d, cell) if cell is not None else []) + log_summary.differences(d)


def reset_run(out: str | Path, cell_id: str) -> None:
    """Remove what a run wrote (logs, summary, status, manifest, checkpoints) so the cell reruns from step 0:
    a resume would re-summarise the damaged logs and seal them."""
    d = run_dir(out, cell_id)
    prev = read_status(out, cell_id) or {}
    # no longer done: a kill before the redo ends leaves it `running`, which the next grid run resumes
    write_status(out, cell_id, "running", None, 0.0, int(prev.get("attempts", 0)))
    for name in (*manifest.RUN_FILES, manifest.MANIFEST, "error.txt", "checkpoints/state.pt"):
        (d / name).unlink(missing_ok=True)


GridLock = DirLock  # the grid runner's name for the one output-directory lock
