"""The seed paper's claims (arXiv 2605.14220) as tests over a grid's results: one verdict per claim.

Each claim is split into sub-claims; each sub-claim is decided from the committed cells by a rule stated
in its text and gets `reproduced` (the claimed effect is detected: its interval excludes no effect, in the
claimed direction), `consistent, no difference detected` (for a claim of *no* difference, such as K1 ~ K3
or "a tighter clip is not a fix": the interval contains 0, reported with the smallest effect the design
could have detected), `not reproduced`, `reversed` (detected in the other direction) or `not tested` (the
grid holds no, or too few, cells for it). A claim's headline is its weakest central sub-claim, in the order
reversed < not reproduced < not tested < consistent < reproduced, with the count of sub-claims reproduced
beside it; a sub-claim marked not central (a literature add-on to the paper's claim) is shown but does not
set the headline. Comparisons between settings are paired by seed (the same seed shares the warm start,
prompts and sampler keys) and use 95% Student t intervals over seeds (timbench.report.stats).

Pure functions of `PaperData` (built by timbench.report.paper); nothing here reads files or draws.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from itertools import groupby

from .collapse import moving_average
from .leaderboard import fmt, fmt_interval
from .results import CellRun, column
from .stats import Interval, mean_interval, t_quantile

REPRODUCED, NOT, REVERSED = "reproduced", "not reproduced", "reversed"
UNTESTED = "not tested"
"""A sub-claim the grid holds no (or too few) cells for."""
CONSISTENT = "consistent, no difference detected"
"""A claim of no difference whose paired interval contains 0: not a proof of equality (see `detectable`)."""
STRENGTH = (REVERSED, NOT, UNTESTED, CONSISTENT, REPRODUCED)
"""Weakest first: a claim's headline is the weakest of its central sub-claims."""
POWER = 0.8
"""The power at which `detectable` states the smallest effect the design could have found."""
SPIKE = 2.0
"""A seed's grad norm 'spikes' when its maximum exceeds SPIKE x the same seed's zero-mismatch maximum."""
KL_RISE = 2.0
"""The KL 'warns' when its smoothed value first exceeds KL_RISE x its mean over the first 5 steps."""
KL_LEAD = 5
"""A warning at least KL_LEAD steps before the collapse counts as an early warning."""


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

    def setting(self, condition: str, remedy: str = "none", mode: str = "recompute") -> list[dict]:
        return self.rows.get((condition, remedy, mode), [])

    def real(self) -> list[str]:
        """Real mismatched conditions (not noise, not the reference), in grid order."""
        return [c for c, k in self.kinds.items() if k not in ("reference", "noise")]


@dataclass
class Sub:
    text: str
    verdict: str
    numbers: str
    central: bool = True
    """False for a literature add-on shown beside the paper's claim: it does not set the headline."""


@dataclass
class Verdict:
    claim: str
    subs: list[Sub]

    @property
    def verdict(self) -> str:
        """The weakest central sub-claim's verdict, with how many sub-claims were reproduced when not all."""
        central = [s.verdict for s in self.subs if s.central]
        if not central:
            return UNTESTED
        head = min(central, key=STRENGTH.index)
        done = sum(1 for s in self.subs if s.verdict == REPRODUCED)
        return head if done in (0, len(self.subs)) or head == REPRODUCED else \
            f"{head} ({done} of {len(self.subs)} sub-claims reproduced)"


def detectable(diff: Interval) -> float | None:
    """The smallest true paired difference this design would detect with probability POWER at the 95% level:
    (t_0.975 + t_POWER) x sd / sqrt(n), with sd / sqrt(n) read off the interval's half-width."""
    if diff.half_width is None or diff.n < 2:
        return None
    t_a = t_quantile(0.975, diff.n - 1)
    return diff.half_width * (1.0 + t_quantile(POWER, diff.n - 1) / t_a)


