"""The seed paper's claims, shared part: what the claims read (`PaperData`), a sub-claim and a claim's verdict
(`Sub`, `Verdict`, `family`: Holm over the family, then each sub-claim's word), and the per-seed quantities and
number formats every claim uses (relative accuracy, own gain, paired differences, collapses, the KL alarm).

The claims themselves are in paper_f1_f3 (collapse, bypass, the KL), paper_f4_f5 (C(r) skew, remedies) and
paper_dose (the dose-response); timbench.studies.paper_claims gathers them. Pure functions; nothing reads files.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from itertools import groupby

from ..metrics.schema import GRAD_NORM, K3_KL, REWARD_MEAN
from ..report.collapse import moving_average
from ..report.leaderboard import fmt, fmt_interval
from ..report.results import CellRun, column
from ..report.stats import POWER, Interval, detectable, mean_interval, wilson
from ..report.verdict_rules import EQUIVALENT, INCONCLUSIVE, NOT, NOT_TESTED, REPRODUCED, REVERSED, combine, decide

UNTESTED = NOT_TESTED
CONSISTENT = "consistent, no difference detected"
"""The claims page's older word for a no-difference claim whose interval contains 0 (not a proof of equality)."""
SPIKE = 2.0
"""A seed's grad norm 'spikes' when its maximum exceeds SPIKE x the same seed's zero-mismatch maximum."""
KL_RISE = 2.0
"""The KL 'warns' when its smoothed value first exceeds KL_RISE x its mean over the first 5 steps."""
KL_LEAD = 5
"""A warning at least KL_LEAD steps before the collapse counts as an early warning."""
FLOOR = 0.05
"""Endpoint accuracy at or below which a setting sits at the floor (collapsed: nothing left to lose)."""
SHARE = 0.5
"""A share claim ("the seeds rise first") is tested as more than SHARE of the seeds (exact binomial test)."""


@dataclass
class PaperData:
    """What the claims read: settings keyed (condition, remedy, mode) -> finished cells and summary rows."""

    cells: dict[tuple, list[CellRun]]
    rows: dict[tuple, list[dict]]
    kinds: dict[str, str]
    """condition -> kind."""
    reference: tuple
    """The zero-mismatch setting (reference condition, none, recompute)."""
    smooth: int = 5
    ref_by_seed: dict = field(default_factory=dict)
    """seed -> the reference cell's summary row."""
    endpoint: str = "last-half"
    """The endpoint the rows' endpoint_* columns hold (timbench.grid.endpoint)."""
    declared: str | None = None
    """The endpoint the grid declared before it ran (None: it declares none)."""

    def setting(self, condition: str, remedy: str = "none", mode: str = "recompute") -> list[dict]:
        return self.rows.get((condition, remedy, mode), [])

    def real(self) -> list[str]:
        """Real mismatched conditions (not noise, not the reference), in grid order."""
        return [c for c, k in self.kinds.items() if k not in ("reference", "noise")]

    def learning(self) -> tuple[float | None, bool, Interval]:
        """(learning range on the relative scale, whether the baseline learns, its absolute own gain): the
        zero-mismatch seeds' gain / endpoint, and whether the absolute gain's interval excludes 0."""
        ref = self.rows.get(self.reference, [])
        gains = mean_interval([r["gain_t1"] for r in ref if r.get("gain_t1") is not None])
        rel_gain = mean_interval(
            [r["gain_t1"] / r["endpoint_t1"] for r in ref if r.get("gain_t1") is not None and r.get("endpoint_t1")]
        )
        return rel_gain.mean, gains.lo is not None and gains.lo > 0, gains


@dataclass
class Sub:
    text: str
    verdict: str
    numbers: str
    central: bool = True
    """False for a literature add-on shown beside the paper's claim: it does not set the headline."""
    tests: list = field(default_factory=list)
    """The verdict_rules.Test objects that decide it (Holm-adjusted within the claim's family)."""
    check: bool = False
    """An implementation check (true by construction when the code is right): listed apart, not a claim."""


