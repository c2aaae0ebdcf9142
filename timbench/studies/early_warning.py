"""Early warnings of a collapse: which per-step metric leaves the healthy range first, and how many steps before
the collapse (`timbench early-warning DIR...`; docs/findings/early-warning.md).

The seed paper (arXiv 2605.14220) finds the KL "nearly flat" while reward falls; the public GPU study of
Qwen3-1.7B/8B saw the KL rise ~25 steps before the reward fell; TRIAGE (arXiv 2610.07043) names a quadrant
imbalance that rose 1.02 -> 2.32 before collapse. To rank such candidates on one footing, each gets the same
rule, calibrated on the runs that did not collapse and checked out of sample:

  * collapse: `report.collapse.detect_collapse` with each grid's own rule (collapse_step, or none);
  * healthy envelopes, from the non-collapsed runs of *real* conditions (synthetic noise does not calibrate) of
    the other seeds only (leave one seed out: no run sets its own threshold), for a candidate x (negated where a
    fall is the bad direction): the level envelope, the largest x any of them logged, and the change envelope,
    the largest rise x(t) - x(step 0) any of them made;
  * a warning comes after step 0: the first later step at which x crosses the level envelope (only for a run
    that started inside it: a run already outside at step 0 is flagged by its condition, not warned), or at
    which its rise since step 0 crosses the change envelope (a within-run change);
  * lead = collapse step - warning step (>= 1 is early; 0 or less late); a collapse by the step after step 0
    leaves no room for a warning (counted as too soon, outside the rates); a surviving run that is warned is a
    false alarm.

Every rate has a Wilson 95% interval; Youden's J (early rate - false-alarm rate) has Newcombe's. The verdict is
timbench.report.verdict_rules' `warning_vs_false_alarms` (Fisher's exact test of the early rate against the
false-alarm rate, Holm over one table's candidates): `warns`, `does not warn` or `not tested`. The headline table
holds the real conditions; each condition kind gets its own table, synthetic noise apart. The fixed rule the
collapse report uses (`rollout_corr/k3_kl` > kl_warn = 1e-3) is scored beside the candidates. Pure reads; the
page is early_warning_md's.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path

from ..metrics.schema import (
    GRAD_NORM,
    K3_KL,
    MAX_ABS_DELTA,
    MEAN_ABS_DELTA,
    TIM_BITWISE_EQUAL_FRAC,
    TIM_TOP1_AGREEMENT,
    TIM_TV_MEAN,
)
from ..report.collapse import CollapseRule, detect_collapse, rule_from_dict
from ..report.results import load_results
from ..report.stats import mean_interval, wilson
from ..report.verdict_rules import WARNS, decide, warning_vs_false_alarms
from ..util.atomic import atomic_write
from .early_warning_md import markdown

SYNTHETIC = "noise"
"""The condition kind that is synthetic (zero-mean noise on the logits): reported apart, never calibrates."""


@dataclass(frozen=True)
class Candidate:
    key: str
    """Per-step metric name in metrics.jsonl."""
    sign: int
    """+1: a rise is the warning; -1: a fall is."""
    source: str
    """Why it is a candidate (who proposed it)."""


CANDIDATES: tuple[Candidate, ...] = (
    Candidate(K3_KL, 1, "k3 KL(pi_old || mu): verl's rollout_corr; the GPU study's rising KL"),
    Candidate(MEAN_ABS_DELTA, 1, "mean |log pi_old - log mu| (arXiv 2605.14220)"),
    Candidate(MAX_ABS_DELTA, 1, "max |delta| (the ~1.0 outliers of arXiv 2605.14220)"),
    Candidate("mismatch/extreme_frac_2", 1, "share of tokens with rho outside [1/2, 2] (IcePop's band edge)"),
    Candidate("rollout_corr/chi2_token", 1, "token chi^2 of rho: the variance of the correction weights"),
    Candidate("tim/neg_adv_imbalance", 1, "TRIAGE's (A < 0, delta < 0) imbalance (arXiv 2610.07043)"),
    Candidate("tim/tail_seg_concentration", 1, "TRIAGE: the |delta| tail clusters in a few 64-token segments"),
    Candidate(TIM_TV_MEAN, 1, "mean total variation engine vs trainer (arXiv 2610.05458)"),
    Candidate(TIM_TOP1_AGREEMENT, -1, "top-1 agreement engine vs trainer (arXiv 2610.05458)"),
    Candidate("tim/top5_consistency", -1, "top-5 set overlap engine vs trainer (arXiv 2610.05458)"),
    Candidate(TIM_BITWISE_EQUAL_FRAC, -1, "positions with bitwise-equal distributions (arXiv 2610.05458)"),
    Candidate(GRAD_NORM, 1, "gradient norm (the collapse rule's spike criterion)"),
    Candidate("actor/pg_clipfrac", 1, "share of tokens PPO clips"),
    Candidate("actor/entropy", -1, "policy entropy falling (entropy collapse)"),
)


@dataclass
class Run:
    grid: str
    cell: str
    seed: int
    collapse_step: int | None
    kl_warning_step: int | None
    steps: list[int]
    rows: list[dict]
    kind: str = ""
    """The condition's kind (conditions.yaml: reference, precision, quant, ..., noise); "" when unknown (real)."""

    def series(self, c: Candidate) -> list[tuple[int, float]] | None:
        """(step, sign * value) for every row that logs the metric finitely, or None when no row logs it."""
        pts = [
            (s, c.sign * float(r[c.key]))
            for s, r in zip(self.steps, self.rows)
            if isinstance(r.get(c.key), (int, float)) and float(r[c.key]) == float(r[c.key])
        ]
        return pts or None


