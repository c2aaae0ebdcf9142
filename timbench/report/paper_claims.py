"""The seed paper's claims (arXiv 2605.14220) as tests over a grid's results: one verdict per claim.

Each claim is a *family* of sub-claims; each sub-claim is decided by one or more tests of
timbench.report.verdict_rules (paired t tests over seeds, TOST with a stated margin for a claim of no
difference, Fisher's exact test for a rate against its control, the exact binomial test for a share), Holm's
correction over the family's tests, and that module's one rule from tests to words: reproduced, reversed,
equivalent, not reproduced, inconclusive, not tested (fewer than 2 seeds, both arms at the floor, a baseline
that does not learn, or a smallest detectable difference above the learning range). Every accuracy is the
grid's endpoint (timbench.report.endpoint; default the mean eval accuracy T=1 over the last half of the run),
relative to the same seed's zero-mismatch run; the learning range is the zero-mismatch run's own relative gain
(endpoint - the step-0 eval, over the endpoint) and the equivalence margin half of it. Implementation checks
(zero mismatch gives exactly 0.0) are listed apart and do not count as claims. A claim's headline is its weakest
central sub-claim (verdict_rules.STRENGTH); a sub-claim marked not central (a literature add-on, or not the
paper's claim) is shown but does not set it.

Pure functions of `PaperData` (built by timbench.report.paper); nothing here reads files or draws.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from itertools import groupby

from .collapse import moving_average
from .leaderboard import fmt, fmt_interval
from .results import CellRun, column
from .stats import Interval, detectable, mean_interval, POWER
from .verdict_rules import (EQUIVALENT, INCONCLUSIVE, NOT, NOT_TESTED, REPRODUCED, REVERSED, STRENGTH, Test, check,
                            combine, decide, paired_effect, paired_no_difference, rate_vs_control, rate_vs_threshold)

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
    """The endpoint the rows' endpoint_* columns hold (timbench.report.endpoint)."""
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
        rel_gain = mean_interval([r["gain_t1"] / r["endpoint_t1"] for r in ref
                                  if r.get("gain_t1") is not None and r.get("endpoint_t1")])
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
        return head if done in (0, len(claims)) or head in (REPRODUCED, EQUIVALENT) else \
            f"{head} ({done} of {len(claims)} sub-claims reproduced)"


def sub_json(s: Sub) -> dict:
    """A sub-claim for the pages' JSON: its words, numbers and each deciding test."""
    return {"text": s.text, "verdict": s.verdict, "numbers": s.numbers, "central": s.central, "check": s.check,
            "tests": [{"label": t.label, "kind": t.kind, "estimate": t.estimate, "lo": t.interval.lo,
                       "hi": t.interval.hi, "n": t.interval.n, "p": t.p, "p_holm": t.p_adj, "margin": t.margin,
                       "smallest_detectable": t.mde, "not_tested": t.blocked, "word": t.word()} for t in s.tests]}


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
    return [key(r) - key(bs[r["seed"]]) for r in a if r["seed"] in bs and key(r) is not None
            and key(bs[r["seed"]]) is not None]


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
    g, gr = column(cell.metrics, "actor/grad_norm"), (column(ref.metrics, "actor/grad_norm") if ref else [])
    return max(g) / max(gr) if g and gr and max(gr) > 0 else None


def rose_before_collapse(cell: CellRun, row: dict, smooth: int) -> bool:
    """The smoothed reward climbed above its first full-window value before the collapse step."""
    rewards = moving_average(column(cell.metrics, "critic/rewards/mean"), smooth)
    step = row.get("collapse/step")
    if step is None or len(rewards) < smooth:
        return False
    return max(rewards[smooth - 1:max(smooth, step)], default=0.0) > rewards[smooth - 1] * 1.05


def kl_alarm_step(cell: CellRun, smooth: int) -> int | None:
    """First step at which the smoothed k3_kl exceeds KL_RISE x its mean over steps 0-4."""
    k3 = moving_average(column(cell.metrics, "rollout_corr/k3_kl"), smooth)
    first = column(cell.metrics, "rollout_corr/k3_kl")[:5]
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
        (seeds, _), = groups.items()
        return f"every setting: seeds {seed_ranges(seeds)} ({len(seeds)})"
    return "; ".join(f"seeds {seed_ranges(seeds)} ({len(seeds)}): " + ", ".join(keys)
                     for seeds, keys in sorted(groups.items(), key=lambda kv: (-len(kv[0]), kv[0])))


