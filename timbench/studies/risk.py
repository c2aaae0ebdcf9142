"""`timbench risk`: what a measured mismatch did in the committed grids, and where that answer stops holding.

Given mismatch statistics (numbers, rows of a `timbench align` table, or a gate run's alignment probe), `answer`
finds the nearest committed settings (risk_data rows grouped by grid, task, model, condition and mode; distance:
the root mean square of log10 ratios over the statistics both sides have, so 0.004 vs 0.008 is as far as 0.04 vs
0.08), per rollout mode, and reports their outcomes over seeds (accuracy lost: mean and 95% t interval; collapses:
k/n with a Wilson interval), the remedies the same grid ran on the same condition (paired over seeds against the
same mode without a remedy, on the grid's endpoint), and the validity limits of the map (models, tasks, horizons,
the dose range it rests on). A dose outside every committed setting's range is refused (ValueError), not
extrapolated. Pure functions of risk_data rows; input files are read in risk_input.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass

from ..report.stats import mean_interval, wilson
from .risk_data import DOSE, FIRST_STEPS, HORIZON, STATS, RiskRow, mapped
from .risk_validate import LOSS

NEAREST = 3
"""Settings shown per mode."""
MODES = {
    "recompute": "the trainer recomputes the old-policy logprobs (verl's default)",
    "bypass": "the rollout engine's logprobs serve as the old policy (verl bypass_mode, async trainers)",
}


@dataclass
class Unit:
    """One committed setting without a remedy: a grid's (task, model, condition, mode), over its seeds."""

    key: tuple
    kind: str
    rows: list[RiskRow]
    also_in: tuple = ()
    """Other grids holding these runs, or some of them, bit for bit (dual_clip and claims_grid replay paper's
    control cells; f5_powered holds paper's seeds): one setting, listed once, whose remedies come from every
    grid that holds it."""

    @property
    def stats(self) -> dict:
        names = set.intersection(*(set(r.stats) for r in self.rows))
        return {n: math.fsum(r.stats[n] for r in self.rows) / len(self.rows) for n in sorted(names)}


def _signature(rs: list[RiskRow]) -> frozenset:
    """What makes two grids' runs the same: each seed's horizon, dose and endpoint (not every statistic: an older
    grid lacks the tim/* ones a replay of its cells logs)."""
    return frozenset((r.seed, r.steps, r.stats.get(DOSE), r.stats.get("k3_kl"), r.endpoint_t1) for r in rs)


def units(rows: list[RiskRow]) -> list[Unit]:
    """The settings without a remedy; a setting whose runs another grid's same setting holds too (replayed bit for
    bit, or a subset of its seeds: results/f5_powered holds results/paper's seeds 0-5) is one unit, so no run
    counts twice: under the grid with the most of those seeds, then the most runs of that (task, model,
    condition) (the one with the most remedies beside it)."""
    by: dict = defaultdict(list)
    for r in mapped(rows):
        by[r.unit].append(r)
    size: dict = defaultdict(int)
    for r in rows:
        size[(r.grid, r.task, r.model, r.condition)] += 1
    setting: dict = defaultdict(list)
    for k in by:
        setting[k[1:]].append(k)
    out = []
    for keys in setting.values():
        keys.sort(key=lambda k: (-len(by[k]), -size[(k[0], *k[1:4])], k[0]))
        kept: list[tuple] = []  # (key, signature, the grids folded into it)
        for k in keys:
            sig = _signature(by[k])
            home = next((h for h in kept if sig <= h[1]), None)
            if home is None:
                kept.append((k, sig, []))
            else:
                home[2].append(k[0])
        out += [Unit(k, by[k][0].kind, by[k], tuple(also)) for k, _, also in kept]
    return out


def _lg(x: float) -> float:
    return math.log10(max(x, 1e-12))


def distance(query: dict, stats: dict) -> float | None:
    """RMS of log10(query / committed) over the statistics both have; None when they share none."""
    common = [n for n in query if n in stats]
    if not common:
        return None
    return math.sqrt(math.fsum((_lg(query[n]) - _lg(stats[n])) ** 2 for n in common) / len(common))


def stat_range(us: list[Unit], name: str) -> tuple[float, float] | None:
    """Min and max of a statistic over the committed seeds (the doses the map rests on), None if never measured."""
    xs = [r.stats[name] for u in us for r in u.rows if name in r.stats]
    return (min(xs), max(xs)) if xs else None