# ---------------------------------------------------------------- per-seed quantities

def rel(r: dict) -> float | None:
    return r.get("relative_accuracy_t1")


def paired(a: list[dict], b: list[dict], key=rel) -> Interval:
    """Interval over seeds of key(a_seed) - key(b_seed), on the seeds both have."""
    bs = {r["seed"]: r for r in b}
    diffs = [key(r) - key(bs[r["seed"]]) for r in a if r["seed"] in bs and key(r) is not None
             and key(bs[r["seed"]]) is not None]
    return mean_interval(diffs)


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

def f1(d: PaperData) -> Verdict:
    ref_cells = _by_seed(d.cells.get(d.reference, []))
    gains = [r["final_accuracy_t1"] - ref_cells[r["seed"]].evals[0]["accuracy_t1"]
             for r in d.rows.get(d.reference, []) if ref_cells.get(r["seed"]) and ref_cells[r["seed"]].evals]
    g = mean_interval(gains)
    up = g.lo is not None and g.lo > 0
    subs = [Sub("the zero-mismatch run keeps improving (final - initial eval accuracy T=1 > 0)",
                REPRODUCED if up else (REVERSED if g.hi is not None and g.hi < 0 else NOT),
                f"gain {_diff(g)} over {g.n} seeds")]
    found, parts = [], []
    for cond in d.real():
        for mode in ("recompute", "bypass"):
            rows = d.setting(cond, mode=mode)
            if not rows:
                continue
            k, n = collapses(rows)
            cells = _by_seed(d.cells[(cond, "none", mode)])
            rose = sum(rose_before_collapse(cells[r["seed"]], r, d.smooth) for r in rows if r.get("collapse/collapsed"))
            parts.append(f"{cond}/{mode} {k}/{n} collapsed ({rose} after a rise), rel acc {_ci(over_seeds(rows, rel))}")
            if n and k * 3 >= 2 * n:
                found.append((cond, mode, rose, n))
    subs.append(Sub("a mismatched real engine's run collapses (>= 2/3 of seeds, remedy none)",
                    REPRODUCED if found else NOT, "; ".join(parts) or "no mismatched cells"))
    subs.append(Sub("... after first rising (>= 2/3 of the seeds' smoothed reward rose 5% above its first window "
                    "before the collapse)", UNTESTED if not found else
                    REPRODUCED if any(r * 3 >= 2 * n for *_, r, n in found) else NOT,
                    ", ".join(f"{c}/{m}: {r}/{n} seeds rose first" for c, m, r, n in found) or "no collapsed setting"))
    return Verdict("F1", subs)


F2_SUBS = (f"recompute degrades with grad-norm spikes (>= 2/3 seeds with max grad norm > {SPIKE:g}x the same "
           "seed's zero-mismatch max, and collapse or relative accuracy below 1)",
           "bypass degrades silently (collapses without a grad-norm spike)",
           "bypass ends below recompute (paired difference of relative accuracy < 0)")
"""F2's sub-claims, in order."""