def _by_seed(cells: list[CellRun]) -> dict:
    return {c.axes.get("seed"): c for c in cells}


# ---------------------------------------------------------------- F1-F5 and the dose-response

def _setting_text(rows: list[dict]) -> str:
    """rel with its interval, own gain with its interval, and the collapse rate with its Wilson interval."""
    from .stats import wilson
    k, n = collapses(rows)
    return (f"rel {_ci(over_seeds(rows, rel))}, own gain {_ci(over_seeds(rows, gain))}, {k}/{n} collapsed "
            f"{_ci(wilson(k, n)) if n else '-'}")


def f1(d: PaperData) -> Verdict:
    lr, learns, g = d.learning()
    ref = d.rows.get(d.reference, [])
    subs = [Sub("the zero-mismatch run keeps improving (own gain: endpoint - step-0 eval accuracy T=1 > 0)", "",
                f"gain {_ci(g)} over {g.n} seeds", tests=[paired_effect("gain", [gain(r) for r in ref], None)])]
    k0, n0 = collapses(ref)
    coll, rose_tests, parts = [], [], []
    for cond in d.real():
        for mode in ("recompute", "bypass"):
            rows = d.setting(cond, mode=mode)
            if not rows:
                continue
            k, n = collapses(rows)
            cells = _by_seed(d.cells[(cond, "none", mode)])
            rose = sum(rose_before_collapse(cells[r["seed"]], r, d.smooth) for r in rows if r.get("collapse/collapsed"))
            parts.append(f"{cond}/{mode} {_setting_text(rows)} ({rose} after a rise)")
            coll.append(rate_vs_control(f"{cond}/{mode} collapses vs zero mismatch", k, n, k0, n0))
            if k:
                rose_tests.append(rate_vs_threshold(f"{cond}/{mode} rose first", rose, k, SHARE))
    subs.append(Sub("a mismatched real engine's run collapses more often than the zero-mismatch run (Fisher's exact "
                    "test per setting, remedy none)", "", "; ".join(parts) or "no mismatched cells", tests=coll))
    subs.append(Sub(f"... after first rising (more than {SHARE:.0%} of a setting's collapsed seeds' smoothed reward "
                    "rose 5% above its first window before the collapse; exact binomial test)", UNTESTED,
                    "" if rose_tests else "no collapsed setting", tests=rose_tests))
    return family("F1", subs)


F2_SUBS = (f"recompute degrades (relative accuracy < 1, paired) with grad-norm spikes (the seed's max grad norm over "
           "the same seed's zero-mismatch max > 1 on the log scale, paired)",
           f"bypass degrades silently (collapses more often than zero mismatch, Fisher; and its max grad norm is "
           f"within {SPIKE:g}x the same seed's zero-mismatch max, TOST on the log scale)",
           "bypass ends below recompute (recompute - bypass relative accuracy > 0, paired; not the paper's claim)")
"""F2's sub-claims, in order."""


def _both(words: list[str]) -> str:
    """A condition passes a two-part rule only when both parts do (reproduced, or equivalent for a no-difference
    part); the parts' weakest word otherwise."""
    return REPRODUCED if all(w in (REPRODUCED, EQUIVALENT) for w in words) else min(words, key=_strength)


def _pairs_rule(words: list[str]) -> str:
    """Tests come in (part 1, part 2) pairs, one pair per condition: reproduced at some condition where both are."""
    return combine([_both(words[i:i + 2]) for i in range(0, len(words), 2)])


