"""The words of every claims page: one rule that turns a test's numbers into a verdict (docs/verdicts.md).

A sub-claim is decided by one or more `Test`s (timbench.report.stats computes their numbers):

- `paired_effect(diffs, ...)`: a claimed difference (claimed direction > 0), one paired difference per seed; the
  t test's two-sided p.
- `paired_no_difference(diffs, margin, ...)`: a claimed *absence* of difference; equivalence by TOST within
  +-margin (the stated margin: half the baseline's own learning range unless a page says otherwise).
- `rate_vs_control(k, n, k0, n0)`: a rate (collapsed seeds, say) against its control's; Fisher's exact test.
- `rate_vs_threshold(k, n, share)`: a rate claimed to exceed a share ("most seeds"); the exact binomial test.

Every test of one named family (a paper figure, one claim of the claims page) gets Holm's adjusted p (`decide`),
and the word follows from it, in this order:

1. `not tested` before any test: fewer than 2 seeds, both arms at a floor (or ceiling), or the baseline does not
   learn on the grid the claim was tested on (its gain interval reaches 0);
2. `reproduced` / `reversed`: the adjusted p < ALPHA with the estimate in / against the claimed direction; for a
   no-difference claim `equivalent` (TOST adjusted p < ALPHA) or `not reproduced` (its 95% interval excludes 0);
3. `not tested` when nothing was detected and the smallest detectable difference (80% power) exceeds the
   learning range: the design could not have seen an effect as large as all the learning there is;
4. otherwise `not reproduced` (an effect claim the design could have detected and did not) or `inconclusive`
   (a no-difference claim that is neither equivalent nor different).

Implementation checks (zero mismatch is exactly 0.0, say) are not claims: `check(ok)` prints `check passes` /
`check fails` and they are counted apart.

The same tests, worded for three other pages:

- `warning_vs_false_alarms` (early-warning page): a metric `warns` when its early-warning rate on collapsed runs
  is above its false-alarm rate on surviving runs (Fisher's exact test, Holm over the page's candidates), else
  `does not warn`; `not tested` with no run on one side, or too few to detect even a perfect warning.
- `size_interaction` (proxy-fidelity page): the difference of paired differences (the proxy's A - B minus the
  reference model's, per seed) with its t interval; `transfers` when equivalent within the margin (TOST), `differs
  by size` when the interaction is detected, `inconclusive` otherwise; `not tested` when nothing happened at any
  size (neither model detects A - B), as `rate_interaction` for collapse rates (Fisher) when nothing collapses.
- `rank_labels` (leaderboards, submit): a rank is a tie unless its interval separates it from the next.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .stats import (
    ALPHA,
    POWER,
    Interval,
    detectable,
    fisher_exact,
    holm,
    mean_interval,
    proportion_difference,
    t_test,
    tost,
    wilson,
)

REPRODUCED, REVERSED, NOT = "reproduced", "reversed", "not reproduced"
EQUIVALENT = "equivalent"
"""A no-difference claim shown equivalent within its margin (TOST)."""
INCONCLUSIVE = "inconclusive"
"""A no-difference claim with power that is neither equivalent nor different."""
NOT_TESTED = "not tested"
CHECK_PASS, CHECK_FAIL = "check passes", "check fails"
"""Implementation checks: listed apart, outside the claim counts."""
STRENGTH = (REVERSED, NOT, NOT_TESTED, INCONCLUSIVE, EQUIVALENT, REPRODUCED)
"""Weakest first: a claim's headline is the weakest of its central sub-claims."""
WARNS, NO_WARNING = "warns", "does not warn"
"""Early-warning words: the early-warning rate is detected above the false-alarm rate, or it is not."""
TRANSFERS, DIFFERS = "transfers", "differs by size"
"""Proxy-fidelity words: the effect is equivalent across sizes (TOST on the interaction), or the interaction is
detected."""
TIED = "tied"
"""A rank whose interval does not separate it from its neighbour's."""
CORRECTION = "Holm"
"""The multiplicity correction within each family (stated on every page)."""