def check_query(query: dict, us: list[Unit]) -> None:
    """Refuse (one-line ValueError) a query no committed setting covers: the dose (or, without one, every given
    statistic) outside the committed range."""
    names = [DOSE] if DOSE in query else list(query)
    for n in names:
        rng = stat_range(us, n)
        if rng is None:
            continue
        if rng[0] <= query[n] <= rng[1]:
            return
        what = "mean |delta|" if n == DOSE else n
        zero = " (0 is zero mismatch: the reference itself)" if query[n] == 0 else ""
        raise ValueError(
            f"no committed grid at that dose: {what} {query[n]:.4g} is outside the committed "
            f"{what} range {rng[0]:.4g}-{rng[1]:.4g}{zero}"
        )
    raise ValueError(f"no committed grid measured {', '.join(query)}; measured statistics: {', '.join(STATS)}")


def outcome(u: Unit) -> dict:
    """Outcomes of a setting over its seeds, with intervals."""
    rs = u.rows
    k = sum(r.collapsed for r in rs)
    within = [r.collapsed_within for r in rs if r.collapsed_within is not None]
    steps = [r.collapse_step for r in rs if r.collapsed and r.collapse_step is not None]
    loss = mean_interval([r.loss for r in rs if r.loss is not None])
    cw = wilson(k, len(rs))
    return {
        "seeds": len(rs),
        "steps": max((r.steps or 0) for r in rs),
        "collapsed": k,
        "collapsed_ci": [cw.lo, cw.hi],
        "first_collapse_step": min(steps) if steps else None,
        "collapsed_within": sum(within) if within else None,
        "within_n": len(within),
        "accuracy_lost": loss.mean,
        "accuracy_lost_ci": [loss.lo, loss.hi],
    }


def remedies(u: Unit, rows: list[RiskRow]) -> list[dict]:
    """The remedies the same grid ran on the same (task, model, condition) in the setting's mode: per remedy, the
    paired endpoint difference against no remedy (positive = the remedy kept more accuracy) and collapses; for a
    bypass setting also `recompute` (the same engine with the trainer recomputing the old logprobs)."""
    _, task, model, cond, mode = u.key
    out, seen = [], set()
    for grid in (u.key[0], *u.also_in):
        for d in _remedies_in(grid, task, model, cond, mode, rows):
            if (d["remedy"], d["mode"]) not in seen:  # the same remedy in a replaying grid: the larger grid's
                seen.add((d["remedy"], d["mode"]))
                out.append(d)
    out.sort(key=lambda d: (d["word"] != "helped", -(d["endpoint_gain"] or -math.inf)))
    return out


def _remedies_in(grid: str, task: str, model: str, cond: str, mode: str, rows: list[RiskRow]) -> list[dict]:
    here = [r for r in rows if (r.grid, r.task, r.model, r.condition) == (grid, task, model, cond)]
    by: dict = defaultdict(dict)
    for r in here:
        by[(r.remedy, r.mode)][r.seed] = r
    if mode == "bypass" and ("none", "recompute") in by:
        by[("recompute", "bypass")] = by[("none", "recompute")]
    out = []
    for (remedy, m), seeds in sorted(by.items()):
        if remedy == "none" or m != mode:
            continue
        base = by.get(("none", mode), {})
        diffs = [
            seeds[s].endpoint_t1 - base[s].endpoint_t1
            for s in sorted(seeds)
            if s in base and seeds[s].endpoint_t1 is not None and base[s].endpoint_t1 is not None
        ]
        iv = mean_interval(diffs)
        word = (
            "no paired control"
            if not diffs
            else "helped"
            if iv.lo is not None and iv.lo > 0
            else "hurt"
            if iv.hi is not None and iv.hi < 0
            else "no difference detected"
        )
        out.append(
            {
                "remedy": remedy,
                "mode": m,
                "seeds": len(seeds),
                "endpoint_gain": iv.mean,
                "endpoint_gain_ci": [iv.lo, iv.hi],
                "paired_seeds": len(diffs),
                "word": word,
                "collapsed": sum(r.collapsed for r in seeds.values()),
                "control_collapsed": sum(r.collapsed for r in base.values()),
                "control_seeds": len(base),
                "accuracy_lost": mean_interval([r.loss for r in seeds.values() if r.loss is not None]).mean,
                "grid": grid,
            }
        )
    return out


def validity(us: list[Unit]) -> dict:
    """What the map rests on: where it may be read and where it may not."""
    rows = [r for u in us for r in u.rows]
    lens = [r.response_length for r in rows if r.response_length is not None]
    dose = stat_range(us, DOSE)
    models, tasks = sorted({r.model for r in rows}), sorted({r.task for r in rows})
    return {
        "models": models,
        "tasks": tasks,
        "grids": sorted({r.grid for r in rows}),
        "settings": len(us),
        "seeds": len(rows),
        "horizon_steps": [min(r.steps or 0 for r in rows), max(r.steps or 0 for r in rows)],
        "dose_mean_abs_delta": list(dose) if dose else None,
        "response_tokens": [round(min(lens), 1), round(max(lens), 1)] if lens else None,
        "statistics_steps": FIRST_STEPS,
        "collapse_horizon": HORIZON,
        "caveats": [
            f"CPU-scale models ({_sizes(models)}) on {', '.join(tasks)} with GRPO: "
            "no committed evidence that an outcome here transfers to billion-parameter models",
            f"statistics are the RL rollouts' own, averaged over steps 0-{FIRST_STEPS - 1} (the warm-start "
            "policy); an align table or a gate probe measures on its own workload and can differ several-fold "
            "for the same engine",
            "synthetic noise (kind noise) does less damage than rounding at the same mean |delta|: read the "
            "nearest real (quant/precision/vllm/async/moe) setting first",
        ],
    }


