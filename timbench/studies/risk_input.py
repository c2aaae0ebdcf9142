"""The measured mismatch `timbench risk` maps: `--stat NAME=VALUE` numbers or a `timbench align` table.

Each reader returns a list of (label, {statistic: value}) queries with the statistic names of risk_data.STATS, or
raises a one-line ValueError / FileNotFoundError naming what is wrong and what is valid:

- numbers: NAME must be a statistic of STATS, VALUE a finite number >= 0;
- an align table: the JSON `timbench align --table` writes (a list of rows) or `timbench align --json` prints (one
  row); each row's mean_abs_diff, p99_abs_diff, k3_kl and kl map to FILE_STATS; rows with zero mismatch are
  left out (nothing to map);
- a gate run's gate.json: read by timbench.gate.placement.from_gate (the gate sits above the studies), into the
  same queries through `_align_query`.
"""

from __future__ import annotations

import math
from pathlib import Path

from ..util import manifest
from ..util.readfile import read_json
from .risk_data import DOSE, STATS

FILE_STATS = ("mean_abs_delta", "p99_abs_delta", "k3_kl", "k1_kl")
"""What an align/gate row is mapped by: per-token means and a quantile. Its max |delta| and largest probability
difference grow with the number of tokens the workload has, and frac_tokens_differ is ~1 for any inexact engine,
so they would measure the workload, not the mismatch."""

ALIGN_KEYS = {s.align: name for name, s in STATS.items() if s.align and name in FILE_STATS}
"""align row key -> statistic name, for the per-token statistics a file's row is mapped by."""


def parse_number(name: str, raw) -> float:
    STATS.lookup(name)
    try:
        v = float(raw)
    except (TypeError, ValueError):
        raise ValueError(f"statistic {name}: {raw!r} is not a number") from None
    if not math.isfinite(v) or v < 0:
        raise ValueError(f"statistic {name}: {raw!r} must be a finite number >= 0")
    return v


def from_numbers(pairs: list[str], mean_abs_delta: float | None = None) -> list[tuple[str, dict]]:
    """`--mean-abs-delta X` and `--stat NAME=VALUE` (repeatable) as one query."""
    q = {}
    if mean_abs_delta is not None:
        q[DOSE] = parse_number(DOSE, mean_abs_delta)
    for p in pairs:
        name, sep, raw = p.partition("=")
        if not sep:
            raise ValueError(f"--stat {p!r}: expected NAME=VALUE, e.g. k3_kl=0.002; NAME one of {', '.join(STATS)}")
        name = name.strip()
        if name in q:
            raise ValueError(f"statistic {name} given twice; give it once")
        q[name] = parse_number(name, raw.strip())
    label = ", ".join(f"{k}={v:.4g}" for k, v in q.items())
    return [(label, q)]


def _align_query(row: dict, where: str) -> dict:
    if "mean_abs_diff" not in row:
        raise ValueError(f"{where}: a row without mean_abs_diff; is it a `timbench align` table?")
    q = {DOSE: parse_number(DOSE, row["mean_abs_diff"])}
    for k, name in ALIGN_KEYS.items():  # the K1 estimate is a signed mean: a small negative one maps nothing
        v = row.get(k)
        if name != DOSE and isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0:
            q[name] = float(v)
    return q


def from_align(path: str | Path, row: str | None = None) -> list[tuple[str, dict]]:
    """The rows of an align table (JSON), or those whose label contains `row`; zero-mismatch rows are skipped."""
    p = Path(path)
    if p.suffix == ".md":
        raise ValueError(f"{p}: the Markdown table; pass the JSON next to it ({p.with_suffix('.json')})")
    manifest.refuse_changed(p.parent, [p.name], "align table")
    doc = read_json(p, "align table")
    rows = [doc] if isinstance(doc, dict) else doc
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise ValueError(f"{p}: not an align table (expected the JSON list of rows `timbench align --table` writes)")
    out = []
    for i, r in enumerate(rows):
        lab = f"{r.get('model_name') or r.get('model') or 'model'}: {r.get('condition') or r.get('engine') or i}"
        if row and row not in lab:
            continue
        q = _align_query(r, f"{p} row {i}")
        if q[DOSE] > 0:
            out.append((lab, q))
    if not out:
        what = f" matching --row {row!r}" if row else ""
        raise ValueError(f"{p}: no row{what} with a nonzero mean_abs_diff (zero mismatch needs no map)")
    return out