def f2(d: PaperData) -> Verdict:
    ref = _by_seed(d.cells.get(d.reference, []))
    spike_re, silent_by, worse_by, parts = [], [], [], []
    for cond in d.real() + [c for c, k in d.kinds.items() if k == "noise"]:
        rec, byp = d.setting(cond, mode="recompute"), d.setting(cond, mode="bypass")
        if not rec or not byp:
            continue
        ratios = {}
        for mode, rows in (("recompute", rec), ("bypass", byp)):
            cells = _by_seed(d.cells[(cond, "none", mode)])
            ratios[mode] = [max_grad_ratio(cells[r["seed"]], ref.get(r["seed"])) for r in rows]
        spikes = {m: sum(1 for x in v if x is not None and x > SPIKE) for m, v in ratios.items()}
        (kr, nr), (kb, nb) = collapses(rec), collapses(byp)
        diff = paired(byp, rec)
        parts.append(f"{cond}: recompute rel {_ci(over_seeds(rec, rel))}, {kr}/{nr} collapsed, {spikes['recompute']}"
                     f"/{nr} grad spikes (max {fmt(max([x for x in ratios['recompute'] if x] or [0]), 2)}x ref); bypass "
                     f"rel {_ci(over_seeds(byp, rel))}, {kb}/{nb} collapsed, {spikes['bypass']}/{nb} spikes "
                     f"(max {fmt(max([x for x in ratios['bypass'] if x] or [0]), 2)}x); bypass - recompute {_diff(diff)}")
        if spikes["recompute"] * 3 >= 2 * nr and (kr or (over_seeds(rec, rel).hi or 2) < 1):
            spike_re.append(cond)
        if kb and spikes["bypass"] == 0:
            silent_by.append(cond)
        if diff.hi is not None and diff.hi < 0:
            worse_by.append(cond)
    if not parts:  # e.g. a recompute-only grid (bench/grids/rise_collapse.yaml): F2 compares the two modes
        return Verdict("F2", [Sub(text, UNTESTED, "no condition has cells in both recompute and bypass mode")
                              for text in F2_SUBS])
    return Verdict("F2", [
        Sub(F2_SUBS[0], REPRODUCED if spike_re else NOT, f"conditions: {', '.join(spike_re) or 'none'}"),
        Sub(F2_SUBS[1], REPRODUCED if silent_by else NOT, f"conditions: {', '.join(silent_by) or 'none'}"),
        Sub(F2_SUBS[2], REPRODUCED if worse_by else NOT,
            f"separated at: {', '.join(worse_by) or 'none'}; " + " | ".join(parts)),
    ])


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
    verdict = UNTESTED if n < 3 else REPRODUCED if late > early else REVERSED if early > late else NOT
    subs = [Sub(f"real conditions: K3 stays near its starting level until the reward falls (no rise above "
                f"{KL_RISE:g}x its first 5 steps at least {KL_LEAD} steps before a collapse; decided on >= 3 seeds)",
                verdict, f"{late}/{n} collapsed seeds without an early KL warning, {early}/{n} with one; noise "
                f"conditions (not counted): {counts['noise'][0]} without, {counts['noise'][1]} with; {too_soon} seeds "
                f"collapsed before step {5 + KL_LEAD}, too early to tell; " + "; ".join(detail))]
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
    subs.append(Sub(f"real conditions, recompute, accuracy lost (rel interval below 1): K3 ends within {KL_RISE:g}x "
                    "its start in >= 2/3 of the seeds", UNTESTED if not seen else REPRODUCED if flat * 3 >= 2 * seen
                    else REVERSED, f"{flat}/{seen} seeds flat; " + ("; ".join(parts) or "no such setting")))
    return Verdict("F3", subs)