@dataclass
class Test:
    """One deciding test of a family: its estimate (claimed direction > 0), its p-values and its power."""

    kind: str
    """effect | no-difference | rate | threshold."""
    label: str
    estimate: float | None
    interval: Interval
    """The estimate's 95% interval (t over seeds; Wilson / Newcombe for rates)."""
    p: float | None
    """Raw p of the deciding test (two-sided difference; TOST for no-difference; one-sided binomial for a share)."""
    blocked: str | None = None
    """Why it is not tested before any test (floor, no learning, too few seeds)."""
    mde: float | None = None
    """Smallest detectable difference at POWER (paired tests)."""
    learning_range: float | None = None
    margin: float | None = None
    p_diff: float | None = None
    """No-difference claims: the difference's two-sided p (unadjusted: a detected difference refutes the claim)."""
    p_adj: float | None = None
    """Holm-adjusted p within the family (filled by `decide`)."""
    note: str = ""

    def word(self) -> str:
        if self.blocked:
            return NOT_TESTED
        detected = self.p_adj is not None and self.p_adj < ALPHA
        if self.kind == "warning":
            return WARNS if detected and (self.estimate or 0) > 0 else NO_WARNING
        if self.kind == "rate-interaction":  # no equivalence for a rate on a few seeds
            return DIFFERS if self.p_diff is not None and self.p_diff < ALPHA else INCONCLUSIVE
        if self.kind == "interaction":
            if self.p_diff is not None and self.p_diff < ALPHA:
                return DIFFERS
            if detected:
                return TRANSFERS
            if self.p is None or (
                self.mde is not None and self.learning_range is not None and self.mde > self.learning_range
            ):
                return NOT_TESTED
            return INCONCLUSIVE
        if self.kind == "no-difference":
            if detected:
                return EQUIVALENT
            if self.p_diff is not None and self.p_diff < ALPHA:
                return NOT
        elif detected:
            return REPRODUCED if (self.estimate or 0) > 0 else REVERSED
        if self.mde is not None and self.learning_range is not None and self.mde > self.learning_range:
            return NOT_TESTED
        if self.p is None:
            return NOT_TESTED
        return INCONCLUSIVE if self.kind == "no-difference" else NOT

    def text(self) -> str:
        """The test's numbers in one line: estimate, interval, p (adjusted), power, margin, why not tested."""
        from .leaderboard import fmt, fmt_interval  # deferred: torch is heavy

        parts = [f"{self.label}: {fmt_interval(self.interval)}"]
        if self.blocked:
            return parts[0] + f", not tested: {self.blocked}"
        if self.kind in ("no-difference", "interaction") and self.margin:
            parts.append(
                f"TOST margin +-{fmt(self.margin)} p {_p(self.p)} (Holm {_p(self.p_adj)}), difference p "
                f"{_p(self.p_diff)}"
            )
        elif self.kind in ("interaction", "rate-interaction"):
            parts.append(
                f"difference p {_p(self.p_diff)}"
                + ("" if self.margin or self.kind == "rate-interaction" else ", no equivalence margin")
            )
        else:
            parts.append(f"p {_p(self.p)} (Holm {_p(self.p_adj)})")
        if self.mde is not None:
            parts.append(
                f"smallest detectable {fmt(self.mde)} at {POWER:.0%} power, n {self.interval.n}"
                + (f" vs learning range {fmt(self.learning_range)}" if self.learning_range is not None else "")
            )
        return ", ".join(parts) + (f", {self.note}" if self.note else "")


def _p(p: float | None) -> str:
    return "-" if p is None else f"{p:.2g}" if p >= 0.001 else "<0.001"


def paired_effect(
    label: str, diffs: list[float], learning_range: float | None, floor: bool = False, baseline_learns: bool = True
) -> Test:
    """A claimed paired difference (claimed direction > 0, one value per seed)."""
    diffs = [float(x) for x in diffs if x is not None]
    iv = mean_interval(diffs)
    t = Test("effect", label, iv.mean, iv, t_test(diffs), mde=detectable(iv), learning_range=learning_range)
    t.blocked = _blocked(len(diffs), floor, baseline_learns, learning_range)
    return t


