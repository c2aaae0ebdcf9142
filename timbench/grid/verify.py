"""`timbench grid verify DIR [--adopt]`: every integrity problem of a grid result dir, one line each.

Checks each done cell's run files against its manifest.json and the report's files against the grid dir's
own manifest.json (written last by `grid report`, so a report killed half-way shows as two generations).
`--adopt` stamps results made before manifests, once: a done cell whose run finished (summary.json says so)
and has no manifest yet, and a report without one. It never re-stamps a file that differs from an existing
manifest: that is damage to redo (`timbench grid run`), not to bless.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from .. import manifest

REPORT_FILES = ("leaderboard.md", "leaderboard.html", "summary.csv", "seeds.csv")
"""The report's fixed files; its figures/*.png are listed in the report manifest as written."""


def report_files(out: Path) -> list[str]:
    return [n for n in REPORT_FILES if (out / n).is_file()] + \
        sorted(p.relative_to(out).as_posix() for p in (out / "figures").glob("*.png"))


def verify(out: str | Path, adopt: bool = False) -> tuple[list[str], int]:
    """(problems, stamped): one line per problem left; how many manifests `adopt` wrote."""
    from .layout import load_cells, read_status, run_dir  # imported here: `timbench --help` stays torch-free
    out = Path(out)
    doc = load_cells(out)
    cells = doc.get("cells") if isinstance(doc, dict) else None
    if not isinstance(cells, list):
        raise ValueError(f"{out / 'cells.json'}: expected an object with a 'cells' list")
    found, stamped = [], 0
    for c in cells:
        cid = c["id"]
        if (read_status(out, cid) or {}).get("status") != "done":
            continue
        d = run_dir(out, cid)
        if adopt and manifest.missing(d) and _run_ended(d):
            manifest.stamp_run(d)
            stamped += 1
        found += [f"cell {cid}: {line}" for line in manifest.problems(d)]
    if any((out / n).is_file() for n in REPORT_FILES):
        if adopt and manifest.missing(out):
            manifest.stamp(out, report_files(out))
            stamped += 1
        found += [f"report: {line}" for line in manifest.problems(out)]
    return found, stamped


def _run_ended(d: Path) -> bool:
    try:
        return json.loads((d / "summary.json").read_text()).get("status") in ("finished", "failed")
    except (OSError, json.JSONDecodeError):
        return False


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
    p.add_argument("--adopt", action="store_true",
                   help="stamp results made before manifests (finished runs and reports without one), once")
    p.set_defaults(func=_cmd_verify)
