"""`timbench gate check BASELINE CANDIDATE`: the regressions of a candidate's gate.json against a baseline's.

Exit codes: 0 no regression, 1 regressions (each named with both sides' numbers and the rule), 2 the two
are not comparable (another suite or suite version). Exact probes compare verdicts; the alignment probe's
mean |delta| also regresses when it grows past 1.5x the baseline's (plus 1e-12, so an exact 0.0 baseline
flags any nonzero value).
"""

from __future__ import annotations

import json
from pathlib import Path

GROWTH = 1.5


def load_report(path) -> dict:
    p = Path(path)
    p = p / "gate.json" if p.is_dir() else p
    if not p.is_file():
        raise FileNotFoundError(f"{p}: no gate.json (run `timbench gate run ... --out DIR` first)")
    try:
        return json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{p}: not a gate.json ({e.msg} at line {e.lineno})") from None


def check(base: dict, cand: dict) -> tuple[int, list[str]]:
    """(exit code, one line per regression or the reason they are incomparable)."""
    bi, ci = base["identity"], cand["identity"]
    if (bi["suite"], bi["suite_version"]) != (ci["suite"], ci["suite_version"]):
        return 2, [f"incomparable: baseline is suite {bi['suite']} v{bi['suite_version']}, candidate is "
                   f"{ci['suite']} v{ci['suite_version']}"]
    old = {(r["model"], r["probe"]): r for r in base["probes"]}
    lines = []
    for r in cand["probes"]:
        b = old.get((r["model"], r["probe"]))
        if b is None:
            continue
        where = f"{r['model']} {r['probe']}"
        if b["passed"] and not r["passed"]:
            lines.append(f"regression: {where} passed in the baseline and fails now: {b['numbers']} -> {r['numbers']}")
        elif r["probe"] == "alignment":
            was, now = b["numbers"]["mean_abs_diff"], r["numbers"]["mean_abs_diff"]
            if now > GROWTH * was + 1e-12:
                lines.append(f"regression: {where} mean_abs_diff {was:.3g} -> {now:.3g} (rule: <= {GROWTH}x "
                             "baseline + 1e-12)")
    return (1 if lines else 0), lines