def paired_no_difference(
    label: str,
    diffs: list[float],
    margin: float | None,
    learning_range: float | None,
    floor: bool = False,
    baseline_learns: bool = True,
) -> Test:
    """A claimed absence of a paired difference: equivalence (TOST) within +-margin."""
    diffs = [float(x) for x in diffs if x is not None]
    iv = mean_interval(diffs)
    t = Test(
        "no-difference",
        label,
        iv.mean,
        iv,
        tost(diffs, margin) if margin else None,
        mde=detectable(iv),
        learning_range=learning_range,
        margin=margin,
        p_diff=t_test(diffs),
    )
    t.blocked = _blocked(len(diffs), floor, baseline_learns, learning_range) or (
        None if margin else "no equivalence margin (the baseline's learning range is unknown)"
    )
    return t


def rate_vs_control(label: str, k: int, n: int, k0: int, n0: int) -> Test:
    """Rate k/n claimed above its control's k0/n0 (Fisher's exact test; Newcombe interval of the difference)."""
    iv = proportion_difference(k0, n0, k, n) if n and n0 else Interval(None)
    t = Test(
        "rate",
        label,
        iv.mean,
        iv,
        fisher_exact(k, n, k0, n0) if n and n0 else None,
        note=f"{k}/{n} {_wilson(k, n)} vs control {k0}/{n0} {_wilson(k0, n0)}, Fisher exact",
    )
    if not n or not n0:
        t.blocked = "no seeds on one side"
    elif (k == 0 and k0 == 0) or (k == n and k0 == n0):
        t.blocked = f"both arms at {'0' if k == 0 else 'every seed'} (a floor: no rate to compare)"
    return t


def rate_vs_threshold(label: str, k: int, n: int, share: float) -> Test:
    """Rate k/n claimed above `share` (two-sided exact binomial test against p = share: twice the smaller tail,
    capped at 1); detected below the share, the claim is reversed."""
    p = None
    if n:
        pmf = [math.comb(n, i) * share**i * (1 - share) ** (n - i) for i in range(n + 1)]
        p = min(1.0, 2 * min(math.fsum(pmf[k:]), math.fsum(pmf[: k + 1])))
    t = Test(
        "threshold",
        label,
        (k / n - share) if n else None,
        wilson(k, n),
        p,
        note=f"{k}/{n} vs {share:.2g}, exact binomial",
    )
    t.blocked = None if n else "no seeds"
    return t


def _wilson(k: int, n: int) -> str:
    from .leaderboard import fmt_interval  # deferred: torch is heavy

    return fmt_interval(wilson(k, n)) if n else "-"


def _blocked(n: int, floor: bool, baseline_learns: bool, learning_range: float | None) -> str | None:
    if n < 2:
        return "fewer than 2 paired seeds"
    if floor:
        return "both arms at the floor (no accuracy left to lose)"
    if not baseline_learns or (learning_range is not None and learning_range <= 0):
        return "the baseline does not learn on this grid (its gain interval reaches 0)"
    return None


def check(ok: bool) -> str:
    return CHECK_PASS if ok else CHECK_FAIL


def decide(tests: list[Test]) -> list[Test]:
    """Holm's correction over one family's tests (the blocked ones are not tests and are left out)."""
    adj = holm([None if t.blocked else t.p for t in tests])
    for t, a in zip(tests, adj):
        t.p_adj = a
    return tests


def combine(words: list[str]) -> str:
    """A sub-claim decided by several tests ("at some condition"): reproduced if any test is, else the word
    that says most (reversed, not reproduced, ...), not tested only when no test could be made. The family's
    Holm correction is what makes "any of k" safe."""
    if not words:
        return NOT_TESTED
    for w in (REPRODUCED, EQUIVALENT, REVERSED, NOT, INCONCLUSIVE):
        if w in words:
            return w
    return NOT_TESTED