@dataclass
class Verdict:
    claim: str
    subs: list[Sub]

    @property
    def verdict(self) -> str:
        """The weakest central sub-claim's verdict, with how many sub-claims were reproduced when not all."""
        claims = [s for s in self.subs if not s.check]
        central = [REPRODUCED if s.verdict == EQUIVALENT else s.verdict for s in claims if s.central]
        if not central:
            return UNTESTED
        head = min(central, key=_strength)  # an equivalence is how a no-difference claim is reproduced
        done = sum(1 for s in claims if s.verdict in (REPRODUCED, EQUIVALENT))
        return (
            head
            if done in (0, len(claims)) or head in (REPRODUCED, EQUIVALENT)
            else f"{head} ({done} of {len(claims)} sub-claims reproduced)"
        )


def sub_json(s: Sub) -> dict:
    """A sub-claim for the pages' JSON: its words, numbers and each deciding test."""
    return {
        "text": s.text,
        "verdict": s.verdict,
        "numbers": s.numbers,
        "central": s.central,
        "check": s.check,
        "tests": [
            {
                "label": t.label,
                "kind": t.kind,
                "estimate": t.estimate,
                "lo": t.interval.lo,
                "hi": t.interval.hi,
                "n": t.interval.n,
                "p": t.p,
                "p_holm": t.p_adj,
                "margin": t.margin,
                "smallest_detectable": t.mde,
                "not_tested": t.blocked,
                "word": t.word(),
            }
            for t in s.tests
        ],
    }


def _strength(word: str) -> int:
    order = (REVERSED, NOT, NOT_TESTED, CONSISTENT, INCONCLUSIVE, EQUIVALENT, REPRODUCED)
    return order.index(word) if word in order else 0


def family(claim: str, subs: list[Sub]) -> Verdict:
    """Holm's correction over every test of the claim's sub-claims, then each tested sub-claim's word: its
    own rule (`decide_sub`), else `combine` over its tests ("at some condition"); test lines join its numbers."""
    decide([t for s in subs for t in s.tests])
    for s in subs:
        if s.tests:
            words = [t.word() for t in s.tests]
            s.verdict = s.verdict(words) if callable(s.verdict) else combine(words)
            s.numbers = (s.numbers + " | " if s.numbers else "") + " | ".join(t.text() for t in s.tests)
    return Verdict(claim, subs)


# ---------------------------------------------------------------- per-seed quantities


def rel(r: dict) -> float | None:
    """The endpoint relative to the same seed's zero-mismatch run (endpoint_rel; the final eval's ratio,
    relative_accuracy_t1, for rows without endpoint columns)."""
    return r["endpoint_rel"] if "endpoint_rel" in r else r.get("relative_accuracy_t1")


def gain(r: dict) -> float | None:
    """Own gain: the endpoint minus the run's step-0 evaluation."""
    return r.get("gain_t1")


def acc(r: dict) -> float | None:
    return r["endpoint_t1"] if "endpoint_t1" in r else r.get("final_accuracy_t1")


def diffs(a: list[dict], b: list[dict], key=rel) -> list[float]:
    """Per seed key(a_seed) - key(b_seed), on the seeds both have."""
    bs = {r["seed"]: r for r in b}
    return [
        key(r) - key(bs[r["seed"]])
        for r in a
        if r["seed"] in bs and key(r) is not None and key(bs[r["seed"]]) is not None
    ]


def at_floor(*settings: list[dict]) -> bool:
    """Every setting's mean endpoint accuracy at or below FLOOR (collapsed to ~0: no difference can show); False
    when a setting's accuracy is unknown."""
    means = [over_seeds(rows, acc).mean for rows in settings]
    return all(m is not None and m <= FLOOR for m in means)


def paired(a: list[dict], b: list[dict], key=rel) -> Interval:
    """Interval over seeds of key(a_seed) - key(b_seed), on the seeds both have."""
    return mean_interval(diffs(a, b, key))


def over_seeds(rows: list[dict], key) -> Interval:
    return mean_interval([v for v in (key(r) for r in rows) if v is not None])


def collapses(rows: list[dict]) -> tuple[int, int]:
    return sum(bool(r.get("collapse/collapsed")) for r in rows), len(rows)


def max_grad_ratio(cell: CellRun, ref: CellRun | None) -> float | None:
    g, gr = column(cell.metrics, GRAD_NORM), (column(ref.metrics, GRAD_NORM) if ref else [])
    return max(g) / max(gr) if g and gr and max(gr) > 0 else None


