"""`timbench grid run`: run every cell of a grid that is not done yet (added to the `timbench grid` group).

timbench grid run GRID.yaml --out results/NAME [--workers N] [--backend local|ray] [--address A]
                            [--resources JSON] [--max-attempts N] [--retry-failed] [--cell-timeout S]
                            [--order axes|seeds]
"""

from __future__ import annotations

import sys


def _cmd_run(args) -> int:
    from timbench.grid.spec import file_plugins, from_results_dir, load_grid
    from timbench.util.atomic import check_output_dir

    from .driver import run_grid

    check_output_dir(args.out)
    if args.workers is not None and args.workers < 1:
        raise ValueError(f"--workers must be >= 1, got {args.workers}")
    for flag, value in (
        ("--address", args.address),
        ("--resources", args.resources),
        ("--max-attempts", args.max_attempts),
    ):
        if value is not None and args.backend != "ray":
            raise ValueError(f"{flag} is only for --backend ray")
    if args.cell_timeout is not None:  # checked before anything runs, even when every cell is done
        from .local import cell_timeouts

        cell_timeouts([], args.cell_timeout)
    options = {"cell_timeout": args.cell_timeout, "order": args.order}
    if args.backend == "ray":
        from .ray_runner import parse_resources

        options["resources"] = parse_resources(args.resources)
        if args.max_attempts is not None:
            if args.max_attempts < 1:
                raise ValueError(f"--max-attempts must be >= 1, got {args.max_attempts}")
            options["max_attempts"] = args.max_attempts
    grid = load_grid(args.grid)
    plugins = file_plugins(grid)
    if plugins and from_results_dir(args.grid) and not args.allow_plugins:
        raise ValueError(
            f"{args.grid} comes from a results directory and names plug-in file {plugins[0]}: a plug-in "
            "is code run with your rights; read it, then rerun with --allow-plugins to run it"
        )
    final = run_grid(
        grid,
        args.out,
        workers=args.workers,
        backend=args.backend,
        address=args.address if args.backend == "ray" else None,
        retry_failed=args.retry_failed,
        options=options,
    )
    failed = {cid: st for cid, st in final.items() if (st or {}).get("status") != "done"}
    for cid, st in failed.items():
        print(f"FAILED {cid}: {(st or {}).get('error') or 'not run'}", file=sys.stderr)
    hint = " (rerun with --retry-failed to try the failed cells again)" if failed else ""
    print(
        f"grid {grid.name}: {len(final) - len(failed)}/{len(final)} cells done, {len(failed)} failed "
        f"-> {args.out}{hint}"
    )
    return 1 if failed else 0


def add_run_parser(grid_sub) -> None:
    """Register `run` on the `timbench grid` subparsers (timbench.grid.cli.add_parser's result)."""
    from timbench.grid.cli import add_workers_arg

    from . import BACKENDS
    from .order import ORDERS

    p = grid_sub.add_parser("run", help="run every cell of a grid that is not done yet (resumable)")
    p.add_argument("grid", help="grid spec YAML")
    p.add_argument("--out", required=True, help="results directory, e.g. results/NAME")
    add_workers_arg(p)
    p.add_argument("--backend", default="local", choices=list(BACKENDS), help="where cells run")
    p.add_argument("--address", help="with --backend ray: local (default), auto, or a cluster address")
    p.add_argument(
        "--resources",
        help="with --backend ray: custom Ray resources each cell needs, as JSON, "
        "e.g. '{\"extra\": 1}' (CPUs: the cell's threads)",
    )
    p.add_argument(
        "--max-attempts",
        type=int,
        help="with --backend ray: submissions of a cell when its worker "
        "or node is lost (default 3); each resumes from the last checkpoint the driver holds",
    )
    p.add_argument("--retry-failed", action="store_true", help="also rerun cells that failed before")
    p.add_argument(
        "--cell-timeout",
        type=float,
        metavar="SECONDS",
        help="wall-clock limit per cell (on Ray: from when its task starts on a worker), after which "
        "it is killed and recorded failed (0 = none; default 10x the cost model's estimate, at least "
        "600 s)",
    )
    p.add_argument(
        "--order",
        default="axes",
        choices=list(ORDERS),
        help="which cells run first: axes (default; the grid's order, seed innermost) or seeds (every "
        "setting's seed 0, then seed 1, ...: a long campaign stopped part-way holds every setting at equal "
        "seed counts); the order never changes a cell's bytes",
    )
    p.add_argument(
        "--allow-plugins",
        action="store_true",
        help="run the plug-in remedy files (path.py:Class) named by a grid.yaml taken from a results "
        "directory: a plug-in is code run with your rights",
    )
    p.set_defaults(func=_cmd_run)