def warning_vs_false_alarms(label: str, early: int, collapsed: int, alarms: int, healthy: int) -> Test:
    """A candidate early warning: early warnings on `early` of `collapsed` runs against false alarms on `alarms` of
    `healthy` surviving runs (Fisher's exact test; the estimate is Youden's J, early rate - false-alarm rate, with
    Newcombe's interval). Not tested with no run on one side, or when even `collapsed`/`collapsed` early against
    0 false alarms would not be detected (too few runs)."""
    t = rate_vs_control(label, early, collapsed, alarms, healthy)
    t.kind, t.blocked = "warning", None  # 0 early and 0 false alarms is a metric that never warns, not a floor
    t.note = f"early {t.note.replace('vs control', 'vs false alarms')}"
    if not collapsed or not healthy:
        t.blocked = "no collapsed run or no surviving run logs it"
    elif fisher_exact(collapsed, collapsed, 0, healthy) >= ALPHA:
        t.blocked = f"too few runs: even {collapsed}/{collapsed} early against 0/{healthy} false alarms is not detected"
    return t


def size_interaction(
    label: str, ref: dict, other: dict, margin: float | None, learning_range: float | None, floor: bool = False
) -> Test:
    """Does a paired difference (A - B per seed, dicts seed -> value) transfer from the reference model to a proxy?
    The interaction, other[s] - ref[s] over the seeds both have, with its t interval: equivalence within +-margin
    (TOST), or a detected difference. Not tested when nothing happened at any size (neither model's own A - B nor
    the interaction is detected: there is no effect to carry over), with fewer than 2 seeds, or both arms at a
    floor."""
    seeds = sorted(set(ref) & set(other))
    t = paired_no_difference(label, [other[s] - ref[s] for s in seeds], margin, learning_range, floor)
    t.kind = "interaction"
    t.blocked = _blocked(len(seeds), floor, True, None)
    sizes = [t_test(list(d.values())) for d in (ref, other)]
    moved = t.p_diff is not None and t.p_diff < ALPHA  # a detected interaction is a finding even so
    if not t.blocked and not moved and not any(p is not None and p < ALPHA for p in sizes):
        t.blocked = "nothing happened at any size (neither model detects A - B)"
    return t


def rate_interaction(label: str, k_ref: int, n_ref: int, k: int, n: int) -> Test:
    """A collapse rate on the proxy (k/n) against the same setting's on the reference model (Fisher's exact test):
    `differs by size` when detected (unadjusted, as a difference that refutes a no-difference claim), else
    `inconclusive` (a rate's equality is not shown by 2-6 seeds); not tested
    when nothing collapses at any size."""
    t = rate_vs_control(label, k, n, k_ref, n_ref)
    t.kind, t.p_diff, t.p = "rate-interaction", t.p, None
    t.note = t.note.replace("vs control", "vs the reference model")
    if n and n_ref and k == 0 and k_ref == 0:
        t.blocked = "nothing happened at any size (no seed collapses on either model)"
    elif n and n_ref:
        t.blocked = None  # every seed collapsing on both is a shared verdict, tested like any other
    return t


def tie_groups(intervals: list[Interval]) -> list[list[int]]:
    """Positions of entries sorted best first, grouped: a rank is a tie unless its interval separates it from the
    next one's; overlapping neighbours chain into one group, and an entry without an interval ties with its
    neighbours."""
    groups: list[list[int]] = []
    for i, iv in enumerate(intervals):
        prev = intervals[i - 1] if i else None
        if prev is not None and (iv.lo is None or prev.lo is None or iv.overlaps(prev)):
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


def rank_labels(intervals: list[Interval], start: int = 0) -> list[str]:
    """Printed ranks (after `start` entries ranked before these): "2-4 (tied)" for a tie group, the rank alone for
    an entry its interval separates from both neighbours."""
    out = [""] * len(intervals)
    for g in tie_groups(intervals):
        for i in g:
            out[i] = f"{start + g[0] + 1}" if len(g) == 1 else f"{start + g[0] + 1}-{start + g[-1] + 1} ({TIED})"
    return out