def _sizes(models: list[str]) -> str:
    """The map's models with their parameter counts, smallest first ("tiny-dense 0.60M, ..."), then any model
    that is no preset, by name: the caveat states the sizes the map rests on, read from its rows, so a newly
    committed size moves it without an edit."""
    from ..model import PRESETS  # deferred: the map's text needs only the configs

    sized = sorted((PRESETS[m].num_parameters(), m) for m in models if m in PRESETS)
    # A user's own checkpoint is no preset: it is still a model the map rests on, so it is named, without a size.
    unsized = sorted(m for m in models if m not in PRESETS)
    named = [f"{m} {n / 1e6:.2f}M" for n, m in sized] + [f"{m} (size not known)" for m in unsized]
    return ", ".join(named) + " parameters"


def answer(query: dict, rows: list[RiskRow], mode: str | None = None, k: int = NEAREST, label: str = "") -> dict:
    """The nearest committed settings to `query` ({statistic: value}) per mode, with outcomes and remedies."""
    bad = sorted(set(query) - set(STATS))
    if bad:
        raise ValueError(STATS.unknown(bad[0]))
    us = units(rows)
    check_query(query, us)
    per_mode = {}
    for m in [mode] if mode else list(MODES):
        scored = sorted(
            ((d, u) for u in us if u.key[4] == m and (d := distance(query, u.stats)) is not None),
            key=lambda du: (du[0], du[1].key),
        )
        per_mode[m] = [
            {
                "grid": u.key[0],
                "also_in": list(u.also_in),
                "task": u.key[1],
                "model": u.key[2],
                "condition": u.key[3],
                "kind": u.kind,
                "mode": m,
                "distance": d,
                "stats": {n: v for n, v in u.stats.items() if n in query or n == DOSE},
                "outcome": outcome(u),
                "remedies": remedies(u, rows),
            }
            for d, u in scored[:k]
        ]
    return {"label": label, "query": query, "nearest": per_mode}


def setting_row(u: Unit) -> dict:
    """A setting as the map lists it: where it ran, what it measured, what it cost."""
    grid, task, model, cond, mode = u.key
    o = outcome(u)
    damaged = o["collapsed"] > 0 or (o["accuracy_lost"] or 0) > LOSS
    return {
        "grid": grid,
        "also_in": list(u.also_in),
        "task": task,
        "model": model,
        "condition": cond,
        "kind": u.kind,
        "mode": mode,
        "stats": u.stats,
        "outcome": o,
        "damaged": damaged,
    }


def the_map(rows: list[RiskRow]) -> list[dict]:
    """Every committed setting without a remedy, by mode then dose."""
    return sorted(
        (setting_row(u) for u in units(rows)),
        key=lambda s: (s["mode"], s["stats"].get(DOSE, 0), s["grid"], s["model"], s["condition"]),
    )


def _dose(s: dict) -> float:
    return s["stats"][DOSE]


def _where(s: dict) -> dict:
    return {"dose": _dose(s), "grid": s["grid"], "model": s["model"], "condition": s["condition"]}


def safe_levels(settings: list[dict]) -> dict:
    """Per mode, over the real (not synthetic-noise) settings: the largest dose whose setting was not damaged
    (no seed collapsed, mean accuracy lost <= risk_validate.LOSS) and the smallest dose whose setting was."""
    out = {}
    for mode in MODES:
        real = [s for s in settings if s["mode"] == mode and s["kind"] != "noise" and DOSE in s["stats"]]
        ok = [s for s in real if not s["damaged"]]
        bad = [s for s in real if s["damaged"]]
        first = min(bad, key=_dose) if bad else None
        below = [s for s in real if first is None or _dose(s) < _dose(first)]
        out[mode] = {
            "largest_undamaged": _where(max(ok, key=_dose)) if ok else None,
            "smallest_damaged": _where(first) if first else None,
            "settings": len(real),
            "damaged": len(bad),
            "undamaged_below": len(below),
            "below_range": [min(map(_dose, below)), max(map(_dose, below))] if below else None,
        }
    return out
