"""The seed paper's F4-F5 (arXiv 2605.14220) as tests: C(r) of the two old policies coincides under zero mismatch
and separates, skewed by the sign of A, under mismatch (F4; the first two are implementation checks); token TIS +
sequence rejection is closest to the zero-mismatch run, rho beats the PPO ratio, K1 ~ K3, a tighter clip is not a
fix (F5). Rules and words: timbench.studies.paper_claims; shared quantities: paper_evidence.
"""

from __future__ import annotations

import math

from ..report.leaderboard import fmt
from ..report.results import column
from ..report.verdict_rules import NOT, REPRODUCED, REVERSED, check, combine, paired_effect, paired_no_difference
from .paper_evidence import (
    UNTESTED,
    PaperData,
    Sub,
    Verdict,
    _ci,
    _setting_text,
    _strength,
    at_floor,
    diffs,
    family,
    mean_over_steps,
    over_seeds,
    rejection,
    rel,
)


def f4(d: PaperData) -> Verdict:
    """Both 'coincide under zero mismatch' and 'separate under mismatch' hold by construction when the code is
    right (C(r) of two identical old policies is identical): implementation checks, not findings. The skew by
    the sign of A is the claim (two-sided paired test per condition, at >= half of the conditions)."""
    ref_max = max(
        (abs(x) for c in d.cells.get(d.reference, []) for x in column(c.metrics, "drift/diff_abs_mean")), default=None
    )
    subs = [
        Sub(
            "zero mismatch: C(r_train) and C(r_rollout) coincide (max |difference| == 0.0 over every step)",
            check(ref_max == 0.0),
            f"max |diff| = {ref_max!r} over {len(d.cells.get(d.reference, []))} reference cells",
            check=True,
        )
    ]
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
    subs.append(
        Sub(
            "mismatch: they separate (cumulative |difference| > 0), recompute mode",
            UNTESTED if not parts else check(bool(sep)),
            f"{len(sep)} conditions: {', '.join(sep) or 'none'}",
            check=True,
        )
    )
    half = lambda ws: (
        REPRODUCED
        if ws.count(REPRODUCED) * 2 >= len(ws)
        else combine(  # noqa: E731
            [w for w in ws if w != REPRODUCED]
        )
    )
    subs.append(
        Sub(
            "... skewed by the sign of A (the seeds' A > 0 mean minus A < 0 mean differs from 0, two-sided "
            "paired t test, at >= half of the conditions)",
            half if tests else UNTESTED,
            "; ".join(parts),
            tests=tests,
        )
    )
    return family("F4", subs)


def _gap(d: PaperData, cond: str, row: dict) -> float | None:
    pos, neg = (mean_over_steps(d, cond, row, f"drift/diff_{s}_adv_mean") for s in ("pos", "neg"))
    return None if pos is None or neg is None else pos - neg


def _all(words: list[str]) -> str:
    """A claim over every comparison ("closest": better than each other remedy): reproduced only if all are."""
    return (
        REPRODUCED
        if words and all(w == REPRODUCED for w in words)
        else min(words, key=_strength)
        if words
        else UNTESTED
    )


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
    closest = [
        paired_effect(f"{o} - {best} |1 - rel|", diffs(rec[o], rec[best], dist), lr, baseline_learns=learns)
        for o in rec
        if best and o not in tis_rs
    ]
    subs = [
        Sub(
            "token TIS + sequence rejection is closest to the zero-mismatch run (its |1 - rel| below every other "
            "remedy's, paired, each)",
            _all if closest else UNTESTED,
            f"{cond}, recompute, by |1 - rel|: {order}",
            tests=closest,
        )
    ]
    ppo = [l for l in rec if variants[l]["remedy"] == "tis_token+seq_rs" and args(l).get("ratio") == "ppo"]
    for p in ppo:
        twin = next((l for l in tis_rs if {**args(l), "ratio": "ppo"} == args(p)), None)
        if twin:
            subs.append(
                Sub(
                    f"rejection on rho beats rejection on the PPO ratio ({twin} - {p} > 0)",
                    "",
                    f"rejected seqs: on rho {fmt(rejection(rec[twin]))}, on PPO ratio "
                    f"{fmt(_ppo_rejection(d, cond, p))}",
                    tests=[
                        paired_effect(
                            f"{twin} - {p}", diffs(rec[twin], rec[p]), lr, at_floor(rec[twin], rec[p]), learns
                        )
                    ],
                )
            )
    k1s = [l for l in tis_rs if args(l).get("divergence") == "k1"]
    k3s = [l for l in tis_rs if args(l).get("divergence", "k3") == "k3"]
    for a in k1s:
        if not k3s:
            break
        b = min(k3s, key=lambda l: abs((rejection(rec[l]) or 0) - (rejection(rec[a]) or 0)))  # matched acceptance
        subs.append(
            Sub(
                f"K1 and K3 work about equally as the sequence criterion ({a} vs {b}, matched rejection; "
                "equivalence within half the learning range)",
                "",
                f"rejected seqs {fmt(rejection(rec[a]))} vs {fmt(rejection(rec[b]))}",
                tests=[
                    paired_no_difference(
                        f"{a} - {b}", diffs(rec[a], rec[b]), margin, lr, at_floor(rec[a], rec[b]), learns
                    )
                ],
            )
        )
    clips = [l for l in variants if variants[l]["remedy"] == "none" and variants[l].get("eps_low") is not None]
    for lab in clips:
        for mode in ("recompute", "bypass"):
            mine, none = d.setting(cond, lab, mode), d.setting(cond, "none", mode)
            if not mine or not none:
                continue
            short = paired_effect(
                f"{lab} ({mode}): 1 - rel",
                [1 - x for x in (rel(r) for r in mine) if x is not None],
                lr,
                at_floor(mine),
                learns,
            )
            fixed = paired_effect(f"{lab} ({mode}) - none rel", diffs(mine, none), lr, at_floor(mine, none), learns)
            subs.append(
                Sub(
                    f"tightening the PPO clip is not a fix ({lab}, {mode}: still short of the zero-mismatch "
                    "run; reversed when it gains over none and is not short)",
                    _clip_rule,
                    f"{_setting_text(mine)}",
                    tests=[short, fixed],
                )
            )
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


def remedy_condition(d: PaperData) -> str | None:
    """The condition the remedy ablation ran on: the one with the most remedies (ties: grid order)."""
    counts: dict[str, int] = {}
    for cond, remedy, _ in d.rows:
        if d.kinds.get(cond) != "reference":
            counts[cond] = counts.get(cond, 0) + (remedy != "none")
    best = max(counts.items(), key=lambda kv: kv[1], default=(None, 0))
    return best[0] if best[1] else None
