"""The registry of the field's claims (`CLAIMS`), their verdict vocabulary and the pieces the rules share.

A claim is data (id, source, the claim as published) plus one small rule function (registered with `@claim`
in timbench.studies.claims_rules) that returns its sub-claims (timbench.studies.paper_claims.Sub), each with
the numbers and the rule that decided it. The vocabulary is `timbench paper`'s: reproduced (the claimed effect
is detected: a 95% interval over seeds, paired by seed, excludes no effect in the claimed direction),
consistent, no difference detected (a claim of no difference whose interval contains 0, with the smallest
detectable effect), not reproduced, reversed; plus `not testable here` (no committed grid or table holds the
cells, with which would) and `reproduced (demonstration, one seed)` for a one-seed alignment measurement.
A claim's headline is its weakest central sub-claim (`headline`). Sources: shared/reference/tim-literature.md
and each rule's docstring. Pure functions of Evidence (timbench.studies.claims_data).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

from ..report.verdict_rules import EQUIVALENT, INCONCLUSIVE, NOT_TESTED, Test, paired_effect, paired_no_difference
from .claims_data import Evidence
from .paper_claims import (
    CONSISTENT,
    NOT,
    REPRODUCED,
    REVERSED,
    Sub,
    _setting_text,
    at_floor,
    collapses,
    diffs,
    mean_over_steps,
    over_seeds,
    rel,
)

NOT_TESTABLE = "not testable here"
DEMO = "reproduced (demonstration, one seed)"
"""A deterministic alignment measurement (one seed, thousands of tokens) that shows the effect."""
STRENGTH = (REVERSED, NOT, NOT_TESTABLE, NOT_TESTED, CONSISTENT, INCONCLUSIVE, EQUIVALENT, DEMO, REPRODUCED)
"""Weakest first: a claim's headline is its weakest central sub-claim."""
CLAIMS_GRID = "bench/grids/claims.yaml"
"""The grid that runs the settings no committed grid has (fp16, MIS, IcePop, FP8 + TIS)."""
FAR_BELOW = 10.0
"""'Far below': the fp16 side's k3_kl at least this factor under bf16's (the source reports ~24x)."""
ICEPOP_BAND = (0.5e-3, 4e-3)
"""IcePop's 'masks ~1-2 per mille', read with a factor-2 tolerance."""
THRESHOLD = 0.05
"""'Training essentially fails once the discrepancy exceeds 0.05' (IcePop, Ring-mini-2.0)."""


@dataclass(frozen=True)
class Claim:
    id: str
    source: str
    text: str
    rule: Callable[[Evidence], list[Sub]]


CLAIMS: list[Claim] = []


def claim(id: str, source: str, text: str):
    """Register a rule function as the claim `id` (in the order claims.md lists them)."""

    def add(rule):
        CLAIMS.append(Claim(id, source, text, rule))
        return rule

    return add


def headline(subs: list[Sub]) -> str:
    """The weakest central sub-claim's verdict, with how many sub-claims were reproduced when not all."""
    central = [REPRODUCED if s.verdict == EQUIVALENT else s.verdict for s in subs if s.central]
    if not central:
        return NOT_TESTABLE
    head = min(central, key=STRENGTH.index)  # an equivalence is how a no-difference claim is reproduced
    done = sum(1 for s in subs if s.verdict in (REPRODUCED, DEMO, EQUIVALENT))
    return (
        head
        if done in (0, len(subs)) or head in (REPRODUCED, DEMO)
        else f"{head} ({done} of {len(subs)} sub-claims reproduced)"
    )


# ---------------------------------------------------------------- shared pieces


def damaged(rows: list[dict]) -> bool:
    """A setting lost ground: >= 2/3 of its seeds collapsed, or its relative accuracy interval lies below 1."""
    k, n = collapses(rows)
    iv = over_seeds(rows, rel)
    return bool(n) and (k * 3 >= 2 * n or (iv.hi is not None and iv.hi < 1))


def untestable(what: str, would: str = CLAIMS_GRID) -> str:
    return f"no committed grid runs {what}; the grid that would: {would}"


def _setting(rows: list[dict]) -> str:
    return _setting_text(rows)


