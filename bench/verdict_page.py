"""What the grid verdict scripts (bench/*_verdict.py) share: intervals as JSON, and the command that writes
DIR/verdict.json and DIR/verdict.md atomically, with bad input as one line and exit 2."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path

from timbench.report.leaderboard import fmt_interval
from timbench.report.stats import Interval
from timbench.util.atomic import atomic_write


def iv_json(iv: Interval) -> dict:
    return {"mean": iv.mean, "lo": iv.lo, "hi": iv.hi, "n": iv.n}


def fmt_json(iv: dict) -> str:
    return fmt_interval(Interval(iv["mean"], iv["lo"], iv["hi"], iv["n"]))


def main(
    argv: list[str],
    script: str,
    verdicts: Callable[..., dict],
    markdown: Callable[[dict, str], str],
    args: tuple[str, ...] = ("RESULTS_DIR",),
) -> int:
    """`python bench/SCRIPT ARGS...` (one results dir unless `args` names more; the page goes into the last):
    write and print the page; 2 with one line on bad input."""
    if len(argv) != len(args):
        print(f"usage: python bench/{script} {' '.join(args)}", file=sys.stderr)
        return 2
    try:
        v = verdicts(*argv)
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    out = Path(argv[-1])
    atomic_write(out / "verdict.json", json.dumps(v, indent=1, sort_keys=True) + "\n")
    atomic_write(out / "verdict.md", markdown(v, argv[-1]))
    print((out / "verdict.md").read_text(), end="")
    return 0
