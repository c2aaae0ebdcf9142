"""Did a rerun at newer code train the same bits? Compares the cells two grid result dirs share.

    python bench/same_metrics.py OLD_DIR NEW_DIR

`timbench compare --bytes` needs byte-identical files; a newer loop that logs more metrics (e.g. the tim/*
family added after results/paper was made) changes every metrics.jsonl while training exactly the same
bits. This check is the weaker, still exact, statement: for every cell id finished in both dirs,
eval.jsonl is byte-identical and every metrics.jsonl row holds, for every key the OLD row has, the same
JSON value (floats parse exactly: the files hold repr(), which round-trips). It prints one line per
differing cell and a total, and exits 1 when any shared cell differs (or none is shared).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from timbench.report.results import load_results  # noqa: E402

def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def differs(old: Path, new: Path) -> str | None:
    """Why cell run dir `new` did not reproduce `old`, or None."""
    if (old / "eval.jsonl").read_bytes() != (new / "eval.jsonl").read_bytes():
        return "eval.jsonl differs"
    a, b = rows(old / "metrics.jsonl"), rows(new / "metrics.jsonl")
    if len(a) != len(b):
        return f"{len(a)} vs {len(b)} metrics rows"
    for x, y in zip(a, b):
        for k, v in x.items():
            if y.get(k, object()) != v:
                return f"step {x.get('step')}: {k} {v!r} vs {y.get(k)!r}"
    return None


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.split("\n\n")[1].strip(), file=sys.stderr)
        return 2
    old, new = (load_results(p) for p in argv)
    done = {c.id for c in new.cells if c.status == "done"}
    shared = [c.id for c in old.cells if c.status == "done" and c.id in done]
    bad = 0
    new_keys: set[str] = set()
    for cid in shared:
        o, n = old.path / "runs" / cid, new.path / "runs" / cid
        why = differs(o, n)
        if why:
            bad += 1
            print(f"{cid}: {why}")
        new_keys |= set(rows(n / "metrics.jsonl")[0]) - set(rows(o / "metrics.jsonl")[0])
    print(f"{len(shared) - bad}/{len(shared)} shared cells trained the same bits (eval.jsonl byte-identical, "
          f"every metric of the older run equal); the newer runs log {len(new_keys)} more keys"
          + (f" ({', '.join(sorted(new_keys)[:4])}{', ...' if len(new_keys) > 4 else ''})" if new_keys else ""))
    return 0 if shared and not bad else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