def f2(d: PaperData) -> Verdict:
    ref = _by_seed(d.cells.get(d.reference, []))
    lr, learns, _ = d.learning()
    k0, n0 = collapses(d.rows.get(d.reference, []))
    spike, silent, worse, parts = [], [], [], []
    for cond in d.real():
        rec, byp = d.setting(cond, mode="recompute"), d.setting(cond, mode="bypass")
        if not rec or not byp:
            continue
        ratios = {}
        for mode, rows in (("recompute", rec), ("bypass", byp)):
            cells = _by_seed(d.cells[(cond, "none", mode)])
            ratios[mode] = [max_grad_ratio(cells[r["seed"]], ref.get(r["seed"])) for r in rows]
        logs = {m: [math.log(x) for x in v if x] for m, v in ratios.items()}
        spike += [paired_effect(f"{cond} recompute: 1 - rel", [1 - x for x in (rel(r) for r in rec) if x is not None],
                                lr, baseline_learns=learns),
                  paired_effect(f"{cond} recompute: log max grad ratio", logs["recompute"], None)]
        (kb, nb) = collapses(byp)
        silent += [rate_vs_control(f"{cond} bypass collapses vs zero mismatch", kb, nb, k0, n0),
                   paired_no_difference(f"{cond} bypass: log max grad ratio", logs["bypass"], math.log(SPIKE), None)]
        worse.append(paired_effect(f"{cond}: recompute - bypass rel", diffs(rec, byp), lr, at_floor(rec, byp),
                                   learns))
        parts.append(f"{cond}: recompute {_setting_text(rec)}, max grad {_ratio_text(ratios['recompute'])}; bypass "
                     f"{_setting_text(byp)}, max grad {_ratio_text(ratios['bypass'])}")
    if not parts:  # e.g. a recompute-only grid (bench/grids/rise_collapse.yaml): F2 compares the two modes
        return Verdict("F2", [Sub(text, UNTESTED, "no condition has cells in both recompute and bypass mode")
                              for text in F2_SUBS])
    return family("F2", [Sub(F2_SUBS[0], _pairs_rule, " | ".join(parts), tests=spike),
                         Sub(F2_SUBS[1], _pairs_rule, "", tests=silent),
                         Sub(F2_SUBS[2], "", "", central=False, tests=worse)])


def _ratio_text(xs: list) -> str:
    xs = [x for x in xs if x]
    return f"{fmt(min(xs), 2)}-{fmt(max(xs), 2)}x the same seed's zero-mismatch max" if xs else "-"


def _kl_ratio_end(cell: CellRun) -> float | None:
    """Mean k3_kl over the last 10 steps / its mean over the first 5 (None when the start is 0)."""
    k3 = column(cell.metrics, "rollout_corr/k3_kl")
    start, end = k3[:5], k3[-10:]
    return None if not start or math.fsum(start) <= 0 else (math.fsum(end) / len(end)) / (math.fsum(start) / len(start))


