"""Early warnings of a collapse: which per-step metric crosses out of the healthy range first, and how many steps
before the collapse (issue 28 item 3; `timbench early-warning DIR...`).

The seed paper (arXiv 2605.14220) finds the KL "nearly flat" while reward falls; the public GPU study of
Qwen3-1.7B/8B saw the KL rise ~25 steps before the reward fell; TRIAGE (arXiv 2610.07043) names a quadrant
imbalance that rose 1.02 -> 2.32 before collapse. To rank such candidates on one footing, each gets the same
rule, calibrated on the runs that did not collapse and checked out of sample:

  * collapse: `report.collapse.detect_collapse` with each grid's own rule (collapse_step, or none);
  * healthy envelope: for a candidate metric x (negated where a fall is the bad direction), the largest value
    any non-collapsed run of the given grids logged at any step;
  * leave one seed out: the envelope that judges a run of seed s comes from the non-collapsed runs of the
    other seeds only, so no run sets its own threshold;
  * warning step: the first step at which x > that envelope; lead = collapse_step - warning step
    (>= 1 is early; 0 or less is late); a non-collapsed run that crosses its envelope is a false alarm.

Per candidate the table gives the collapsed runs that log it, the early warnings among them (Wilson 95%
interval), the lead over the early ones (median and mean with a 95% t interval over runs), and the false
alarms (Wilson). Candidates rank by Youden's J (early rate - false-alarm rate), then median lead. The fixed rule the collapse report
already uses (`rollout_corr/k3_kl` > kl_warn = 1e-3) is scored beside them. Pure reads of the result dirs.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path

from ..atomic import atomic_write
from .collapse import CollapseRule, detect_collapse, rule_from_dict
from .results import load_results
from .stats import mean_interval, wilson


@dataclass(frozen=True)
class Candidate:
    key: str
    """Per-step metric name in metrics.jsonl."""
    sign: int
    """+1: a rise is the warning; -1: a fall is."""
    source: str
    """Why it is a candidate (who proposed it)."""


CANDIDATES: tuple[Candidate, ...] = (
    Candidate("rollout_corr/k3_kl", 1, "k3 KL(pi_old || mu): verl's rollout_corr; the GPU study's rising KL"),
    Candidate("mismatch/mean_abs_delta", 1, "mean |log pi_old - log mu| (arXiv 2605.14220)"),
    Candidate("mismatch/max_abs_delta", 1, "max |delta| (the ~1.0 outliers of arXiv 2605.14220)"),
    Candidate("mismatch/extreme_frac_2", 1, "share of tokens with rho outside [1/2, 2] (IcePop's band edge)"),
    Candidate("rollout_corr/chi2_token", 1, "token chi^2 of rho: the variance of the correction weights"),
    Candidate("tim/neg_adv_imbalance", 1, "TRIAGE's (A < 0, delta < 0) imbalance (arXiv 2610.07043)"),
    Candidate("tim/tail_seg_concentration", 1, "TRIAGE: the |delta| tail clusters in a few 64-token segments"),
    Candidate("tim/tv_mean", 1, "mean total variation engine vs trainer (arXiv 2610.05458)"),
    Candidate("tim/top1_agreement", -1, "top-1 agreement engine vs trainer (arXiv 2610.05458)"),
    Candidate("tim/top5_consistency", -1, "top-5 set overlap engine vs trainer (arXiv 2610.05458)"),
    Candidate("tim/bitwise_equal_frac", -1, "positions with bitwise-equal distributions (arXiv 2610.05458)"),
    Candidate("actor/grad_norm", 1, "gradient norm (the collapse rule's spike criterion)"),
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

    def series(self, c: Candidate) -> list[tuple[int, float]] | None:
        """(step, sign * value) for every row that logs the metric finitely, or None when no row logs it."""
        pts = [(s, c.sign * float(r[c.key])) for s, r in zip(self.steps, self.rows)
               if isinstance(r.get(c.key), (int, float)) and float(r[c.key]) == float(r[c.key])]
        return pts or None


def load_runs(dirs: list[str | Path]) -> list[Run]:
    """Every finished cell of every grid dir, with its collapse step by the grid's own rule."""
    runs = []
    for d in dirs:
        g = load_results(d)
        rule: CollapseRule = rule_from_dict(g.collapse)
        for cell in g.cells:
            if cell.status != "done" or not cell.metrics:
                continue
            col = detect_collapse(cell.metrics, cell.evals, cell.summary, rule)
            runs.append(Run(str(d), cell.id, int(cell.axes.get("seed", 0)), col["collapse_step"],
                            col["kl_warning_step"], [int(r.get("step", i)) for i, r in enumerate(cell.metrics)],
                            cell.metrics))
    if not runs:
        raise ValueError(f"{', '.join(map(str, dirs))}: no finished cells (run the grids first)")
    return runs


def first_above(series: list[tuple[int, float]], threshold: float) -> int | None:
    return next((s for s, x in series if x > threshold), None)


def score_candidate(c: Candidate, runs: list[Run]) -> dict:
    """The leave-one-seed-out envelope rule (module docstring) for one candidate over `runs`."""
    have = [(r, s) for r in runs if (s := r.series(c)) is not None]
    healthy = [(r, s) for r, s in have if r.collapse_step is None]
    judged = []
    for r, s in have:
        pool = [x for h, hs in healthy if h.seed != r.seed for _, x in hs]
        if pool:  # else no out-of-sample envelope for this seed: not judged
            judged.append((r, first_above(s, max(pool))))
    return _summary(c.key, c.sign, c.source, judged)


