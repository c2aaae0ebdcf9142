"""`timbench grid plan`, and the `timbench grid` command group the other packages add to.

    timbench grid plan GRID.yaml [--json] [--workers N]
    timbench grid merge SRC [SRC ...] --out DST      (timbench.grid.merge)

Planning needs nothing but the grid package. `grid run` lives with the runners
(`timbench.runners.cli`) and `grid report` with the reports (`timbench.report.cli`);
`timbench.cli` adds them to the group this module creates, so the grid package
never imports the code that runs or reports it.
"""

from __future__ import annotations

import json
import os

from .cost import cell_seconds, fmt_seconds, wall_seconds
from .verify import add_verify_parser


def _cmd_plan(args) -> int:
    from .spec import expand, load_grid  # deferred: torch is heavy

    grid = load_grid(args.grid)
    cells = expand(grid)
    workers = args.workers or grid.workers or os.cpu_count() or 1
    costs = [cell_seconds(c.config) for c in cells]
    rows = [
        {
            "id": c.id,
            "engine": c.condition.engine,
            "trainer": c.condition.trainer,
            "steps": c.config["steps"],
            "reference": c.reference,
            "est_s": round(s, 1),
        }
        for c, s in zip(cells, costs)
    ]
    total, wall = sum(costs), wall_seconds(costs, workers)
    if args.json:
        print(
            json.dumps(
                {
                    "grid": grid.name,
                    "cells": rows,
                    "total_s": round(total, 1),
                    "workers": workers,
                    "wall_s": round(wall, 1),
                },
                sort_keys=True,
            )
        )
        return 0
    width = max(len(r["id"]) for r in rows)
    print(f"{'cell':<{width}}  {'engine':<26} {'trainer':<26} {'steps':>5} {'est':>8}")
    for r in rows:
        print(f"{r['id']:<{width}}  {r['engine']:<26} {r['trainer']:<26} {r['steps']:>5} {fmt_seconds(r['est_s']):>8}")
    print(
        f"grid {grid.name}: {len(rows)} cells, estimated {fmt_seconds(total)} of CPU time on 1 thread each, "
        f"{fmt_seconds(wall)} wall with {workers} workers (cost model: timbench/grid/cost.py)"
    )
    return 0


WORKERS_HELP = "parallel cells (default: the grid's workers, else the CPU count)"
"""The one `--workers` default of grid plan/run, submit and track run."""


def default_workers(workers: int | None, grid_workers: int | None = None) -> int:
    """`--workers` as given, else the grid's, else the CPU count (the same rule for every command)."""
    return workers or grid_workers or os.cpu_count() or 1


def add_workers_arg(p) -> None:
    """Add `--workers N` (default: `default_workers`) to a command's parser."""
    p.add_argument("--workers", type=int, help=WORKERS_HELP)


def add_plan_parser(grid_sub) -> None:
    p = grid_sub.add_parser("plan", help="list the cells of a grid and estimate its cost")
    p.add_argument("grid", help="grid spec YAML (e.g. bench/grids/example.yaml)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    add_workers_arg(p)
    p.set_defaults(func=_cmd_plan)


def _cmd_merge(args) -> int:
    from .merge import merge  # deferred: torch is heavy

    info = merge(args.sources, args.out)
    print(
        f"grid merge: {info['cells']} cells ({info['done']} done, {info['copied']} run dirs copied), fingerprint "
        f"{info['fingerprint']} -> {args.out}; report with `timbench grid report {args.out}`"
    )
    return 0


def add_merge_parser(grid_sub) -> None:
    p = grid_sub.add_parser("merge", help="merge grid result dirs with the same grid fingerprint (union of cells)")
    p.add_argument("sources", nargs="+", help="grid result directories (each holding cells.json and runs/)")
    p.add_argument("--out", required=True, help="merged result directory (new, empty, or a merge to extend)")
    p.set_defaults(func=_cmd_merge)


def add_parser(sub):
    """Register `timbench grid` with its `plan` sub-command; return the grid subparsers object.

    Callers add the other sub-commands to the returned object (`grid run`, `grid report`).
    """
    g = sub.add_parser("grid", help="plan, run and report grids of RL runs (task x model x condition x remedy x ...)")
    grid_sub = g.add_subparsers(dest="grid_command", required=True)
    add_plan_parser(grid_sub)
    add_merge_parser(grid_sub)
    add_verify_parser(grid_sub)
    return grid_sub
