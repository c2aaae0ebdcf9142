"""`timbench compare BASELINE CANDIDATE [--tolerances FILE] [--json]`: a regression gate for TIM.

Compares two grid result directories cell by cell (by cell id), or two alignment tables written by
`timbench align --table` (JSON lists of rows keyed by model_name + condition). Exit 1 when any
regression is found, else 0. The checks, each listed in the verdict with its numbers:

- exact_lost: the baseline entry was bitwise exact (align: max_abs_diff == 0.0; grid: the per-step
  maximum of training/rollout_probs_diff_max == 0.0) and the candidate is not. No tolerance applies.
- mismatch_grew: mean |delta| (align: mean_abs_diff; grid: mean of mismatch/mean_abs_delta) or k3_kl
  grew beyond baseline x (1 + mismatch_rel) + mismatch_abs.
- routing_dropped (align, MoE rows): routing_agreement fell by more than routing_abs.
- collapse_appeared (grid): the candidate cell collapsed and the baseline cell did not.
- accuracy_fell (grid): final accuracy T=1 fell by more than accuracy_abs (absolute).
- missing: an entry of the baseline is absent from the candidate; not_finished (grid): the baseline
  cell is done and the candidate's is not (and did not collapse, which is reported as such).
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path

from ..readfile import read_json, read_yaml
from .summary import summarize_grid


@dataclass(frozen=True)
class Tolerances:
    """How much worse the candidate may be before `timbench compare` calls it a regression."""

    mismatch_rel: float = 0.5
    """Allowed relative growth of mean |delta| and k3_kl (0.5: up to 1.5x the baseline)."""
    mismatch_abs: float = 1e-12
    """Absolute slack added to the mismatch limits, so values at float-noise level (k3_kl ~1e-14) never flap."""
    accuracy_abs: float = 0.05
    """Allowed absolute drop of final accuracy T=1 (grid cells); ~1 standard error of a 256-problem eval."""
    routing_abs: float = 0.01
    """Allowed absolute drop of MoE routing agreement (alignment rows)."""


def load_tolerances(path: str | Path | None) -> Tolerances:
    """Tolerances from a YAML mapping of overrides; unknown keys, non-numbers, NaN or negatives raise."""
    if path is None:
        return Tolerances()
    path = Path(path)
    data = read_yaml(path, "tolerances file") or {}
    valid = [f.name for f in dataclasses.fields(Tolerances)]
    if not isinstance(data, dict):
        raise ValueError(f"tolerances file {path}: expected a mapping with keys {', '.join(valid)}")
    values = {}
    for k, v in data.items():
        if k not in valid:
            raise ValueError(f"tolerances file {path}: unknown key {k!r}; valid: {', '.join(valid)}")
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            raise ValueError(f"tolerances file {path}: {k} must be a finite number >= 0, got {v!r}")
        values[k] = float(v)
    return Tolerances(**values)


def _grew(base, cand, tol: Tolerances) -> tuple[bool, float | None]:
    if base is None or cand is None:
        return False, None
    limit = base * (1 + tol.mismatch_rel) + tol.mismatch_abs
    return (not cand <= limit), limit  # `not <=` also flags a NaN candidate


def _reg(key: str, check: str, metric: str | None, base, cand, limit=None) -> dict:
    return {"id": key, "check": check, "metric": metric, "baseline": base, "candidate": cand, "limit": limit}


def compare_align(base_rows: list[dict], cand_rows: list[dict], tol: Tolerances) -> tuple[int, list[dict]]:
    """(entries compared, regressions) for two `timbench align --table` outputs."""
    def index(rows, where):
        if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
            raise ValueError(f"{where}: expected a JSON list of alignment rows (timbench align --table output)")
        out = {}
        for r in rows:
            if "model_name" not in r or "condition" not in r:
                raise ValueError(f"{where}: alignment row without model_name/condition: {str(r)[:80]}")
            out[f"{r['model_name']} / {r['condition']}"] = r
        return out
    base, cand = index(base_rows, "baseline"), index(cand_rows, "candidate")
    regs = []
    for key, b in base.items():
        c = cand.get(key)
        if c is None:
            regs.append(_reg(key, "missing", None, None, None))
            continue
        if b.get("max_abs_diff") == 0.0 and c.get("max_abs_diff") != 0.0:
            regs.append(_reg(key, "exact_lost", "max_abs_diff", 0.0, c.get("max_abs_diff"), 0.0))
        for metric in ("mean_abs_diff", "k3_kl"):
            grew, limit = _grew(b.get(metric), c.get(metric), tol)
            if grew:
                regs.append(_reg(key, "mismatch_grew", metric, b[metric], c[metric], limit))
        ra, rc = b.get("routing_agreement"), c.get("routing_agreement")
        if ra is not None and (rc is None or not rc >= ra - tol.routing_abs):
            regs.append(_reg(key, "routing_dropped", "routing_agreement", ra, rc, ra - tol.routing_abs))
    return len(base), regs


def compare_grids(base_rows: list[dict], cand_rows: list[dict], tol: Tolerances) -> tuple[int, list[dict]]:
    """(cells compared, regressions) for two grids' summary rows (timbench.report.summary)."""
    cand = {r["id"]: r for r in cand_rows}
    regs = []
    exact_key = "max/training/rollout_probs_diff_max"
    for b in base_rows:
        key, c = b["id"], cand.get(b["id"])
        if b["status"] != "done" and not b["collapse/collapsed"]:
            continue  # nothing finished to compare against
        if c is None:
            regs.append(_reg(key, "missing", None, None, None))
            continue
        if b["collapse/collapsed"] is False and c["collapse/collapsed"]:
            regs.append(_reg(key, "collapse_appeared", "collapse/step", None, c["collapse/step"]))
        elif b["status"] == "done" and c["status"] != "done":
            regs.append(_reg(key, "not_finished", "status", b["status"], c["status"]))
            continue
        if b[exact_key] == 0.0 and c[exact_key] != 0.0:
            regs.append(_reg(key, "exact_lost", exact_key, 0.0, c[exact_key], 0.0))
        for metric in ("mean/mismatch/mean_abs_delta", "mean/rollout_corr/k3_kl"):
            grew, limit = _grew(b[metric], c[metric], tol)
            if grew:
                regs.append(_reg(key, "mismatch_grew", metric, b[metric], c[metric], limit))
        ba, ca = b["final_accuracy_t1"], c["final_accuracy_t1"]
        if ba is not None and (ca is None or not ca >= ba - tol.accuracy_abs):
            regs.append(_reg(key, "accuracy_fell", "final_accuracy_t1", ba, ca, ba - tol.accuracy_abs))
    return len(base_rows), regs