def f4(d: PaperData) -> Verdict:
    ref_max = max((abs(x) for c in d.cells.get(d.reference, []) for x in column(c.metrics, "drift/diff_abs_mean")),
                  default=None)
    subs = [Sub("zero mismatch: C(r_train) and C(r_rollout) coincide (max |difference| == 0.0 over every step)",
                REPRODUCED if ref_max == 0.0 else NOT, f"max |diff| = {ref_max!r} over "
                f"{len(d.cells.get(d.reference, []))} reference cells")]
    sep, skew, parts = [], [], []
    for cond in d.real() + [c for c, k in d.kinds.items() if k == "noise"]:
        rows = d.setting(cond)
        if not rows:
            continue
        absd = over_seeds(rows, lambda r: r.get("cum/drift/diff_abs_mean"))
        pos = over_seeds(rows, lambda r: mean_over_steps(d, cond, r, "drift/diff_pos_adv_mean"))
        neg = over_seeds(rows, lambda r: mean_over_steps(d, cond, r, "drift/diff_neg_adv_mean"))
        if absd.mean and absd.mean > 0:
            sep.append(cond)
        gap = over_seeds(rows, lambda r: _gap(d, cond, r))
        if gap.lo is not None and (gap.lo > 0 or gap.hi < 0):
            skew.append(cond)
        parts.append(f"{cond}: A>0 {_ci(pos)}, A<0 {_ci(neg)}, A>0 minus A<0 {_ci(gap)}")
    subs.append(Sub("mismatch: they separate (cumulative |difference| > 0), recompute mode",
                    UNTESTED if not parts else REPRODUCED if sep else NOT, f"{len(sep)} conditions: {', '.join(sep) or 'none'}"))
    subs.append(Sub("... skewed by the sign of A (the seeds' A > 0 mean minus A < 0 mean has an interval excluding 0, "
                    "at >= half of the conditions)",
                    UNTESTED if not parts else REPRODUCED if skew and len(skew) * 2 >= len(parts) else NOT,
                    f"skewed at {len(skew)}/{len(parts)}: " + "; ".join(parts)))
    return Verdict("F4", subs)


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