def is_real(r: Run) -> bool:
    return r.kind != SYNTHETIC


def load_runs(dirs: list[str | Path]) -> list[Run]:
    """Every finished cell of every grid dir, with its collapse step by the grid's own rule; a run that several
    dirs hold (grid.same_run) counts once, in the first dir given."""
    from ..grid.same_run import cell_identity, distinct_dirs

    runs, seen = [], set()
    for d in distinct_dirs(dirs, "grid result directory"):
        g = load_results(d)
        rule: CollapseRule = rule_from_dict(g.collapse)
        for cell in g.cells:
            if cell.status != "done" or not cell.metrics:
                continue
            key = cell_identity(cell)
            if key in seen:
                continue
            seen.add(key)
            col = detect_collapse(cell.metrics, cell.evals, cell.summary, rule)
            runs.append(
                Run(
                    str(d),
                    cell.id,
                    int(cell.axes.get("seed", 0)),
                    col["collapse_step"],
                    col["kl_warning_step"],
                    [int(r.get("step", i)) for i, r in enumerate(cell.metrics)],
                    cell.metrics,
                    str(cell.condition.get("kind", "")),
                )
            )
    if not runs:
        raise ValueError(f"{', '.join(map(str, dirs))}: no finished cells (run the grids first)")
    return runs


def first_above(series: list[tuple[int, float]], threshold: float) -> int | None:
    return next((s for s, x in series if x > threshold), None)


def warning_step(series: list[tuple[int, float]], level: float | None, change: float | None) -> tuple[int | None, bool]:
    """(the first warning step after step 0, whether the run starts outside the level envelope): the level
    crossing counts only for a run that starts inside; the change crossing (x - x at step 0) always counts."""
    x0 = series[0][1]
    at_start = level is not None and x0 > level
    steps = []
    if level is not None and not at_start:
        steps.append(first_above(series[1:], level))
    if change is not None:
        steps.append(next((s for s, x in series[1:] if x - x0 > change), None))
    steps = [s for s in steps if s is not None]
    return (min(steps) if steps else None), at_start


def _rise(series: list[tuple[int, float]]) -> float | None:
    return max(x - series[0][1] for _, x in series[1:]) if len(series) > 1 else None


def score_candidate(c: Candidate, runs: list[Run], calibration: list[Run] | None = None) -> dict:
    """The leave-one-seed-out envelope rule (module docstring) for one candidate over `runs`, its envelopes from
    the non-collapsed runs of `calibration` (default: the real runs of `runs`)."""
    calibration = [r for r in runs if is_real(r)] if calibration is None else calibration
    healthy = [(h, s) for h in calibration if h.collapse_step is None and (s := h.series(c)) is not None]
    judged = []
    for r in runs:
        if (s := r.series(c)) is None:
            continue
        pool = [hs for h, hs in healthy if h.seed != r.seed]
        if not pool:  # no out-of-sample envelope for this seed: not judged
            continue
        rises = [x for hs in pool if (x := _rise(hs)) is not None]
        level = max(x for hs in pool for _, x in hs)
        judged.append((r, *warning_step(s, level, max(rises) if rises else None), s[0][0]))
    return _summary(c.key, c.sign, c.source, judged)


def score_fixed_kl(runs: list[Run], kl_warn: float = CollapseRule().kl_warn) -> dict:
    """The collapse report's fixed KL rule (k3 > kl_warn), scored the same way (a level rule only: a run above
    kl_warn at step 0 is flagged, not warned)."""
    c = Candidate(K3_KL, 1, "collapse.CollapseRule.kl_warn")
    judged = [(r, *warning_step(s, kl_warn, None), s[0][0]) for r in runs if (s := r.series(c)) is not None]
    return _summary(f"rollout_corr/k3_kl > {kl_warn:g} (fixed)", 1, c.source, judged)


def _tally(judged: list[tuple]) -> dict:
    """Counts over (run, warning step, flagged at step 0, first step) tuples."""
    t = {"leads": [], "late": 0, "missed": 0, "too_soon": 0, "at_start": 0, "false_alarms": 0, "healthy_runs": 0}
    for r, warn, at_start, first in judged:
        if r.collapse_step is None:
            t["healthy_runs"] += 1
            t["false_alarms"] += warn is not None
            continue
        if r.collapse_step <= first + 1:  # no step after step 0 precedes it
            t["too_soon"] += 1
            continue
        t["at_start"] += at_start
        if warn is None:
            t["missed"] += 1
        elif r.collapse_step - warn >= 1:
            t["leads"].append(r.collapse_step - warn)
        else:
            t["late"] += 1
    return t