def _kind(path: Path) -> str:
    if path.is_dir():
        return "grid"
    if path.is_file():
        return "align"
    raise FileNotFoundError(f"{path}: no such grid directory or alignment JSON file")


def compare(baseline: str | Path, candidate: str | Path, tol: Tolerances = Tolerances()) -> dict:
    """The verdict: {verdict: pass|fail, kind, baseline, candidate, tolerances, compared, regressions}."""
    b, c = Path(baseline), Path(candidate)
    kind = _kind(b)
    if _kind(c) != kind:
        what = {"grid": "grid result dir", "align": "align table JSON file"}
        raise ValueError(f"cannot compare {what[kind]} {b} with {what[_kind(c)]} {c}; give two grid "
                         "result dirs or two align table JSON files")
    if kind == "grid":
        n, regs = compare_grids(summarize_grid(b), summarize_grid(c), tol)
    else:
        n, regs = compare_align(read_json(b), read_json(c), tol)
    return {"verdict": "fail" if regs else "pass", "kind": kind, "baseline": str(b), "candidate": str(c),
            "tolerances": dataclasses.asdict(tol), "compared": n, "regressions": regs}


def format_verdict(v: dict) -> str:
    lines = []
    for r in v["regressions"]:
        nums = "" if r["metric"] is None else f" {r['metric']}: {r['baseline']} -> {r['candidate']}"
        lim = "" if r["limit"] is None else f" (limit {r['limit']:.6g})"
        lines.append(f"REGRESSION {r['check']}: {r['id']}{nums}{lim}")
    lines.append(f"compare ({v['kind']}): {v['compared']} entries, {len(v['regressions'])} regressions: "
                 f"{v['verdict'].upper()}")
    return "\n".join(lines)