def score_fixed_kl(runs: list[Run], kl_warn: float = CollapseRule().kl_warn) -> dict:
    """The collapse report's fixed KL rule (k3 > kl_warn at any step), scored the same way."""
    c = Candidate("rollout_corr/k3_kl", 1, "collapse.CollapseRule.kl_warn")
    judged = [(r, first_above(s, kl_warn)) for r in runs if (s := r.series(c)) is not None]
    return _summary(f"rollout_corr/k3_kl > {kl_warn:g} (fixed)", 1, c.source, judged)


def _tally(judged: list[tuple[Run, int | None]]):
    """(leads of the early warnings, late, missed, false alarms, healthy runs judged) of (run, warning step) pairs."""
    leads, late, missed, alarms, healthy = [], 0, 0, 0, 0
    for r, warn in judged:
        if r.collapse_step is None:
            healthy += 1
            alarms += warn is not None
        elif warn is None:
            missed += 1
        elif r.collapse_step - warn >= 1:
            leads.append(r.collapse_step - warn)
        else:
            late += 1
    return leads, late, missed, alarms, healthy


def _summary(key, sign, source, judged) -> dict:
    leads, late, missed, alarms, healthy = _tally(judged)
    n = len(leads) + late + missed
    early = wilson(len(leads), n) if n else None
    fa = wilson(alarms, healthy) if healthy else None
    lead_iv = mean_interval([float(x) for x in leads]) if len(leads) >= 2 else None
    return {"metric": key, "direction": "rise" if sign > 0 else "fall", "source": source, "collapsed_runs": n,
            "early": len(leads), "late": late, "missed": missed,
            "early_rate": [early.mean, early.lo, early.hi] if early else None,
            "median_lead": statistics.median(leads) if leads else None,
            "mean_lead": [lead_iv.mean, lead_iv.lo, lead_iv.hi] if lead_iv else (
                [float(leads[0])] * 3 if leads else None),
            "leads": sorted(leads), "healthy_runs": healthy, "false_alarms": alarms,
            "false_alarm_rate": [fa.mean, fa.lo, fa.hi] if fa else None}


def youden(r: dict) -> float | None:
    """Youden's J = early-warning rate - false-alarm rate (1 is a perfect warning, 0 no better than a constant)."""
    if not r["collapsed_runs"] or not r["healthy_runs"]:
        return None
    return r["early"] / r["collapsed_runs"] - r["false_alarms"] / r["healthy_runs"]


def rank(rows: list[dict]) -> list[dict]:
    """Scored rows first, by Youden's J then median lead (both descending); the metric name breaks ties."""
    def key(r):
        j = youden(r)
        return (j is None, -(j or 0.0), -(r["median_lead"] or 0), r["metric"])
    return [r | {"youden_j": youden(r)} for r in sorted(rows, key=key)]


def early_warning(dirs: list[str | Path]) -> dict:
    runs = load_runs(dirs)
    rows = rank([score_candidate(c, runs) for c in CANDIDATES] + [score_fixed_kl(runs)])
    return {"grids": [str(d) for d in dirs], "runs": len(runs),
            "collapsed": sum(r.collapse_step is not None for r in runs),
            "seeds": sorted({r.seed for r in runs}), "table": rows}


def _iv(x, digits=2) -> str:
    return "-" if x is None else f"{x[0]:.{digits}f} [{x[1]:.{digits}f}, {x[2]:.{digits}f}]"


def markdown(doc: dict, command: str) -> str:
    lines = [
        "# Early warnings of a collapse", "",
        f"Grids: {', '.join(doc['grids'])}. {doc['runs']} finished runs, {doc['collapsed']} collapsed "
        f"(each grid's collapse rule); seeds {doc['seeds']}.", "",
        "Rule (timbench/report/early_warning.py): a metric warns at the first step it leaves the healthy envelope "
        "(its largest value in any non-collapsed run of the *other* seeds: leave one seed out); lead = collapse "
        "step - warning step, early when >= 1. A non-collapsed run that leaves its envelope is a false alarm. "
        "Rank: Youden's J = early rate - false-alarm rate. Intervals: Wilson 95% for rates, Student t 95% over runs for the mean lead. A candidate is only scored on "
        "the runs that log it (the `tim/` metrics exist in grids made after they were added).", "",
        "| rank | metric | warns on | collapsed runs | early | late | missed | early rate | median lead | "
        "mean lead | false alarms | J | source |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for i, r in enumerate(doc["table"], 1):
        lines.append(f"| {i} | `{r['metric']}` | {r['direction']} | {r['collapsed_runs']} | {r['early']} | "
                     f"{r['late']} | {r['missed']} | {_iv(r['early_rate'])} | "
                     f"{'-' if r['median_lead'] is None else r['median_lead']} | {_iv(r['mean_lead'], 1)} | "
                     f"{r['false_alarms']}/{r['healthy_runs']} | "
                     f"{'-' if r['youden_j'] is None else format(r['youden_j'], '.2f')} | {r['source']} |")
    lines += ["", f"Regenerate: `{command}`", ""]
    return "\n".join(lines)


def write_early_warning(dirs: list[str | Path], out: str | Path, command: str | None = None) -> dict[str, Path]:
    out = Path(out)
    command = command or "timbench early-warning " + " ".join(map(str, dirs)) + f" --out {out}"
    doc = early_warning(dirs)
    written = {"early_warning.md": out / "early_warning.md", "early_warning.json": out / "early_warning.json"}
    atomic_write(written["early_warning.md"], markdown(doc, command))
    atomic_write(written["early_warning.json"],
                 json.dumps({"command": command, **doc}, indent=1, sort_keys=True, allow_nan=False) + "\n")
    return written
