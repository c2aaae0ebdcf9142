"""`timbench compare BASELINE CANDIDATE [--tolerances FILE] [--json]`: a regression gate for TIM.

Compares two grid result directories of the same experiment, or two alignment tables written by
`timbench align --table` (JSON lists of rows keyed by model_name + condition). Exit 1 when any
regression is found, 0 when none, 2 (one line) when the two cannot be compared: grids whose name,
reference condition, collapse rule, cell set or any cell's config differ are different experiments,
and comparing them would report differences that are not regressions.

Exact entries are checked exactly, everything else by intervals (timbench.report.stats):

- exact_lost: the baseline entry was bitwise exact and the candidate is not, no tolerance. Align:
  max_abs_diff == 0.0; grid, per cell: the per-step maximum of training/rollout_probs_diff_max, and
  any mean mismatch (mean |delta|, k3_kl) that is exactly 0.0 in the baseline must stay 0.0.
- Grid cells are judged per seed group (cells that differ only by seed). With >= 2 seeds on both
  sides, a regression is a change outside the combined 95% interval:
  accuracy_fell: the interval of (candidate - baseline) mean final accuracy lies below 0 (t intervals
  combined in quadrature); collapse_appeared: Newcombe's interval of the collapse-rate difference
  lies above 0; mismatch_grew: the interval of the mean |delta| or k3_kl difference lies above 0 AND
  the candidate exceeds baseline x (1 + mismatch_rel) + mismatch_abs (mismatch is near-deterministic,
  so its interval can be tiny; the tolerance keeps float-noise-level changes from flapping).
  With one seed (single runs) the explicit tolerances decide: final accuracy fell by more than
  accuracy_abs, a cell collapsed that did not, mismatch grew beyond the same limit as above.
  Every grid regression lists both sides' intervals.
- mismatch_grew / routing_dropped (align rows): mean_abs_diff or k3_kl beyond the limit above;
  routing_agreement fell by more than routing_abs.
- missing (align): a row of the baseline is absent from the candidate; not_finished (grid): the
  baseline cell finished and the candidate's did not.
- bytes (grid): every cell whose run is bitwise deterministic on any CPU (exact kernels on both sides,
  timbench's own engine; `kernels=torch` and vLLM pick code paths per CPU) has its metrics.jsonl and
  eval.jsonl compared byte for byte. Reported always; with `require_bytes=True` (`--bytes`) a cell
  whose bytes changed is a regression, bytes_changed: the same code and config must give the same
  bytes on any x86-64 CPU and thread count (docs/internals/determinism.md).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from ..grid.layout import experiment_difference, load_cells, run_dir
from ..metrics.schema import MAX_PROBS_DIFF_MAX, MEAN_K3_KL, MEAN_MEAN_ABS_DELTA
from ..util.readfile import read_json
from .seeds import GROUP, SeedGroup, is_finished, seed_groups
from .stats import Interval, difference_interval, mean_interval, proportion_difference
from .summary import summarize_grid
from .tolerances import Tolerances, load_tolerances  # noqa: F401  (part of compare's API)


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


def _iv(iv: Interval) -> list | None:
    return None if iv.mean is None else [iv.mean, iv.lo, iv.hi, iv.n]


def _group_reg(gid: str, check: str, metric: str, b: Interval, c: Interval, limit=None, diff: Interval | None = None):
    reg = _reg(gid, check, metric, b.mean, c.mean, limit)
    reg.update(
        {
            "baseline_interval": _iv(b),
            "candidate_interval": _iv(c),
            "difference_interval": None if diff is None else _iv(diff),
        }
    )
    return reg


EXACT_KEY = MAX_PROBS_DIFF_MAX
MISMATCH = {"mean_abs_delta": MEAN_MEAN_ABS_DELTA, "k3_kl": MEAN_K3_KL}


def _cell_checks(b: dict, c: dict) -> list[dict]:
    """The exact checks of one cell pair: finished stays finished, 0.0 stays 0.0."""
    regs, key = [], b["id"]
    if is_finished(b) and not is_finished(c):
        return [_reg(key, "not_finished", "status", b["status"], c["status"])]
    if not is_finished(b):
        return []
    for metric in (EXACT_KEY, *MISMATCH.values()):
        if b[metric] == 0.0 and c[metric] != 0.0:
            regs.append(_reg(key, "exact_lost", metric, 0.0, c[metric], 0.0))
    return regs


def _group_checks(b: SeedGroup, c: SeedGroup, tol: Tolerances) -> list[dict]:
    gid = ".".join(b.key[k] for k in GROUP)
    regs = []
    if not b.seeds or not c.seeds:
        return regs
    by_seeds = b.seeds >= 2 and c.seeds >= 2
    # accuracy
    ba, ca = b.final_accuracy, c.final_accuracy
    if by_seeds:  # the raw t intervals: the shown ones are clipped to [0, 1], which would narrow the test
        ba, ca = (
            mean_interval(
                [r["final_accuracy_t1"] for r in g.rows if is_finished(r) and r["final_accuracy_t1"] is not None]
            )
            for g in (b, c)
        )
    if ba.mean is not None:
        if by_seeds:
            d = difference_interval(ba, ca)
            if d.hi is not None and d.hi < 0:
                regs.append(_group_reg(gid, "accuracy_fell", "final_accuracy_t1", ba, ca, 0.0, d))
        elif ca.mean is None or not ca.mean >= ba.mean - tol.accuracy_abs:
            regs.append(_group_reg(gid, "accuracy_fell", "final_accuracy_t1", ba, ca, ba.mean - tol.accuracy_abs))
    # collapses
    if by_seeds:
        d = proportion_difference(b.collapses, b.seeds, c.collapses, c.seeds)
        if d.lo > 0:
            regs.append(_group_reg(gid, "collapse_appeared", "collapse_rate", b.collapse_rate, c.collapse_rate, 0.0, d))
    elif c.collapses > b.collapses:
        regs.append(_group_reg(gid, "collapse_appeared", "collapse_rate", b.collapse_rate, c.collapse_rate))
    # mismatch (exact zeros are the cells' exact checks)
    for name, col in MISMATCH.items():
        bm, cm = b.metrics.get(name, Interval(None)), c.metrics.get(name, Interval(None))
        if not bm.mean:
            continue
        grew, limit = _grew(bm.mean, cm.mean, tol)
        if grew and by_seeds:
            d = difference_interval(bm, cm)
            grew = d.lo is None or d.lo > 0
        if grew:
            regs.append(
                _group_reg(gid, "mismatch_grew", col, bm, cm, limit, difference_interval(bm, cm) if by_seeds else None)
            )
    return regs


def compare_grids(base_rows: list[dict], cand_rows: list[dict], tol: Tolerances) -> tuple[int, list[dict]]:
    """(seed groups compared, regressions) for two grids' summary rows (timbench.report.summary)."""
    cand = {r["id"]: r for r in cand_rows}
    regs = []
    for b in base_rows:
        regs += _cell_checks(b, cand[b["id"]])
    cand_groups = {tuple(g.key.values()): g for g in seed_groups(cand_rows)}
    base_groups = seed_groups(base_rows)
    for g in base_groups:
        regs += _group_checks(g, cand_groups[tuple(g.key.values())], tol)
    return len(base_groups), regs


