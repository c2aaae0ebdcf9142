"""The report commands: `timbench grid report DIR` and `timbench compare BASELINE CANDIDATE`.

    timbench grid report results/NAME
    timbench compare BASELINE CANDIDATE [--tolerances FILE] [--json] [--bytes]
"""

from __future__ import annotations

import dataclasses
import json
import sys


def _cmd_report(args) -> int:
    from .leaderboard import write_report
    # grid.yaml in the result dir is the resolved spec, so the grid reruns from the dir alone
    d = args.dir.rstrip("/")
    written = write_report(d, command=f"timbench grid run {d}/grid.yaml --out {d} && timbench grid report {d}")
    for p in written.values():
        print(p)
    print(f"timbench grid report: wrote {len(written)} files into {args.dir}", file=sys.stderr)
    return 0


def add_report_parser(subparsers, name: str = "report") -> None:
    """Register `report DIR` on the `timbench grid` subparsers (or under another name, e.g. grid-report)."""
    p = subparsers.add_parser(name, help="leaderboard.md/.html, summary.csv and figures for a grid result dir")
    p.add_argument("dir", help="grid result directory (results/NAME, holding cells.json and runs/)")
    p.set_defaults(func=_cmd_report)


def _cmd_compare(args) -> int:
    from .compare import compare, format_verdict, load_tolerances
    verdict = compare(args.baseline, args.candidate, load_tolerances(args.tolerances), require_bytes=args.bytes)
    print(json.dumps(verdict, sort_keys=True, allow_nan=True) if args.json else format_verdict(verdict))
    return 1 if verdict["regressions"] else 0


def add_compare_parser(sub) -> None:
    """Register `compare` on the top-level `timbench` subparsers."""
    from .compare import Tolerances
    p = sub.add_parser("compare", help="regression gate: compare two grid result dirs or two align tables; "
                                       "exit 1 on any regression, 2 when they cannot be compared")
    p.add_argument("baseline", help="baseline grid dir (results/NAME) or align table JSON")
    p.add_argument("candidate", help="candidate of the same kind")
    p.add_argument("--tolerances", help="YAML overrides of the default tolerances "
                                        f"({', '.join(f.name for f in dataclasses.fields(Tolerances))})")
    p.add_argument("--json", action="store_true", help="print the machine-readable verdict")
    p.add_argument("--bytes", action="store_true",
                   help="grids: a bitwise-deterministic cell whose metrics.jsonl/eval.jsonl changed is a regression")
    p.set_defaults(func=_cmd_compare)