def f5(d: PaperData, variants: dict[str, dict]) -> Verdict:
    """`variants`: remedy label -> its config ({remedy, remedy_args, eps_low, ...}) at the remedy condition."""
    cond = remedy_condition(d)
    if cond is None:
        return Verdict("F5", [])
    rec = {lab: d.setting(cond, lab) for lab in variants if d.setting(cond, lab)}
    args = lambda lab: variants[lab].get("remedy_args") or {}  # noqa: E731
    tis_rs = [l for l in rec if variants[l]["remedy"] == "tis_token+seq_rs" and args(l).get("ratio", "rho") == "rho"]
    ranked = sorted(rec, key=lambda l: abs(1 - (over_seeds(rec[l], rel).mean or 0)))
    best = ranked[0] if ranked else None
    order = ", ".join(f"{l} {_ci(over_seeds(rec[l], rel))}" for l in ranked)
    subs = [Sub("token TIS + sequence rejection is closest to the zero-mismatch run (relative accuracy nearest 1)",
                REPRODUCED if best in tis_rs else NOT, f"{cond}, recompute, by |1 - rel|: {order}")]
    ppo = [l for l in rec if variants[l]["remedy"] == "tis_token+seq_rs" and args(l).get("ratio") == "ppo"]
    for p in ppo:
        twin = next((l for l in tis_rs if {**args(l), "ratio": "ppo"} == args(p)), None)
        if twin:
            diff = paired(rec[twin], rec[p])
            subs.append(Sub(f"rejection on rho beats rejection on the PPO ratio ({twin} - {p} > 0)", _signed(diff),
                            f"paired difference {_diff(diff)}; rejected seqs: on rho {fmt(rejection(rec[twin]))}, "
                            f"on PPO ratio {fmt(_ppo_rejection(d, cond, p))}"))
    k1s = [l for l in tis_rs if args(l).get("divergence") == "k1"]
    k3s = [l for l in tis_rs if args(l).get("divergence", "k3") == "k3"]
    for a in k1s:
        if not k3s:
            break
        b = min(k3s, key=lambda l: abs((rejection(rec[l]) or 0) - (rejection(rec[a]) or 0)))  # matched acceptance
        diff = paired(rec[a], rec[b])
        same = diff.lo is not None and diff.lo <= 0 <= diff.hi
        subs.append(Sub(f"K1 and K3 work about equally as the sequence criterion ({a} vs {b}, matched rejection)",
                        CONSISTENT if same else NOT,
                        f"paired difference {_ci(diff)} (contains 0: {same}, {_power(diff)}); rejected seqs "
                        f"{fmt(rejection(rec[a]))} vs {fmt(rejection(rec[b]))}"))
    clips = [l for l in variants if variants[l]["remedy"] == "none" and variants[l].get("eps_low") is not None]
    for lab in clips:
        for mode in ("recompute", "bypass"):
            mine, none = d.setting(cond, lab, mode), d.setting(cond, "none", mode)
            if not mine or not none:
                continue
            diff, r = paired(mine, none), over_seeds(mine, rel)
            fixed = diff.lo is not None and diff.lo > 0 and r.hi is not None and r.hi >= 1 and not collapses(mine)[0]
            # detected: worse than none, or short of the zero-mismatch run (its interval below 1)
            short = (diff.hi is not None and diff.hi < 0) or (r.hi is not None and r.hi < 1)
            subs.append(Sub(f"tightening the PPO clip is not a fix ({lab}, {mode}: no gain over none, or still "
                            "short of the zero-mismatch run)", REVERSED if fixed else REPRODUCED if short
                            else CONSISTENT, f"rel {_ci(r)}, {collapses(mine)[0]}/{len(mine)} collapsed; minus none "
                            f"{_ci(diff)} ({_power(diff)})"))
    return Verdict("F5", subs)


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
    pts = dose_points(d)
    subs, thresholds = [], {}
    for mode in ("recompute", "bypass"):
        noise = sorted((p for p in pts if p["mode"] == mode and p["kind"] == "noise" and p["y"].mean is not None),
                       key=lambda p: p["sigma"] or 0)
        rho = spearman([p["x"].mean for p in noise], [p["y"].mean for p in noise])
        subs.append(Sub(f"{mode}: relative accuracy falls as the noise dose rises (Spearman over sigma < 0)",
                        UNTESTED if rho is None else REPRODUCED if rho < 0 else REVERSED,
                        f"rho = {fmt(rho, 2)}; " + ", ".join(f"sigma {p['sigma']:g}: |delta| {fmt(p['x'].mean)} rel "
                                                          f"{_ci(p['y'])} ({p['collapses']}/{p['seeds']})" for p in noise)))
        thresholds[mode] = next((p["sigma"] for p in noise if p["collapses"] * 3 >= 2 * p["seeds"]), None)
    subs.append(_on_the_noise_curve(pts))
    r, b = thresholds.get("recompute"), thresholds.get("bypass")
    ok = b is not None and (r is None or b < r)
    subs.append(Sub("bypass collapses at a lower dose than recompute (literature's CPU-scale try: sigma 2 vs 3)",
                    UNTESTED if not any(p["kind"] == "noise" for p in pts) else
                    REPRODUCED if ok else (REVERSED if r is not None and (b is None or r < b) else NOT),
                    f"smallest sigma with >= 2/3 seeds collapsed: bypass {b}, recompute {r}", central=False))
    return Verdict("dose-response", subs)


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


def _on_the_noise_curve(pts: list[dict]) -> Sub:
    hits, parts = 0, []
    real = [p for p in pts if p["kind"] not in ("noise", "reference") and p["x"].mean and p["y"].mean is not None]
    for p in real:
        noise = [q for q in pts if q["mode"] == p["mode"] and q["kind"] == "noise" and q["x"].mean
                 and q["y"].mean is not None]
        if len(noise) < 2:
            continue
        pred = noise_curve(noise, p["x"].mean)
        inside = p["y"].lo is not None and p["y"].lo <= pred <= p["y"].hi
        hits += inside
        parts.append(f"{p['label']}/{p['mode']}: |delta| {fmt(p['x'].mean)}, rel {_ci(p['y'])} vs noise curve "
                     f"{fmt(pred)}{'' if inside else ' (outside)'}")
    return Sub("mean |delta| alone predicts the damage: each real condition's relative accuracy interval contains "
               "the noise sweep's value at the same |delta| (>= 2/3 of real settings)",
               UNTESTED if not parts else NOT if hits * 3 < 2 * len(parts) else REPRODUCED,
               f"{hits}/{len(parts)} on the curve; " + "; ".join(parts))