BYTE_FILES = ("metrics.jsonl", "eval.jsonl")


def bitwise_deterministic(config: dict) -> bool:
    """True when a cell's run gives the same bytes on any x86-64 CPU: exact kernels on both sides, own engine."""
    engine, trainer = config.get("engine") or {}, config.get("trainer") or {}
    return (
        engine.get("kernels", "exact") == "exact"
        and trainer.get("kernels", "exact") == "exact"
        and engine.get("engine", "timbench") == "timbench"
    )


def byte_identity(base: Path, cand: Path, cells: list[dict]) -> dict:
    """{identical, changed: [cell ids], skipped}: BYTE_FILES of the deterministic cells both sides finished."""
    identical, changed, skipped = 0, [], 0
    for cell in cells:
        pairs = [(run_dir(base, cell["id"]) / f, run_dir(cand, cell["id"]) / f) for f in BYTE_FILES]
        if not bitwise_deterministic(cell["config"]) or not all(b.is_file() and c.is_file() for b, c in pairs):
            skipped += 1
        elif all(b.read_bytes() == c.read_bytes() for b, c in pairs):
            identical += 1
        else:
            changed.append(cell["id"])
    return {"identical": identical, "changed": changed, "skipped": skipped}


def _kind(path: Path) -> str:
    if path.is_dir():
        return "grid"
    if path.is_file():
        return "align"
    raise FileNotFoundError(f"{path}: no such grid directory or alignment JSON file")


