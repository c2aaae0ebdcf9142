"""What `timbench claims` reads: every given grid result dir (as `timbench paper` reads one) and alignment table.

`load_evidence(dirs)` turns each DIR into either a grid (a dir holding cells.json, loaded by
timbench.studies.paper.paper_data into a PaperData) or a set of alignment tables (a dir holding
align_*.json, the rows `timbench align --table` wrote). The rules (timbench.studies.claims_rules) then ask
`Evidence.find(*settings)` for the best grid holding every setting they compare (most steps first, then
most seeds) and `Evidence.align_pair(model, a, b)` for two alignment rows of one table. Pure reads.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from ..grid.same_run import cell_identity, distinct_dirs
from ..util import manifest
from .paper import paper_data
from .paper_claims import PaperData

Setting = tuple[str, str, str]
"""(condition, remedy, mode) as PaperData keys its settings."""


@dataclass
class Evidence:
    grids: dict[str, PaperData] = field(default_factory=dict)
    """Grid dir (as given) -> its data, in preference order (most steps first, then most seeds, then name)."""
    steps: dict[str, int] = field(default_factory=dict)
    """Grid dir -> RL steps per cell."""
    align: list[dict] = field(default_factory=list)
    """Every alignment-table row, each with its table's file name under "table"."""
    repeats: set = field(default_factory=set)
    """(grid dir, cell id) of each run a grid earlier in the preference order holds too (grid.same_run): a rule
    that pools runs over grids counts it there, once."""

    def first_copies(self, name: str, rows: list[dict]) -> list[dict]:
        """The summary rows (or cells) of grid `name` whose runs no earlier grid holds."""
        return [r for r in rows if (name, r.get("id") if isinstance(r, dict) else r.id) not in self.repeats]

    def find(self, *settings: Setting) -> tuple[str, PaperData] | None:
        """The grid holding the most finished seeds of every setting (the fewest of any one of them counts), or
        None; at equal seeds the preference order. A partly run grid does not beat a finished one."""
        held = [
            (min(len(d.rows[s]) for s in settings), -i, n, d)
            for i, (n, d) in enumerate(self.grids.items())
            if all(d.rows.get(s) for s in settings)
        ]
        return max(held, key=lambda x: x[:2])[2:] if held else None

    def find_all(self, *settings: Setting) -> list[tuple[str, PaperData]]:
        return [(n, d) for n, d in self.grids.items() if all(d.rows.get(s) for s in settings)]

    def align_pair(self, model: str, a: tuple[str, str], b: tuple[str, str]) -> tuple[dict, dict] | None:
        """Two alignment rows measured on `model` (a substring of its model_name) in the same table, with exactly
        the (engine, trainer) specs `a` and `b` (rows of different tables may use different checkpoints)."""
        for table in dict.fromkeys(r["table"] for r in self.align):
            rows = [r for r in self.align if r["table"] == table and model in str(r.get("model_name", ""))]
            ra, rb = ([r for r in rows if (r.get("engine"), r.get("trainer")) == spec] for spec in (a, b))
            if ra and rb:
                return ra[0], rb[0]
        return None

    def metric_keys(self) -> set[str]:
        """Every per-step metric name logged by a finished cell of any grid (first step of each setting)."""
        return {
            k
            for d in self.grids.values()
            for cells in d.cells.values()
            for c in cells[:1]
            for row in c.metrics[:1]
            for k in row
        }


def _align_rows(path: Path) -> list[dict]:
    rows = []
    for f in sorted(path.glob("align_*.json")):
        manifest.refuse_changed(path, [f.name], "align table")
        data = json.loads(f.read_text())
        if not isinstance(data, list) or not all(isinstance(r, dict) for r in data):
            raise ValueError(f"{f}: expected a list of alignment rows (from `timbench align --table`)")
        rows += [{**r, "table": f.name} for r in data]
    return rows


def load_evidence(dirs: list[str | Path]) -> Evidence:
    """Load every DIR; a missing one, or one with neither cells.json nor align_*.json, is a one-line error."""
    grids, steps, align = {}, {}, []
    for raw in distinct_dirs(dirs):
        path = Path(raw)
        if not path.is_dir():
            raise FileNotFoundError(
                f"{path}: not a directory (expected a grid result dir with cells.json or an "
                "alignment dir with align_*.json, e.g. results/paper or results/align)"
            )
        if (path / "cells.json").is_file():
            d, _ = paper_data(path)
            if not d.rows:
                raise ValueError(f"{path}: no finished cells (run it: timbench grid run {path}/grid.yaml --out {path})")
            grids[str(path)] = d  # the path, not its name: results/quick and results/tracks/quick differ
            steps[str(path)] = int(next(iter(d.cells.values()))[0].config.get("steps") or 0)
        elif any(path.glob("align_*.json")):
            align += _align_rows(path)
        else:
            raise ValueError(
                f"{path}: holds neither cells.json (a grid result dir, e.g. results/paper) nor "
                "align_*.json (an alignment dir, e.g. results/align)"
            )
    seeds = {n: max(len(r) for r in d.rows.values()) for n, d in grids.items()}
    order = sorted(grids, key=lambda n: (-steps[n], -seeds[n], n))
    seen, repeats = set(), set()
    for n in order:
        for cells in grids[n].cells.values():
            for c in cells:
                key = cell_identity(c)
                if key in seen:
                    repeats.add((n, c.id))
                seen.add(key)
    return Evidence({n: grids[n] for n in order}, {n: steps[n] for n in order}, align, repeats)
