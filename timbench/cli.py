"""The `timbench` command: one subcommand per job, each a thin layer over the library."""

from __future__ import annotations

import argparse
import json
import sys

from .spec import SpecError


def _cmd_align(args) -> int:
    if args.table:
        from .align_table import run_table
        from .atomic import check_output_dir
        check_output_dir(args.out or "results/align")
        run_table(args.table, args.out or "results/align", progress=lambda m: print(m, file=sys.stderr))
        return 0
    from .align import align
    from .model import load_model
    from .spec import parse_spec
    engine = parse_spec(args.engine, "engine spec", side="engine")
    trainer = parse_spec(args.trainer, "trainer spec", side="trainer")
    model = load_model(args.model, seed=args.seed)
    report = align(model, engine, trainer, seed=args.seed, temperature=args.temperature)
    if args.json:
        print(json.dumps(report, sort_keys=True))
    else:
        for k, v in report.items():
            print(f"{k:20s} {v}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="timbench", description="Training-inference mismatch benchmark suite")
    sub = p.add_subparsers(dest="command", required=True)

    a = sub.add_parser("align", help="measure engine vs trainer logprob mismatch on a mixed workload")
    a.add_argument("--model", default="tiny-dense", help="preset (tiny-dense, tiny-moe) or checkpoint directory")
    a.add_argument("--engine", default="kernels=exact", help="engine spec, e.g. kernels=torch,dtype=bf16")
    a.add_argument("--trainer", default="kernels=exact", help="trainer spec")
    a.add_argument("--seed", type=int, default=0)
    a.add_argument("--temperature", type=float, default=1.0)
    a.add_argument("--json", action="store_true", help="print one JSON object")
    a.add_argument("--table", help="YAML table of conditions (e.g. bench/align_quick.yaml) to run instead")
    a.add_argument("--out", help="with --table: output directory (default results/align)")
    a.set_defaults(func=_cmd_align)

    from .diagnose.cli import add_parser as add_diagnose
    add_diagnose(sub)
    from .warmstart import add_parser as add_warmstart
    add_warmstart(sub)
    from .rl.cli import add_parser as add_train
    add_train(sub)
    from .remedies.cli import add_parser as add_remedies
    add_remedies(sub)
    from .report.cli import add_compare_parser, add_report_parser
    add_compare_parser(sub)
    from .grid.cli import add_parser as add_grid
    from .runners.cli import add_run_parser
    grid_sub = add_grid(sub)  # plan; run and report join from their own packages
    add_run_parser(grid_sub)
    add_report_parser(grid_sub)

    from .report.paper import add_parser as add_paper  # `timbench paper DIR` (issue 16)
    add_paper(sub)

    from .submit.cli import add_parser as add_submit  # `timbench submit` and `timbench track` (issue 15)
    add_submit(sub)

    from .fingerprint import add_parser as add_fingerprint  # cross-machine golden hashes (issue 23)
    add_fingerprint(sub)

    try:
        from .tasks.cli import add_parser as add_tasks
        add_tasks(sub)
    except ImportError:  # tasks package not installed alongside (should not happen in a full install)
        pass
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args) or 0
    except (SpecError, ValueError, FileNotFoundError, KeyError) as e:
        msg = e.args[0] if isinstance(e, KeyError) and e.args else e
        print(f"timbench {args.command}: error: {msg}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
