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

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from timbench.report.results import CellRun, load_results  # noqa: E402


def differs(old: CellRun, new: CellRun, old_dir: Path, new_dir: Path) -> str | None:
    """Why cell `new` (its metrics as load_results read them) did not reproduce `old`, or None."""
    if (old_dir / "eval.jsonl").read_bytes() != (new_dir / "eval.jsonl").read_bytes():
        return "eval.jsonl differs"
    a, b = old.metrics, new.metrics
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
    done = {c.id: c for c in new.cells if c.status == "done"}
    shared = [(c, done[c.id]) for c in old.cells if c.status == "done" and c.id in done]
    bad = 0
    new_keys: set[str] = set()
    for o, n in shared:
        why = differs(o, n, old.path / "runs" / o.id, new.path / "runs" / n.id)
        if why:
            bad += 1
            print(f"{o.id}: {why}")
        new_keys |= set(n.metrics[0] if n.metrics else ()) - set(o.metrics[0] if o.metrics else ())
    print(
        f"{len(shared) - bad}/{len(shared)} shared cells trained the same bits (eval.jsonl byte-identical, "
        f"every metric of the older run equal); the newer runs log {len(new_keys)} more keys"
        + (f" ({', '.join(sorted(new_keys)[:4])}{', ...' if len(new_keys) > 4 else ''})" if new_keys else "")
    )
    return 0 if shared and not bad else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