def rose_before_collapse(cell: CellRun, row: dict, smooth: int) -> bool:
    """The smoothed reward climbed above its first full-window value before the collapse step."""
    rewards = moving_average(column(cell.metrics, REWARD_MEAN), smooth)
    step = row.get("collapse/step")
    if step is None or len(rewards) < smooth:
        return False
    return max(rewards[smooth - 1 : max(smooth, step)], default=0.0) > rewards[smooth - 1] * 1.05


def kl_alarm_step(cell: CellRun, smooth: int) -> int | None:
    """First step at which the smoothed k3_kl exceeds KL_RISE x its mean over steps 0-4."""
    k3 = moving_average(column(cell.metrics, K3_KL), smooth)
    first = column(cell.metrics, K3_KL)[:5]
    base = math.fsum(first) / len(first) if first else 0.0
    return next((i for i, v in enumerate(k3) if base > 0 and v > KL_RISE * base), None)


def _ci(iv: Interval) -> str:
    return fmt_interval(iv)


def _diff(diff: Interval) -> str:
    """A paired difference; when its interval contains 0 ("no difference detected"), with the smallest
    difference the design could have detected, so an underpowered comparison says so."""
    if diff.lo is not None and diff.lo <= 0 <= diff.hi:
        return f"{_ci(diff)} ({_power(diff)})"
    return _ci(diff)


def seed_ranges(seeds) -> str:
    """0, 1, 2, 3, 5 -> '0-3, 5' (runs of consecutive seeds share seed - position)."""
    runs = [[x for _, x in g] for _, g in groupby(enumerate(sorted(set(seeds))), key=lambda t: t[1] - t[0])]
    return ", ".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else f"{r[0]}" for r in runs)


def seeds_used(d: PaperData) -> str:
    """Which seeds every sub-claim rests on: the finished seeds of each setting, grouped (one group when every
    setting has the same seeds, as a full grid does; a partial grid lists which settings have fewer)."""
    groups: dict[tuple, list[str]] = {}
    for key, rows in sorted(d.rows.items()):
        groups.setdefault(tuple(sorted(r["seed"] for r in rows)), []).append("/".join(key))
    if len(groups) == 1:
        ((seeds, _),) = groups.items()
        return f"every setting: seeds {seed_ranges(seeds)} ({len(seeds)})"
    return "; ".join(
        f"seeds {seed_ranges(seeds)} ({len(seeds)}): " + ", ".join(keys)
        for seeds, keys in sorted(groups.items(), key=lambda kv: (-len(kv[0]), kv[0]))
    )


def _by_seed(cells: list[CellRun]) -> dict:
    return {c.axes.get("seed"): c for c in cells}


def _setting_text(rows: list[dict]) -> str:
    """rel with its interval, own gain with its interval, and the collapse rate with its Wilson interval."""
    k, n = collapses(rows)
    return (
        f"rel {_ci(over_seeds(rows, rel))}, own gain {_ci(over_seeds(rows, gain))}, {k}/{n} collapsed "
        f"{_ci(wilson(k, n)) if n else '-'}"
    )


def mean_over_steps(d: PaperData, cond: str, row: dict, key: str) -> float | None:
    """Mean over steps of metric `key` in the cell of `row` (a seed of setting (cond, remedy, mode))."""
    cell = _by_seed(d.cells[(cond, row["remedy"], row["mode"])]).get(row["seed"])
    xs = column(cell.metrics, key) if cell else []
    return math.fsum(xs) / len(xs) if xs else None


def rejection(rows: list[dict]) -> float | None:
    xs = [r.get("mean/rollout_corr/rollout_rs_seq_masked_fraction") for r in rows]
    xs = [x for x in xs if x is not None]
    return math.fsum(xs) / len(xs) if xs else None


def _power(diff: Interval) -> str:
    mde = detectable(diff)
    return (
        f"smallest detectable difference {fmt(mde)} at {POWER:.0%} power, {diff.n} seeds"
        if mde is not None
        else "too few seeds to state a detectable difference"
    )


def _signed(diff: Interval) -> str:
    if diff.lo is None:
        return NOT
    return REPRODUCED if diff.lo > 0 else REVERSED if diff.hi < 0 else NOT