def f3(d: PaperData) -> Verdict:
    """Counted on real conditions only: under synthetic noise the KL level is the dial itself, so it is listed
    but cannot test the claim."""
    counts = {"real": [0, 0], "noise": [0, 0]}  # [late, early]
    too_soon, detail = 0, []
    for (cond, remedy, mode), rows in d.rows.items():
        if remedy != "none" or d.kinds.get(cond) == "reference":
            continue
        kind = "noise" if d.kinds.get(cond) == "noise" else "real"
        cells = _by_seed(d.cells[(cond, remedy, mode)])
        for r in rows:
            if not r.get("collapse/collapsed") or r.get("collapse/step") is None:
                continue
            if r["collapse/step"] < 5 + KL_LEAD:  # no room for a warning after the KL's 5-step reference window
                too_soon += 1
                continue
            alarm = kl_alarm_step(cells[r["seed"]], d.smooth)
            early = alarm is not None and r["collapse/step"] - alarm >= KL_LEAD
            counts[kind][early] += 1
            detail.append(f"{cond}/{mode}/s{r['seed']}: collapse {r['collapse/step']}, KL x{KL_RISE:g} at "
                          f"{'never' if alarm is None else alarm}")
    late, early = counts["real"]
    n = late + early
    t1 = rate_vs_threshold("real collapsed seeds without an early KL warning", late, n, SHARE)
    if n < 3:
        t1.blocked = f"{n} real collapsed seed(s) with room for a warning (fewer than 3)"
    subs = [Sub(f"real conditions: K3 stays near its starting level until the reward falls (no rise above "
                f"{KL_RISE:g}x its first 5 steps at least {KL_LEAD} steps before a collapse, in more than "
                f"{SHARE:.0%} of the collapsed seeds; exact binomial test, >= 3 seeds)",
                UNTESTED, f"{late}/{n} collapsed seeds without an early KL warning, {early}/{n} with one; noise "
                f"conditions (not counted): {counts['noise'][0]} without, {counts['noise'][1]} with; {too_soon} seeds "
                f"collapsed before step {5 + KL_LEAD}, too early to tell; " + "; ".join(detail), tests=[t1])]
    flat, seen, parts = 0, 0, []
    for cond in d.real():
        rows = d.setting(cond)
        r_iv = over_seeds(rows, rel)
        if not rows or r_iv.hi is None or r_iv.hi >= 1:
            continue
        cells = _by_seed(d.cells[(cond, "none", "recompute")])
        ratios = [_kl_ratio_end(cells[r["seed"]]) for r in rows]
        seen += len(ratios)
        flat += sum(1 for x in ratios if x is not None and x < KL_RISE)
        parts.append(f"{cond}: rel {_ci(r_iv)}, K3 last 10 / first 5 steps = "
                     + ", ".join("-" if x is None else f"{x:.2f}" for x in ratios))
    t2 = rate_vs_threshold("seeds whose K3 stays flat", flat, seen, SHARE)
    subs.append(Sub(f"real conditions, recompute, accuracy lost (rel interval below 1): K3 ends within {KL_RISE:g}x "
                    f"its start in more than {SHARE:.0%} of the seeds (exact binomial test)", UNTESTED,
                    f"{flat}/{seen} seeds flat; " + ("; ".join(parts) or "no such setting"), tests=[t2] if seen else []))
    return family("F3", subs)


def f4(d: PaperData) -> Verdict:
    """Both 'coincide under zero mismatch' and 'separate under mismatch' hold by construction when the code is
    right (C(r) of two identical old policies is identical): implementation checks, not findings. The skew by
    the sign of A is the claim (two-sided paired test per condition, at >= half of the conditions)."""
    ref_max = max((abs(x) for c in d.cells.get(d.reference, []) for x in column(c.metrics, "drift/diff_abs_mean")),
                  default=None)
    subs = [Sub("zero mismatch: C(r_train) and C(r_rollout) coincide (max |difference| == 0.0 over every step)",
                check(ref_max == 0.0), f"max |diff| = {ref_max!r} over {len(d.cells.get(d.reference, []))} "
                "reference cells", check=True)]
    sep, tests, parts = [], [], []
    for cond in d.real() + [c for c, k in d.kinds.items() if k == "noise"]:
        rows = d.setting(cond)
        if not rows:
            continue
        absd = over_seeds(rows, lambda r: r.get("cum/drift/diff_abs_mean"))
        pos = over_seeds(rows, lambda r: mean_over_steps(d, cond, r, "drift/diff_pos_adv_mean"))
        neg = over_seeds(rows, lambda r: mean_over_steps(d, cond, r, "drift/diff_neg_adv_mean"))
        if absd.mean and absd.mean > 0:
            sep.append(cond)
        t = paired_effect(f"{cond}: A>0 minus A<0", [_gap(d, cond, r) for r in rows], None)
        t.estimate = abs(t.estimate) if t.estimate is not None else None  # either sign is a skew
        tests.append(t)
        parts.append(f"{cond}: A>0 {_ci(pos)}, A<0 {_ci(neg)}")
    subs.append(Sub("mismatch: they separate (cumulative |difference| > 0), recompute mode",
                    UNTESTED if not parts else check(bool(sep)), f"{len(sep)} conditions: {', '.join(sep) or 'none'}",
                    check=True))
    half = lambda ws: REPRODUCED if ws.count(REPRODUCED) * 2 >= len(ws) else combine(  # noqa: E731
        [w for w in ws if w != REPRODUCED])
    subs.append(Sub("... skewed by the sign of A (the seeds' A > 0 mean minus A < 0 mean differs from 0, two-sided "
                    "paired t test, at >= half of the conditions)", half if tests else UNTESTED, "; ".join(parts),
                    tests=tests))
    return family("F4", subs)


