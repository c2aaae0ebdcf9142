"""Reading a grid result directory (the layout `timbench grid run` writes) into plain records.

The layout (`timbench.grid.layout`, its owner) is the contract between the grid runner and the
reports: `results/NAME/cells.json` lists the cells; `runs/<id>/` holds each cell's run directory
(metrics.jsonl, eval.jsonl, summary.json) plus `cell.json` with the runner's status. Reading is
strict about what a finished cell must hold and lenient about what an unfinished one may lack, so a
report on a half-run or partly failed grid works, while a corrupt file is a one-line error.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from ..grid.layout import PENDING, done_problems, read_status
from ..grid.layout import run_dir as layout_run_dir  # `run_dir` is a local name below
from ..util import manifest
from ..util.readfile import read_json

CELL_KEYS = ("id", "axes", "condition", "reference", "config")


@dataclass
class CellRun:
    """One grid cell: its declaration from cells.json and whatever its run directory holds so far."""

    id: str
    """Cell id, e.g. add-4d-v1.tiny-dense.bf16-engine.tis_token.recompute.grpo.s0."""
    axes: dict
    """task, model, condition, remedy, mode, algorithm, seed."""
    condition: dict
    """name, kind (reference|precision|quant|kernels|tp|moe|noise|vllm), engine and trainer specs, doc."""
    reference: str | None
    """Id of the zero-mismatch cell with the same task/model/algorithm/seed (None for none)."""
    config: dict
    """The full RunConfig dict the runner passed to timbench.rl.loop.run."""
    status: str = PENDING
    """cell.json status (timbench.grid.layout.STATUSES), or PENDING when the runner has not written one."""
    error: str | None = None
    """cell.json's one-line error for a failed cell."""
    metrics: list[dict] = field(default_factory=list)
    """metrics.jsonl rows (one per step)."""
    evals: list[dict] = field(default_factory=list)
    """eval.jsonl rows ({step, accuracy_t1, accuracy_greedy})."""
    summary: dict = field(default_factory=dict)
    """summary.json ({} until the run wrote one)."""


@dataclass
class Grid:
    """A grid result directory read into memory."""

    name: str
    """Grid name (cells.json `grid`)."""
    path: Path
    """The results/NAME directory."""
    reference_condition: str
    """Name of the zero-mismatch condition (normally `baseline`)."""
    collapse: dict
    """CollapseRule overrides from the grid spec ({} for the defaults)."""
    cells: list[CellRun]
    """Cells in cells.json order."""
    endpoint: str | None = None
    """The endpoint the grid declared before it ran (cells.json `endpoint`), None when it declares none."""


def column(rows: list[dict], key: str) -> list[float]:
    """The values of metric `key` over metrics/eval rows, as floats, skipping rows that lack it (or log None)."""
    return [float(r[key]) for r in rows if r.get(key) is not None]


def read_jsonl(path: Path, tolerate_torn_tail: bool) -> list[dict]:
    """Rows of a JSONL log; a torn last line (a run killed mid-write) is dropped only if tolerated."""
    if not path.is_file():
        return []
    lines = path.read_text().splitlines()
    rows = []
    for i, line in enumerate(lines, 1):
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            if tolerate_torn_tail and i == len(lines):
                break
            raise ValueError(f"{path}:{i}: malformed JSON line ({e.msg})") from None
        if not isinstance(row, dict):
            raise ValueError(f"{path}:{i}: expected a JSON object per line, got {type(row).__name__}")
        rows.append(row)
    return rows


def _cell(raw: object, where: str) -> CellRun:
    if not isinstance(raw, dict) or any(k not in raw for k in CELL_KEYS):
        raise ValueError(f"{where}: each cell needs keys {', '.join(CELL_KEYS)}")
    for k in ("axes", "condition", "config"):
        if not isinstance(raw[k], dict):
            raise ValueError(f"{where}: cell {raw['id']!r} field {k!r} must be a mapping")
    for k in ("remedy", "mode", "condition"):
        if k not in raw["axes"]:
            raise ValueError(f"{where}: cell {raw['id']!r} axes lack {k!r}")
    return CellRun(
        id=str(raw["id"]),
        axes=raw["axes"],
        condition=raw["condition"],
        reference=raw["reference"],
        config=raw["config"],
    )


def load_cell_results(cell: CellRun, out: Path) -> CellRun:
    """Fill `cell` from out/runs/<id>/ (cell.json, metrics.jsonl, eval.jsonl, summary.json)."""
    run_dir = layout_run_dir(out, cell.id)
    st = read_status(out, cell.id)
    if st is not None:
        cell.status, cell.error = st["status"], st.get("error")
    done = cell.status == "done"
    if done:
        check_intact(out, run_dir, {"id": cell.id, "config": cell.config})
    cell.metrics = read_jsonl(run_dir / "metrics.jsonl", tolerate_torn_tail=not done)
    cell.evals = read_jsonl(run_dir / "eval.jsonl", tolerate_torn_tail=not done)
    if (run_dir / "summary.json").is_file():
        s = read_json(run_dir / "summary.json")
        if not isinstance(s, dict):
            raise ValueError(f"{run_dir / 'summary.json'}: expected a JSON object")
        cell.summary = s
    if done and not cell.metrics:
        raise ValueError(f"{run_dir}: cell.json says done but metrics.jsonl is missing or empty")
    return cell


def check_intact(out: Path, run_dir: Path, cell: dict | None = None) -> None:
    """Refuse (one-line ValueError naming the file) a done cell whose files no longer match its manifest (or whose
    summary no longer matches its logs, or that is bound to another cell than `cell`)."""
    bad = done_problems(run_dir, cell)
    if not bad:
        return
    if manifest.missing(run_dir):
        raise ValueError(
            f"{bad[0]}; stamp a result made before manifests once with `timbench grid verify {out} --adopt`"
        )
    more = f" (+{len(bad) - 1} more)" if len(bad) > 1 else ""
    raise ValueError(
        f"{bad[0]}{more}; `timbench grid verify {out}` lists every problem, `timbench grid run` redoes the cell"
    )


def load_results(path: str | Path) -> Grid:
    """Read results/NAME (cells.json and every runs/<id>/) into a Grid."""
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"{path}: not a directory (expected a grid result dir with cells.json)")
    meta = read_json(path / "cells.json")
    where = str(path / "cells.json")
    if not isinstance(meta, dict) or not isinstance(meta.get("cells"), list):
        raise ValueError(f"{where}: expected an object with a 'cells' list")
    cells = [_cell(c, where) for c in meta["cells"]]
    ids = [c.id for c in cells]
    if len(set(ids)) != len(ids):
        dup = next(i for i in ids if ids.count(i) > 1)
        raise ValueError(f"{where}: duplicate cell id {dup!r}")
    for c in cells:
        load_cell_results(c, path)
    return Grid(
        name=str(meta.get("grid", path.name)),
        path=path,
        reference_condition=str(meta.get("reference_condition", "baseline")),
        collapse=meta.get("collapse") or {},
        cells=cells,
        endpoint=meta.get("endpoint"),
    )
