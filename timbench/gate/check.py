"""`timbench gate check BASELINE CANDIDATE`: the regressions of a candidate's gate.json against a baseline's.

Exit codes: 0 no regression, 1 regressions (each named with both sides' numbers and the rule), 2 the two
are not comparable (another suite or suite version, a candidate with no probes or without some of the
baseline's) or a file is not a gate.json. Exact probes compare verdicts; the alignment probe's
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
        doc = json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{p}: not a gate.json ({e.msg} at line {e.lineno})") from None
    return doc


def load_checkable(path) -> dict:
    """load_report, then check_shape: what `gate check` compares."""
    doc = load_report(path)
    p = Path(path)
    check_shape(doc, p / "gate.json" if p.is_dir() else p)
    return doc


def check_shape(doc, p: Path) -> None:
    """A one-line ValueError naming the first thing `check` needs that `doc` lacks (never a bare KeyError)."""
    shape = ('expected {"identity": {"suite", "suite_version", ...}, "probes": [{"model", "probe", "passed", '
             '"numbers"}, ...]}')
    if not isinstance(doc, dict):
        raise ValueError(f"{p}: not a gate.json (a JSON {type(doc).__name__}); {shape}")
    ident = doc.get("identity")
    if not isinstance(ident, dict) or any(k not in ident for k in ("suite", "suite_version")):
        raise ValueError(f"{p}: not a gate.json (no identity with suite and suite_version); {shape}")
    probes = doc.get("probes")
    if not isinstance(probes, list):
        raise ValueError(f"{p}: not a gate.json (no probes list); {shape}")
    for i, r in enumerate(probes):
        if not isinstance(r, dict) or any(k not in r for k in ("model", "probe", "passed", "numbers")) \
                or not isinstance(r["numbers"], dict):
            raise ValueError(f"{p}: probes[{i}] lacks model, probe, passed or numbers; {shape}")


def check(base: dict, cand: dict) -> tuple[int, list[str]]:
    """(exit code, one line per regression or the reason they are incomparable)."""
    bi, ci = base["identity"], cand["identity"]
    if (bi["suite"], bi["suite_version"]) != (ci["suite"], ci["suite_version"]):
        return 2, [f"incomparable: baseline is suite {bi['suite']} v{bi['suite_version']}, candidate is "
                   f"{ci['suite']} v{ci['suite_version']}"]
    old = {(r["model"], r["probe"]): r for r in base["probes"]}
    have = {(r["model"], r["probe"]) for r in cand["probes"]}
    if not have:
        return 2, ["incomparable: the candidate ran no probes (an empty gate.json passes nothing)"]
    lacking = sorted(set(old) - have)
    if lacking:  # a partial candidate: what it skipped cannot pass by being absent
        return 2, [f"incomparable: the candidate lacks {len(lacking)} of the baseline's probes, e.g. "
                   f"{lacking[0][0]} {lacking[0][1]}; run the whole suite"]
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