def _gap(d: PaperData, cond: str, row: dict) -> float | None:
    pos, neg = (mean_over_steps(d, cond, row, f"drift/diff_{s}_adv_mean") for s in ("pos", "neg"))
    return None if pos is None or neg is None else pos - neg


def mean_over_steps(d: PaperData, cond: str, row: dict, key: str) -> float | None:
    """Mean over steps of metric `key` in the cell of `row` (a seed of setting (cond, remedy, mode))."""
    cell = _by_seed(d.cells[(cond, row["remedy"], row["mode"])]).get(row["seed"])
    xs = column(cell.metrics, key) if cell else []
    return math.fsum(xs) / len(xs) if xs else None


def rejection(rows: list[dict]) -> float | None:
    xs = [r.get("mean/rollout_corr/rollout_rs_seq_masked_fraction") for r in rows]
    xs = [x for x in xs if x is not None]
    return math.fsum(xs) / len(xs) if xs else None


def _all(words: list[str]) -> str:
    """A claim over every comparison ("closest": better than each other remedy): reproduced only if all are."""
    return REPRODUCED if words and all(w == REPRODUCED for w in words) else \
        min(words, key=_strength) if words else UNTESTED


def f5(d: PaperData, variants: dict[str, dict]) -> Verdict:
    """`variants`: remedy label -> its config ({remedy, remedy_args, eps_low, ...}) at the remedy condition."""
    cond = remedy_condition(d)
    if cond is None:
        return Verdict("F5", [])
    lr, learns, _ = d.learning()
    margin = lr / 2 if lr and lr > 0 else None
    rec = {lab: d.setting(cond, lab) for lab in variants if d.setting(cond, lab)}
    args = lambda lab: variants[lab].get("remedy_args") or {}  # noqa: E731
    tis_rs = [l for l in rec if variants[l]["remedy"] == "tis_token+seq_rs" and args(l).get("ratio", "rho") == "rho"]
    ranked = sorted(rec, key=lambda l: abs(1 - (over_seeds(rec[l], rel).mean or 0)))
    best = next((l for l in ranked if l in tis_rs), None)
    order = ", ".join(f"{l} {_ci(over_seeds(rec[l], rel))}" for l in ranked)
    dist = lambda r: None if rel(r) is None else abs(1 - rel(r))  # noqa: E731
    closest = [paired_effect(f"{o} - {best} |1 - rel|", diffs(rec[o], rec[best], dist), lr,
                             baseline_learns=learns) for o in rec if best and o not in tis_rs]
    subs = [Sub("token TIS + sequence rejection is closest to the zero-mismatch run (its |1 - rel| below every other "
                "remedy's, paired, each)", _all if closest else UNTESTED, f"{cond}, recompute, by |1 - rel|: {order}",
                tests=closest)]
    ppo = [l for l in rec if variants[l]["remedy"] == "tis_token+seq_rs" and args(l).get("ratio") == "ppo"]
    for p in ppo:
        twin = next((l for l in tis_rs if {**args(l), "ratio": "ppo"} == args(p)), None)
        if twin:
            subs.append(Sub(f"rejection on rho beats rejection on the PPO ratio ({twin} - {p} > 0)", "",
                            f"rejected seqs: on rho {fmt(rejection(rec[twin]))}, on PPO ratio "
                            f"{fmt(_ppo_rejection(d, cond, p))}",
                            tests=[paired_effect(f"{twin} - {p}", diffs(rec[twin], rec[p]), lr,
                                                 at_floor(rec[twin], rec[p]), learns)]))
    k1s = [l for l in tis_rs if args(l).get("divergence") == "k1"]
    k3s = [l for l in tis_rs if args(l).get("divergence", "k3") == "k3"]
    for a in k1s:
        if not k3s:
            break
        b = min(k3s, key=lambda l: abs((rejection(rec[l]) or 0) - (rejection(rec[a]) or 0)))  # matched acceptance
        subs.append(Sub(f"K1 and K3 work about equally as the sequence criterion ({a} vs {b}, matched rejection; "
                        "equivalence within half the learning range)", "",
                        f"rejected seqs {fmt(rejection(rec[a]))} vs {fmt(rejection(rec[b]))}",
                        tests=[paired_no_difference(f"{a} - {b}", diffs(rec[a], rec[b]), margin, lr,
                                                    at_floor(rec[a], rec[b]), learns)]))
    clips = [l for l in variants if variants[l]["remedy"] == "none" and variants[l].get("eps_low") is not None]
    for lab in clips:
        for mode in ("recompute", "bypass"):
            mine, none = d.setting(cond, lab, mode), d.setting(cond, "none", mode)
            if not mine or not none:
                continue
            short = paired_effect(f"{lab} ({mode}): 1 - rel", [1 - x for x in (rel(r) for r in mine) if x is not None],
                                  lr, at_floor(mine), learns)
            fixed = paired_effect(f"{lab} ({mode}) - none rel", diffs(mine, none), lr, at_floor(mine, none), learns)
            subs.append(Sub(f"tightening the PPO clip is not a fix ({lab}, {mode}: still short of the zero-mismatch "
                            "run; reversed when it gains over none and is not short)", _clip_rule,
                            f"{_setting_text(mine)}", tests=[short, fixed]))
    return family("F5", subs)


