"""`timbench grid ...`: plan, run and report grids of RL runs.

    timbench grid plan GRID.yaml [--json] [--workers N]
    timbench grid run GRID.yaml --out results/NAME [--workers N] [--backend local|ray] [--address A]
                                [--retry-failed]
    timbench grid report results/NAME

Sub-commands are registrars in `REGISTRARS`: each takes the `grid` subparsers
object and adds its own parser, so another module adds `grid report` with one
entry here (or by calling `add_parser(sub)` and using the returned object).
"""

from __future__ import annotations

import json
import os
import sys


def _cmd_plan(args) -> int:
    from .cost import cell_seconds, wall_seconds
    from .spec import expand, load_grid
    grid = load_grid(args.grid)
    cells = expand(grid)
    workers = args.workers or grid.workers or os.cpu_count() or 1
    costs = [cell_seconds(c.config) for c in cells]
    rows = [{"id": c.id, "engine": c.condition.engine, "trainer": c.condition.trainer,
             "steps": c.config["steps"], "reference": c.reference, "est_s": round(s, 1)}
            for c, s in zip(cells, costs)]
    total, wall = sum(costs), wall_seconds(costs, workers)
    if args.json:
        print(json.dumps({"grid": grid.name, "cells": rows, "total_s": round(total, 1),
                          "workers": workers, "wall_s": round(wall, 1)}, sort_keys=True))
        return 0
    from timbench.runners.progress import fmt_seconds
    width = max(len(r["id"]) for r in rows)
    print(f"{'cell':<{width}}  {'engine':<26} {'trainer':<26} {'steps':>5} {'est':>8}")
    for r in rows:
        print(f"{r['id']:<{width}}  {r['engine']:<26} {r['trainer']:<26} {r['steps']:>5} "
              f"{fmt_seconds(r['est_s']):>8}")
    print(f"grid {grid.name}: {len(rows)} cells, estimated {fmt_seconds(total)} of CPU time on 1 thread each, "
          f"{fmt_seconds(wall)} wall with {workers} workers (cost model: timbench/grid/cost.py)")
    return 0


def _cmd_run(args) -> int:
    from timbench.runners.driver import run_grid
    from ..atomic import check_output_dir
    from .spec import load_grid
    check_output_dir(args.out)
    if args.workers is not None and args.workers < 1:
        raise ValueError(f"--workers must be >= 1, got {args.workers}")
    if args.address is not None and args.backend != "ray":
        raise ValueError("--address is only for --backend ray")
    grid = load_grid(args.grid)
    final = run_grid(grid, args.out, workers=args.workers, backend=args.backend,
                     address=args.address if args.backend == "ray" else None, retry_failed=args.retry_failed)
    failed = {cid: st for cid, st in final.items() if (st or {}).get("status") != "done"}
    for cid, st in failed.items():
        print(f"FAILED {cid}: {(st or {}).get('error') or 'not run'}", file=sys.stderr)
    hint = " (rerun with --retry-failed to try the failed cells again)" if failed else ""
    print(f"grid {grid.name}: {len(final) - len(failed)}/{len(final)} cells done, {len(failed)} failed "
          f"-> {args.out}{hint}")
    return 1 if failed else 0


def _add_plan(grid_sub) -> None:
    p = grid_sub.add_parser("plan", help="list the cells of a grid and estimate its cost")
    p.add_argument("grid", help="grid spec YAML (e.g. bench/grids/example.yaml)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--workers", type=int, help="parallel cells for the wall-time estimate (default: the grid's, "
                                               "else the CPU count)")
    p.set_defaults(func=_cmd_plan)


def _add_run(grid_sub) -> None:
    p = grid_sub.add_parser("run", help="run every cell of a grid that is not done yet (resumable)")
    p.add_argument("grid", help="grid spec YAML")
    p.add_argument("--out", required=True, help="results directory, e.g. results/NAME")
    p.add_argument("--workers", type=int, help="parallel cells (default: the grid's, else the CPU count)")
    p.add_argument("--backend", default="local", choices=["local", "ray"], help="where cells run")
    p.add_argument("--address", help="with --backend ray: local (default), auto, or a cluster address")
    p.add_argument("--retry-failed", action="store_true", help="also rerun cells that failed before")
    p.set_defaults(func=_cmd_run)


def _add_report(gsub) -> None:
    from .report import add_report_parser
    add_report_parser(gsub)


REGISTRARS = [_add_plan, _add_run, _add_report]
"""Functions that add one `timbench grid` sub-command each, given the grid subparsers object."""


def add_parser(sub):
    """Register `timbench grid` on the top-level subparsers; return the grid subparsers object."""
    g = sub.add_parser("grid", help="plan and run grids of RL runs (task x model x condition x remedy x ...)")
    grid_sub = g.add_subparsers(dest="grid_command", required=True)
    for register in REGISTRARS:
        register(grid_sub)
    return grid_sub