def no_difference(a: list[dict], b: list[dict], d, key=rel, label: str = "paired difference") -> Test:
    """A claim of no difference in relative accuracy: equivalence (TOST) within half the grid's learning range
    (verdict_rules); not tested where the grid's baseline does not learn or both sides sit at the floor."""
    lr, learns, _ = d.learning()
    return paired_no_difference(label, diffs(a, b, key), lr / 2 if lr and lr > 0 else None, lr, at_floor(a, b), learns)


def effect(label: str, a: list[dict], b: list[dict], d, key=None) -> Test:
    """A claimed paired difference a - b > 0: of relative accuracy (key None; judged against the grid's learning
    range and floor) or of a per-seed metric `key` (a mismatch measure: no learning range applies)."""
    if key is not None:
        return paired_effect(label, diffs(a, b, key), None)
    lr, learns, _ = d.learning()
    return paired_effect(label, diffs(a, b), lr, at_floor(a, b), learns)


def half(words: list[str]) -> str:
    """Reproduced where at least half of the tested settings are (a setting not tested, at the floor or on a grid
    whose baseline does not learn, does not count; Holm within the claim makes 'at some' fair)."""
    tested = [w for w in words if w != NOT_TESTED]
    if not tested:
        return NOT_TESTED
    up, down = tested.count(REPRODUCED), tested.count(REVERSED)
    return REPRODUCED if up * 2 >= len(tested) else REVERSED if down > up else NOT


def step_mean(key: str):
    """Per-seed key: the mean over steps of the metric `key` in that seed's cell."""
    return lambda d, cond: lambda r: mean_over_steps(d, cond, r, key)


def same_runs(d, *settings) -> frozenset:
    """The identities of the runs behind `settings` of one grid: per cell its setting's position, full RunConfig,
    model and engine / trainer specs. Training is bitwise deterministic, so equal identities in two grids are
    byte-identical runs (e.g. results/paper and results/claims_grid share their nvfp4 none / tis_token cells,
    and results/paper's six seeds hold claims_grid's three)."""
    return frozenset(
        json.dumps(
            {
                "setting": i,
                "config": c.config,
                "model": c.axes.get("model"),
                "engine": c.condition.get("engine"),
                "trainer": c.condition.get("trainer"),
            },
            sort_keys=True,
        )
        for i, s in enumerate(settings)
        for c in d.cells.get(s, [])
    )


def remedy_gain(ev: Evidence, remedy: str) -> tuple:
    """`remedy` vs none on every (grid, condition, mode) where none lost ground: (rule, numbers, tests), one paired
    test of the gain in relative accuracy per setting; reproduced when detected at >= half of them (`half`),
    reversed when a loss is detected at more than a gain.
    Staleness conditions (kind async) are left out: they test policy lag, not training-inference mismatch.
    Runs committed in several grids are one piece of evidence: a setting whose runs are all among another
    grid's (the same runs, or a subset of its seeds) is counted there, once, with the most seeds."""
    cands = []
    for name, d in ev.grids.items():
        for (cond, rem, mode), rows in d.rows.items():
            none = d.rows.get((cond, "none", mode))
            if rem != remedy or not none or not damaged(none) or d.kinds.get(cond) == "async":
                continue
            cands.append((same_runs(d, (cond, rem, mode), (cond, "none", mode)), name, cond, mode, none, rows))
    kept, also = [], {}  # indices into cands; kept index -> names of grids holding (a subset of) its runs
    for i in sorted(range(len(cands)), key=lambda i: -len(cands[i][0])):  # most runs first; ties in grid order
        home = next((j for j in kept if cands[i][0] <= cands[j][0]), None)
        if home is None:
            kept.append(i)
        else:
            also.setdefault(home, []).append(cands[i][1])
    texts, tests = [], []
    for j in sorted(kept):
        _, name, cond, mode, none, rows = cands[j]
        same = f" (these runs, or a subset of them, also in: {', '.join(also[j])})" if j in also else ""
        texts.append(f"{name} {cond}/{mode}: none {_setting(none)}, {remedy} {_setting(rows)}{same}")
        tests.append(effect(f"{name} {cond}/{mode} gain", rows, none, ev.grids[name]))
    if not tests:
        return NOT_TESTABLE, untestable(f"{remedy} next to none on a mismatched condition that loses accuracy"), []
    return half, "; ".join(texts), tests
