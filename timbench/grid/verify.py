"""`timbench grid verify DIR [--adopt]`: every integrity problem of a grid result dir, one line each.

Checks each done cell's run files against its manifest.json (and the cell it is bound to, and its summary.json
against its logs), and cells.json and the report's files against the grid dir's own manifest.json (cells.json
added by `grid run`, the report's written last by `grid report`, so a report killed half-way shows as two
generations).
`--adopt` stamps results made before manifests, once: a done cell with no manifest yet whose run finished whole
(its logs and summary there and non-empty, summary.json saying finished, one metrics row per configured step; any
other is listed as not adopted), and a report without one. It never re-stamps a file that differs from an
existing manifest: that is damage to redo (`timbench grid run`), not to bless.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ..metrics import log_summary
from ..util import manifest

REPORT_FILES = ("leaderboard.md", "leaderboard.html", "summary.csv", "seeds.csv")
"""The report's fixed files; its figures/*.png are listed in the report manifest as written."""


def report_files(out: Path) -> list[str]:
    return [n for n in REPORT_FILES if (out / n).is_file()] + sorted(
        p.relative_to(out).as_posix() for p in (out / "figures").glob("*.png")
    )


def verify(out: str | Path, adopt: bool = False) -> tuple[list[str], int]:
    """(problems, stamped): one line per problem left; how many manifests `adopt` wrote."""
    from .layout import (  # deferred: torch is heavy (--help stays torch-free)
        cell_binding,
        done_problems,
        load_cells,
        read_status,
        run_dir,
    )

    out = Path(out)
    cells = load_cells(out)["cells"]
    found, stamped = [], 0
    for c in cells:
        cid = c["id"]
        if (read_status(out, cid) or {}).get("status") != "done":
            continue
        d = run_dir(out, cid)
        if adopt and manifest.missing(d):
            refusal = _refusal(d, c) or next(iter(log_summary.differences(d)), None)
            if refusal:
                found.append(f"cell {cid}: not adopted: {refusal}")
                continue
            manifest.stamp_run(d)
            manifest.bind(d, cell_binding(c))
            stamped += 1
        found += [f"cell {cid}: {line}" for line in done_problems(d, c)]
    if any((out / n).is_file() for n in REPORT_FILES) or not manifest.missing(out):
        if adopt and manifest.missing(out):
            manifest.stamp(out, report_files(out) + ["cells.json"])
            stamped += 1
        found += [f"{'grid' if 'cells.json' in line else 'report'}: {line}" for line in manifest.problems(out)]
    return found, stamped


def _refusal(d: Path, cell: dict) -> str | None:
    """Why `--adopt` must not stamp run dir `d` of `cell` (None: it holds a whole finished run): its logs and summary
    there, non-empty, summary.json saying finished, and as many metrics rows as the cell's config has steps."""
    empty = [n for n in manifest.REQUIRED_RUN_FILES if not (d / n).is_file() or (d / n).stat().st_size == 0]
    if empty:
        return f"{', '.join(empty)} missing or empty in {d}"
    try:
        summary = json.loads((d / "summary.json").read_text())
        rows = (d / "metrics.jsonl").read_text().splitlines()
    except (OSError, ValueError) as e:
        return f"{d}: unreadable ({type(e).__name__})"
    if not isinstance(summary, dict) or summary.get("status") != "finished":
        return f"{d / 'summary.json'}: the run did not finish"
    steps = (cell.get("config") or {}).get("steps")
    if isinstance(steps, int) and (len(rows) != steps or summary.get("steps_done") != steps):
        return f"{d}: {len(rows)} metrics rows, summary steps_done {summary.get('steps_done')}, config steps {steps}"
    return None


def _cmd_verify(args) -> int:
    found, stamped = verify(args.dir, adopt=args.adopt)
    for line in found:
        print(line)
    if stamped:
        print(f"timbench grid verify: stamped {stamped} manifest(s) in {args.dir}", file=sys.stderr)
    print(f"timbench grid verify: {len(found)} problem(s) in {args.dir}", file=sys.stderr)
    return 1 if found else 0


def add_verify_parser(grid_sub) -> None:
    p = grid_sub.add_parser("verify", help="check every done cell and the report against their integrity manifests")
    p.add_argument("dir", help="grid result directory (holding cells.json and runs/)")
    p.add_argument(
        "--adopt",
        action="store_true",
        help="stamp results made before manifests (finished runs and reports without one), once",
    )
    p.set_defaults(func=_cmd_verify)