def _clip_rule(words: list[str]) -> str:
    short, fixed = words
    if short == REPRODUCED:
        return REPRODUCED
    if fixed == REPRODUCED and short in (NOT, REVERSED):
        return REVERSED
    return short


def _ppo_rejection(d: PaperData, cond: str, lab: str) -> float | None:
    vals = [mean_over_steps(d, cond, r, "actor/ppo_rs_seq_masked_fraction") for r in d.setting(cond, lab)]
    vals = [v for v in vals if v is not None]
    return math.fsum(vals) / len(vals) if vals else None


def _power(diff: Interval) -> str:
    mde = detectable(diff)
    return f"smallest detectable difference {fmt(mde)} at {POWER:.0%} power, {diff.n} seeds" if mde is not None \
        else "too few seeds to state a detectable difference"


def _signed(diff: Interval) -> str:
    if diff.lo is None:
        return NOT
    return REPRODUCED if diff.lo > 0 else REVERSED if diff.hi < 0 else NOT


def remedy_condition(d: PaperData) -> str | None:
    """The condition the remedy ablation ran on: the one with the most remedies (ties: grid order)."""
    counts: dict[str, int] = {}
    for cond, remedy, _ in d.rows:
        if d.kinds.get(cond) != "reference":
            counts[cond] = counts.get(cond, 0) + (remedy != "none")
    best = max(counts.items(), key=lambda kv: kv[1], default=(None, 0))
    return best[0] if best[1] else None


def dose_points(d: PaperData) -> list[dict]:
    pts = []
    for (cond, remedy, mode), rows in d.rows.items():
        if remedy != "none" or d.kinds.get(cond) == "reference":
            continue
        k, n = collapses(rows)
        pts.append({"label": cond, "mode": mode, "kind": d.kinds.get(cond), "collapses": k, "seeds": n,
                    "x": over_seeds(rows, lambda r: r.get("mean/mismatch/mean_abs_delta")),
                    "y": over_seeds(rows, rel), "sigma": rows[0].get("noise_sigma")})
    return pts


def spearman(xs: list[float], ys: list[float]) -> float | None:
    """Rank correlation (no ties expected; ties get the order they come in)."""
    if len(xs) < 3:
        return None
    rank = lambda v: {i: r for r, i in enumerate(sorted(range(len(v)), key=lambda i: v[i]))}  # noqa: E731
    rx, ry = rank(xs), rank(ys)
    n = len(xs)
    return 1 - 6 * math.fsum((rx[i] - ry[i]) ** 2 for i in range(n)) / (n * (n * n - 1))


