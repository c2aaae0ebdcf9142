"""The report commands: `timbench grid report DIR` and `timbench compare BASELINE CANDIDATE`.

    timbench grid report results/NAME [--out build/NAME]
    timbench compare BASELINE CANDIDATE [--tolerances FILE] [--json] [--bytes]

The studies' commands (`timbench paper`, `claims`, `early-warning`, `proxy-fidelity`) are timbench.studies.cli.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

from ..util.atomic import check_output_dir
from ..util.dirlock import DirLock
from .tolerances import Tolerances


def _cmd_report(args) -> int:
    from .leaderboard import write_report  # deferred: torch is heavy

    d = args.dir.rstrip("/")
    if not Path(d).is_dir():  # before the lock below, which would create it
        raise FileNotFoundError(f"{d}: not a directory (expected a grid result dir with cells.json)")
    default = default_out(d, d)
    out = (args.out or default).rstrip("/")
    if (Path(out) / "cells.json").is_file() and Path(out).resolve() != Path(d).resolve():
        raise ValueError(
            f"--out {out} is another grid's result dir (it holds cells.json); a report goes into its "
            f"own grid's dir ({d}) or a directory of no grid"
        )
    check_output_dir(out)  # a read-only grid dir is one line now, not after the figures are drawn
    # grid.yaml in the result dir is the resolved spec, so the grid reruns from the dir alone; the report line
    # names --out only where it is not the default, so it regenerates exactly these files.
    command = f"timbench grid run {d}/grid.yaml --out {d} && timbench grid report {d}"
    with DirLock(out, "timbench grid report"):  # one writer per directory: a grid run or another report waits
        written = write_report(d, command=command + (f" --out {out}" if out != default else ""), out=out)
    for p in written.values():
        print(p)
    print(f"timbench grid report: wrote {len(written)} files into {out}", file=sys.stderr)
    return 0


def add_report_parser(subparsers, name: str = "report") -> None:
    """Register `report DIR` on the `timbench grid` subparsers (or under another name, e.g. grid-report)."""
    p = subparsers.add_parser(name, help="leaderboard.md/.html, summary.csv and figures for a grid result dir")
    p.add_argument("dir", help="grid result directory (results/NAME, holding cells.json and runs/)")
    p.add_argument(
        "--out",
        help="where the report files go (default: results/X -> build/X, else DIR itself; "
        "give --out results/X to update the committed report)",
    )
    p.set_defaults(func=_cmd_report)


def default_out(source: str, fallback: str) -> str:
    """Where a regeneration from `source` writes by default: `results/X` -> `build/X` (committed results change
    only when told `--out results/...`), anything else into `source` itself (e.g. build/paper from make paper)."""
    parts = source.rstrip("/").split("/")
    if "results" in parts:
        rest = parts[parts.index("results") + 1 :]
        return "/".join(["build", *rest]) if rest else fallback
    return source.rstrip("/")


def _cmd_compare(args) -> int:
    from .compare import compare, format_verdict, load_tolerances  # deferred: torch is heavy

    verdict = compare(args.baseline, args.candidate, load_tolerances(args.tolerances), require_bytes=args.bytes)
    print(json.dumps(verdict, sort_keys=True, allow_nan=True) if args.json else format_verdict(verdict))
    return 1 if verdict["regressions"] else 0


def add_compare_parser(sub) -> None:
    """Register `compare` on the top-level `timbench` subparsers."""
    p = sub.add_parser(
        "compare",
        help="regression gate: compare two grid result dirs or two align tables; "
        "exit 1 on any regression, 2 when they cannot be compared",
    )
    p.add_argument("baseline", help="baseline grid dir (results/NAME) or align table JSON")
    p.add_argument("candidate", help="candidate of the same kind")
    p.add_argument(
        "--tolerances",
        help=f"YAML overrides of the default tolerances ({', '.join(f.name for f in dataclasses.fields(Tolerances))})",
    )
    p.add_argument("--json", action="store_true", help="print the machine-readable verdict")
    p.add_argument(
        "--bytes",
        action="store_true",
        help="grids: a bitwise-deterministic cell whose metrics.jsonl/eval.jsonl changed is a regression",
    )
    p.set_defaults(func=_cmd_compare)