def _summary(key, sign, source, judged) -> dict:
    t = _tally(judged)
    leads, healthy, alarms = t["leads"], t["healthy_runs"], t["false_alarms"]
    n = len(leads) + t["late"] + t["missed"]
    early = wilson(len(leads), n) if n else None
    fa = wilson(alarms, healthy) if healthy else None
    lead_iv = mean_interval([float(x) for x in leads]) if len(leads) >= 2 else None
    return {
        "metric": key,
        "direction": "rise" if sign > 0 else "fall",
        "source": source,
        "collapsed_runs": n,
        "early": len(leads),
        "late": t["late"],
        "missed": t["missed"],
        "too_soon": t["too_soon"],
        "flagged_at_step0": t["at_start"],
        "early_rate": [early.mean, early.lo, early.hi] if early else None,
        "median_lead": statistics.median(leads) if leads else None,
        "mean_lead": [lead_iv.mean, lead_iv.lo, lead_iv.hi] if lead_iv else ([float(leads[0])] * 3 if leads else None),
        "leads": sorted(leads),
        "healthy_runs": healthy,
        "false_alarms": alarms,
        "false_alarm_rate": [fa.mean, fa.lo, fa.hi] if fa else None,
    }


def youden(r: dict) -> float | None:
    """Youden's J = early-warning rate - false-alarm rate (1 is a perfect warning, 0 no better than a constant)."""
    if not r["collapsed_runs"] or not r["healthy_runs"]:
        return None
    return r["early"] / r["collapsed_runs"] - r["false_alarms"] / r["healthy_runs"]


def rank(rows: list[dict]) -> list[dict]:
    """Scored rows first, by Youden's J then median lead (both descending); the metric name breaks ties. Each row
    gets its verdict: verdict_rules.warning_vs_false_alarms, Holm over the rows."""

    def key(r):
        j = youden(r)
        return (j is None, -(j or 0.0), -(r["median_lead"] or 0), r["metric"])

    rows = sorted(rows, key=key)
    tests = decide(
        [
            warning_vs_false_alarms(r["metric"], r["early"], r["collapsed_runs"], r["false_alarms"], r["healthy_runs"])
            for r in rows
        ]
    )
    return [
        r
        | {
            "youden_j": youden(r),
            "j_interval": [t.interval.mean, t.interval.lo, t.interval.hi] if t.interval.lo is not None else None,
            "p": t.p,
            "p_holm": t.p_adj,
            "verdict": t.word(),
            "not_tested": t.blocked,
        }
        for r, t in zip(rows, tests)
    ]


def table(runs: list[Run], calibration: list[Run]) -> list[dict]:
    """Every candidate and the fixed KL rule scored on `runs` (envelopes from `calibration`), ranked."""
    return rank([score_candidate(c, runs, calibration) for c in CANDIDATES] + [score_fixed_kl(runs)])


def _kind_part(kind: str, runs: list[Run], rows: list[dict]) -> dict:
    steps = sorted(r.collapse_step for r in runs if r.collapse_step is not None)
    return {
        "kind": kind,
        "runs": len(runs),
        "collapsed": len(steps),
        "collapse_steps": steps,
        "collapsed_by_step8": sum(s <= 8 for s in steps),
        "warns": [r["metric"] for r in rows if r["verdict"] == WARNS],
        "table": rows,
    }


def early_warning(dirs: list[str | Path]) -> dict:
    """The headline table over the real conditions, and one table per condition kind (every kind's envelopes
    from the real conditions' surviving runs)."""
    runs = load_runs(dirs)
    real = [r for r in runs if is_real(r)]
    kinds = sorted({r.kind or "unknown" for r in runs}, key=lambda k: (k == SYNTHETIC, k))
    mine = {k: [r for r in runs if (r.kind or "unknown") == k] for k in kinds}
    per_kind = [_kind_part(k, mine[k], table(mine[k], real)) for k in kinds]
    head = _kind_part("real", real, table(real, real))
    return {
        "grids": [str(d) for d in dirs],
        "runs": len(runs),
        "collapsed": sum(r.collapse_step is not None for r in runs),
        "seeds": sorted({r.seed for r in runs}),
        "real": {k: v for k, v in head.items() if k != "table"},
        "table": head["table"],
        "kinds": per_kind,
    }


def write_early_warning(dirs: list[str | Path], out: str | Path, command: str | None = None) -> dict[str, Path]:
    out = Path(out)
    command = command or "timbench early-warning " + " ".join(map(str, dirs)) + f" --out {out}"
    doc = early_warning(dirs)
    written = {"early_warning.md": out / "early_warning.md", "early_warning.json": out / "early_warning.json"}
    atomic_write(written["early_warning.md"], markdown(doc, command))
    atomic_write(
        written["early_warning.json"],
        json.dumps({"command": command, **doc}, indent=1, sort_keys=True, allow_nan=False) + "\n",
    )
    return written