def compare(
    baseline: str | Path, candidate: str | Path, tol: Tolerances = Tolerances(), require_bytes: bool = False
) -> dict:
    """The verdict: {verdict: pass|fail, kind, baseline, candidate, tolerances, compared, regressions[, bytes]}.

    `require_bytes`: a deterministic grid cell whose logged files changed is a regression (bytes_changed).
    """
    b, c = Path(baseline), Path(candidate)
    kind = _kind(b)
    if _kind(c) != kind:
        what = {"grid": "grid result dir", "align": "align table JSON file"}
        raise ValueError(
            f"cannot compare {what[kind]} {b} with {what[_kind(c)]} {c}; give two grid "
            "result dirs or two align table JSON files"
        )
    if kind == "grid":
        why = experiment_difference(load_cells(b), load_cells(c))
        if why:
            raise ValueError(f"{b} and {c} are different experiments ({why}); compare grids of one spec")
        n, regs = compare_grids(summarize_grid(b), summarize_grid(c), tol)
        same = byte_identity(b, c, load_cells(b)["cells"])
        if require_bytes:
            regs += [_reg(cid, "bytes_changed", "/".join(BYTE_FILES), None, None) for cid in same["changed"]]
    else:
        n, regs = compare_align(read_json(b), read_json(c), tol)
    v = {
        "verdict": "fail" if regs else "pass",
        "kind": kind,
        "baseline": str(b),
        "candidate": str(c),
        "tolerances": dataclasses.asdict(tol),
        "compared": n,
        "regressions": regs,
    }
    return v | {"bytes": same} if kind == "grid" else v


def _fmt_iv(iv: list | None) -> str:
    if iv is None:
        return "-"
    m, lo, hi, n = iv
    return f"{m:.4g} (n={n})" if lo is None else f"{m:.4g} [{lo:.4g}, {hi:.4g}] (n={n})"


def format_verdict(v: dict) -> str:
    lines = []
    for r in v["regressions"]:
        if "baseline_interval" in r:
            nums = f" {r['metric']}: {_fmt_iv(r['baseline_interval'])} -> {_fmt_iv(r['candidate_interval'])}"
            if r.get("difference_interval"):
                nums += f", difference {_fmt_iv(r['difference_interval'])}"
        else:
            nums = "" if r["metric"] is None else f" {r['metric']}: {r['baseline']} -> {r['candidate']}"
            if r["check"] == "bytes_changed":
                nums = f" {r['metric']} differ"
        lim = "" if r["limit"] is None else f" (limit {r['limit']:.6g})"
        lines.append(f"REGRESSION {r['check']}: {r['id']}{nums}{lim}")
    if "bytes" in v:
        by = v["bytes"]
        lines.append(
            f"bytes: {by['identical']}/{by['identical'] + len(by['changed'])} bitwise-deterministic cells "
            f"byte-identical ({', '.join(BYTE_FILES)}); {by['skipped']} not checked (torch kernels, vLLM "
            "or unfinished)"
        )
    lines.append(
        f"compare ({v['kind']}): {v['compared']} entries, {len(v['regressions'])} regressions: {v['verdict'].upper()}"
    )
    return "\n".join(lines)