def dose(d: PaperData) -> Verdict:
    """Per mode, the noise sweep's damage rising with its dose is tested per seed (rel at the smallest sigma minus
    rel at the largest, paired; Spearman over the sweep's means is shown, not tested: 3-4 points)."""
    pts = dose_points(d)
    lr, learns, _ = d.learning()
    subs, thresholds = [], {}
    for mode in ("recompute", "bypass"):
        noise = sorted((p for p in pts if p["mode"] == mode and p["kind"] == "noise" and p["y"].mean is not None),
                       key=lambda p: p["sigma"] or 0)
        rho = spearman([p["x"].mean for p in noise], [p["y"].mean for p in noise])
        tests = []
        if len(noise) >= 2:
            lo, hi = (d.setting(noise[i]["label"], mode=mode) for i in (0, -1))
            tests = [paired_effect(f"sigma {noise[0]['sigma']:g} - sigma {noise[-1]['sigma']:g} rel", diffs(lo, hi),
                                   lr, at_floor(lo, hi), learns)]
        subs.append(Sub(f"{mode}: relative accuracy falls as the noise dose rises (smallest minus largest sigma > 0, "
                        "paired)", UNTESTED, f"Spearman over sigma {fmt(rho, 2)} (not a test); "
                        + ", ".join(f"sigma {p['sigma']:g}: |delta| {fmt(p['x'].mean)} rel {_ci(p['y'])} "
                                    f"({p['collapses']}/{p['seeds']})" for p in noise), tests=tests))
        thresholds[mode] = {p["sigma"]: p for p in noise}
    subs.append(_on_the_noise_curve(d, pts, lr, learns))
    common = sorted(set(thresholds.get("recompute", {})) & set(thresholds.get("bypass", {})))
    tests = [rate_vs_control(f"sigma {s:g}: bypass vs recompute collapses", thresholds["bypass"][s]["collapses"],
                             thresholds["bypass"][s]["seeds"], thresholds["recompute"][s]["collapses"],
                             thresholds["recompute"][s]["seeds"]) for s in common]
    subs.append(Sub("bypass collapses at a lower dose than recompute (literature's CPU-scale try: sigma 2 vs 3; "
                    "bypass collapses more often at some sigma, Fisher)", UNTESTED, "" if tests else
                    "no noise sigma in both modes", central=False, tests=tests))
    return family("dose-response", subs)


def noise_curve(noise: list[dict], x: float) -> float:
    """The noise sweep's relative accuracy at mean |delta| = x: linear in log |delta| between its points, the
    nearest point's value outside them."""
    pts = sorted((p["x"].mean, p["y"].mean) for p in noise)
    if x <= pts[0][0]:
        return pts[0][1]
    for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
        if x <= x1:
            t = (math.log(x) - math.log(x0)) / (math.log(x1) - math.log(x0))
            return y0 + t * (y1 - y0)
    return pts[-1][1]


def _on_the_noise_curve(d: PaperData, pts: list[dict], lr: float | None, learns: bool) -> Sub:
    """Each real setting's seeds against the noise sweep's value at the same |delta|: equivalence within half the
    learning range (TOST, one sample); the claim holds where >= 2/3 of the real settings are equivalent."""
    tests, parts = [], []
    real = [p for p in pts if p["kind"] not in ("noise", "reference") and p["x"].mean and p["y"].mean is not None]
    for p in real:
        noise = [q for q in pts if q["mode"] == p["mode"] and q["kind"] == "noise" and q["x"].mean
                 and q["y"].mean is not None]
        if len(noise) < 2:
            continue
        pred = noise_curve(noise, p["x"].mean)
        rows = d.setting(p["label"], mode=p["mode"])
        tests.append(paired_no_difference(f"{p['label']}/{p['mode']} rel - noise curve {fmt(pred)}",
                                          [rel(r) - pred for r in rows if rel(r) is not None],
                                          lr / 2 if lr and lr > 0 else None, lr, at_floor(rows) and pred <= FLOOR,
                                          learns))
        parts.append(f"{p['label']}/{p['mode']}: |delta| {fmt(p['x'].mean)}")

    def rule(words):
        if words.count(EQUIVALENT) * 3 >= 2 * len(words):
            return EQUIVALENT
        return NOT if words.count(NOT) * 3 > len(words) else combine([w for w in words if w != EQUIVALENT])
    return Sub("mean |delta| alone predicts the damage: each real condition's relative accuracy is equivalent to "
               "the noise sweep's value at the same |delta| (>= 2/3 of real settings; TOST within half the learning "
               "range)", rule if tests else UNTESTED, "; ".join(parts), tests=tests)
