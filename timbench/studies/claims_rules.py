"""The field's published claims about training-inference mismatch, each a rule over the committed evidence.

One rule function per claim, registered with `@claim` (timbench.studies.claims_registry) in the order claims.md
lists them; each rule's docstring cites its source (the shared literature notes). A rule reads
Evidence (timbench.studies.claims_data) and returns its sub-claims with their numbers and verdicts.
"""

from __future__ import annotations

from ..metrics.schema import MEAN_ABS_DELTA, MEAN_K3_KL
from ..report.leaderboard import fmt
from ..report.leaderboard import fmt_interval as _ci
from ..report.verdict_rules import EQUIVALENT, NO_WARNING, NOT_TESTED, WARNS, warning_vs_false_alarms
from .claims_data import Evidence
from .claims_registry import (
    DEMO,
    FAR_BELOW,
    ICEPOP_BAND,
    NOT_TESTABLE,
    THRESHOLD,
    _setting,
    claim,
    damaged,
    effect,
    no_difference,
    remedy_gain,
    step_mean,
    untestable,
)
from .early_warning import Candidate, Run, score_candidate
from .paper_claims import (
    KL_LEAD,
    NOT,
    REPRODUCED,
    REVERSED,
    Sub,
    _by_seed,
    collapses,
    dose_points,
    kl_alarm_step,
    over_seeds,
)

# ---------------------------------------------------------------- the claims

FP16_PAIRS = (
    (("production", "fp16", "recompute"), ("production", "none", "recompute")),
    (("bf16-engine", "fp16", "recompute"), ("bf16-engine", "none", "recompute")),
    (("fp16-engine", "none", "recompute"), ("bf16-engine", "none", "recompute")),
)
"""(fp16 setting, bf16 setting) pairs that test FP16, in order of preference: the fp16 remedy on a bf16 engine
(production: torch bf16 engine vs torch fp32 trainer, the closest to a real stack), then fp16 vs bf16 engines."""
BF16_ENGINES = ("production", "bf16-engine")
"""Conditions that stand for a bf16 rollout engine, closest to a real stack first."""


@claim(
    "FP16",
    "arXiv 2510.26788",
    "fp16 on both sides instead of bf16 cuts the training-inference mismatch far "
    "below bf16's (~24x lower KL) and trains at least as well.",
)
def fp16(ev: Evidence) -> list[Sub]:
    """FP16 (arXiv 2510.26788, 'Defeating the training-inference mismatch via FP16'): 10 vs 7 mantissa bits;
    reported ~24x lower train-inference KL. Measured twice: on the alignment tables, an fp16 vs a bf16 engine
    each against the same fp32 exact trainer (with identical exact kernels on both sides both dtypes give 0.0, so
    the one-sided rows are the comparison that can separate them); and in RL runs, the fp16 remedy (both sides
    fp16) against no remedy on a bf16 engine (FP16_PAIRS, first found)."""
    parts, ratios = [], []
    for model in ("tiny-dense", "tiny-moe"):
        pair = ev.align_pair(
            model,
            ("kernels=exact,dtype=fp16", "kernels=exact,dtype=fp32"),
            ("kernels=exact,dtype=bf16", "kernels=exact,dtype=fp32"),
        )
        f, b = pair or (None, None)
        if pair and f["k3_kl"] > 0:
            ratios.append(b["k3_kl"] / f["k3_kl"])
            parts.append(
                f"{model} ({f['table']}): k3_kl bf16 {fmt(b['k3_kl'])} vs fp16 {fmt(f['k3_kl'])} "
                f"({ratios[-1]:.0f}x), mean |delta| {fmt(b['mean_abs_diff'])} vs {fmt(f['mean_abs_diff'])} "
                f"({b['mean_abs_diff'] / f['mean_abs_diff']:.1f}x)"
            )
    cut = NOT_TESTABLE if not ratios else DEMO if min(ratios) >= FAR_BELOW else REVERSED if min(ratios) < 1 else NOT
    subs = [
        Sub(
            f"fp16's k3_kl at least {FAR_BELOW:g}x below bf16's on every model (alignment tables, fp32 exact trainer)",
            cut,
            "; ".join(parts) or "no alignment table with both the fp16 and bf16 engine rows",
        )
    ]
    pair = next(((f, b, ev.find(f, b)) for f, b in FP16_PAIRS if ev.find(f, b)), None)
    if not pair:
        why = untestable("the fp16 remedy beside none on a bf16 engine (or fp16-engine beside bf16-engine)")
        return subs + [
            Sub(t, NOT_TESTABLE, why)
            for t in ("RL runs: fp16 cuts the step-mean k3_kl far below bf16's", "trains at least as well")
        ]
    f, b, (name, d) = pair
    f16, b16 = d.rows[f], d.rows[b]
    k3 = lambda r: r.get(MEAN_K3_KL)  # noqa: E731
    ratio = (over_seeds(b16, k3).mean or 0) / (over_seeds(f16, k3).mean or float("inf"))
    where = f"{name} ({ev.steps[name]} steps): {'/'.join(f[:2])} vs {'/'.join(b[:2])}"
    far = lambda ws: (
        REPRODUCED if ws == [REPRODUCED] and ratio >= FAR_BELOW else ws[0] if ws[0] in (REVERSED, NOT_TESTED) else NOT
    )  # noqa: E731
    subs.append(
        Sub(
            f"RL runs: fp16's step-mean k3_kl is lower (bf16 - fp16 paired > 0) and at least {FAR_BELOW:g}x "
            "below bf16's",
            far,
            f"{where}; k3_kl {fmt(over_seeds(f16, k3).mean)} vs {fmt(over_seeds(b16, k3).mean)} ({ratio:.0f}x)",
            tests=[effect("bf16 - fp16 k3_kl", b16, f16, d, k3)],
        )
    )
    as_well = lambda ws: (
        REPRODUCED
        if REPRODUCED in ws or EQUIVALENT in ws
        else min(  # noqa: E731
            ws, key=lambda w: (w != REVERSED, w != NOT, w != NOT_TESTED)
        )
    )
    subs.append(
        Sub(
            "trains at least as well (fp16 - bf16 relative accuracy, paired: a gain detected, or equivalent "
            "within half the learning range)",
            as_well,
            f"{where}; fp16 {_setting(f16)}; bf16 {_setting(b16)}",
            tests=[effect("fp16 - bf16 rel", f16, b16, d), no_difference(f16, b16, d)],
        )
    )
    return subs


@claim(
    "Routing replay",
    "arXiv 2510.11370 (R3); arXiv 2512.01374 (R2/R3)",
    "Replaying the engine's routing (R3) "
    "lowers MoE mismatch and routing disagreement and stabilises MoE RL where no replay does not; R3 removes "
    "more training-inference mismatch than R2 (the trainer's own old routing).",
)
def routing_replay(ev: Evidence) -> list[Sub]:
    """Routing replay: R3 (arXiv 2510.11370, 'Rollout Routing Replay') replays the engine's top-k mask in
    training; R2 (arXiv 2512.01374, Qwen) replays the trainer's old one, so it fixes staleness, not the
    engine-trainer gap. Read from a MoE grid holding none, R2 and R3 on one mismatched condition."""
    conds = [c for n, d in ev.grids.items() for (c, r, m) in d.rows if r == "routing_replay_r3" and m == "recompute"]
    hit = next(
        (
            (c, *f)
            for c in conds
            if (f := ev.find(*[(c, r, "recompute") for r in ("none", "routing_replay_r3", "routing_replay_r2")]))
        ),
        None,
    )
    if not hit:
        why = untestable("routing_replay_r2/_r3 beside none on a MoE model", "bench/grids/vllm_moe.yaml")
        return [Sub(t, NOT_TESTABLE, why) for t in ("R3 lowers mismatch", "R3 stabilises MoE RL")]
    cond, name, d = hit
    none, r3, r2 = (d.setting(cond, r) for r in ("none", "routing_replay_r3", "routing_replay_r2"))
    delta, agree = step_mean(MEAN_ABS_DELTA)(d, cond), step_mean("mismatch/routing_agreement")(d, cond)
    where = f"{name} {cond} ({ev.steps[name]} steps)"
    subs = [
        Sub(
            "R3 lowers mismatch (none - R3 step-mean |delta| > 0, paired)",
            "",
            f"{where}: none {fmt(over_seeds(none, delta).mean)}, R3 {fmt(over_seeds(r3, delta).mean)}",
            tests=[effect("none - R3 |delta|", none, r3, d, delta)],
        ),
        Sub(
            "R3 raises routing agreement (R3 - none step-mean agreement > 0, paired)",
            "",
            f"none {fmt(over_seeds(none, agree).mean)}, R3 {fmt(over_seeds(r3, agree).mean)}",
            tests=[effect("R3 - none agreement", r3, none, d, agree)],
        ),
    ]
    subs.append(
        Sub(
            "R3 stabilises MoE RL where none does not (none loses accuracy; R3 - none gain > 0)",
            "" if damaged(none) else NOT_TESTABLE,
            f"none {_setting(none)}; R3 {_setting(r3)}"
            + ("" if damaged(none) else " - none does not lose accuracy here, so nothing to stabilise"),
            tests=[effect("R3 - none rel", r3, none, d)] if damaged(none) else [],
        )
    )
    subs.append(
        Sub(
            "R3 removes more mismatch than R2 (R2 - R3 step-mean |delta| > 0, paired)",
            "",
            f"R2 {fmt(over_seeds(r2, delta).mean)}, R3 {fmt(over_seeds(r3, delta).mean)}; R2 {_setting(r2)}",
            tests=[effect("R2 - R3 |delta|", r2, r3, d, delta)],
        )
    )
    return subs


@claim(
    "TIS / MIS",
    "Yao et al. 2025 (TIS); arXiv 2512.01374 and TRL's default sequence_mask (MIS)",
    "Token-level truncated IS (cap 2) rescues a mismatched run; sequence-level masked IS stays stable where "
    "token-level correction fails.",
)
def tis_mis(ev: Evidence) -> list[Sub]:
    """TIS (Yao et al. 2025, 'Your efficient RL framework secretly brings you off-policy RL training'): w = min(rho,
    2). MIS (Liu, Li et al. 2025; TRL's vllm_importance_sampling_mode default sequence_mask): sequence-level
    masking was stable where token-level TIS/MIS collapsed."""
    v, nums, gain_tests = remedy_gain(ev, "tis_token")
    subs = [
        Sub(
            "token TIS rescues a mismatched run (tis_token - none relative accuracy > 0, paired, where none "
            "loses accuracy, staleness conditions left out; detected at >= half of such settings)",
            v,
            nums,
            tests=gain_tests,
        )
    ]
    hits = [
        (n, c, m)
        for n, d in ev.grids.items()
        for (c, r, m) in d.rows
        if r == "mis_seq"
        and ev.first_copies(n, d.setting(c, "mis_seq", m))  # a setting whose runs an earlier grid holds: counted there
        and any(damaged(d.setting(c, t, m)) for t in ("tis_token", "mis_token"))
    ]
    if not hits:
        subs.append(
            Sub(
                "sequence MIS is stable where token-level correction fails",
                NOT_TESTABLE,
                untestable("mis_seq beside a failing tis_token/mis_token"),
            )
        )
        return subs
    parts, stable = [], 0
    for n, c, m in hits:
        rows = ev.grids[n].setting(c, "mis_seq", m)
        stable += not damaged(rows)
        parts.append(f"{n} {c}/{m}: mis_seq {_setting(rows)}")
    subs.append(
        Sub(
            "sequence MIS is stable (does not lose accuracy) where token-level correction fails",
            REPRODUCED if stable * 2 >= len(hits) else NOT,
            "; ".join(parts),
        )
    )
    return subs


@claim(
    "IcePop",
    "arXiv 2510.18855 (Ring-1T)",
    "Masking tokens whose rho = pi/mu falls outside [0.5, 5] stabilises "
    "RL under mismatch, and masks only ~1-2 per mille of tokens.",
)
def icepop(ev: Evidence) -> list[Sub]:
    """IcePop (arXiv 2510.18855, Ring-1T): per-token mask M(k) = k if k in [0.5, 5] else 0; masks about 1-2 per
    mille of tokens. The masked share is read from icepop runs on a bf16 engine (rollout_rs_masked_fraction);
    without one it is bracketed from what every cell logs: mismatch/extreme_frac_5 (max(rho, 1/rho) > 5, inside
    IcePop's mask) <= masked <= mismatch/extreme_frac_2 (max(rho, 1/rho) > 2, outside it)."""
    v, nums, gain_tests = remedy_gain(ev, "icepop")
    subs = [
        Sub(
            "IcePop stabilises (icepop - none relative accuracy > 0, paired, where none loses accuracy)",
            v,
            nums,
            tests=gain_tests,
        )
    ]
    text = (
        f"on a bf16 engine it masks [{ICEPOP_BAND[0] * 1e3:g}, {ICEPOP_BAND[1] * 1e3:g}] per mille of tokens "
        "(the claim's 1-2 within a factor 2)"
    )
    measured = next(((c, *f) for c in BF16_ENGINES if (f := ev.find((c, "icepop", "recompute")))), None)
    if measured:
        c, name, d = measured
        iv = over_seeds(d.setting(c, "icepop"), lambda r: r.get("mean/rollout_corr/rollout_rs_masked_fraction"))
        inside = iv.mean is not None and ICEPOP_BAND[0] <= iv.mean <= ICEPOP_BAND[1]
        return subs + [
            Sub(
                text + ": the icepop runs' measured masked share (seed mean)",
                REPRODUCED if inside else NOT,
                f"{name} {c}: {_ci(iv)}, i.e. {iv.mean * 1e3:.3g} per mille",
            )
        ]
    found = next(((c, *f) for c in BF16_ENGINES if (f := ev.find((c, "none", "recompute")))), None)
    if not found:
        return subs + [Sub(text, NOT_TESTABLE, untestable("a bf16 engine"))]
    c, name, d = found
    lo = over_seeds(d.setting(c), step_mean("mismatch/extreme_frac_5")(d, c)).mean
    hi = over_seeds(d.setting(c), step_mean("mismatch/extreme_frac_2")(d, c)).mean
    verdict = (
        NOT_TESTABLE
        if lo is None or hi is None
        else REPRODUCED
        if lo <= ICEPOP_BAND[1] and hi >= ICEPOP_BAND[0]
        else NOT
    )
    return subs + [
        Sub(
            text + ": bracketed by the share of tokens with max(rho, 1/rho) above 5 and above 2, no icepop run",
            verdict,
            f"{name} {c}: between {fmt(lo)} and {fmt(hi)}",
        )
    ]


@claim(
    "FP8-RL",
    "arXiv 2601.18150",
    "FP8 (W8A8 blockwise E4M3) rollouts with token TIS train like the bf16 "
    "baseline; end-to-end FP8 (the trainer too) lowers the mismatch.",
)
def fp8_rl(ev: Evidence) -> list[Sub]:
    """FP8-RL (arXiv 2601.18150): blockwise W8A8 E4M3 rollouts (128x128 weight blocks, 1x128 activation
    groups) with token-level TIS match the BF16 run; end-to-end FP8 lowers the mismatch. timbench's fp8-rollout
    is that format; its bf16 baseline is bf16-engine; end-to-end is the unified_precision remedy, measured
    at one seed in the alignment table as fp8 block W8A8 on both sides."""
    subs = []
    found = ev.find(("fp8-rollout", "tis_token", "recompute"), ("bf16-engine", "none", "recompute"))
    if found:
        t = no_difference(found[1].setting("fp8-rollout", "tis_token"), found[1].setting("bf16-engine"), found[1])
        subs.append(
            Sub(
                "fp8 rollout + token TIS trains like the bf16 engine (relative accuracy, paired; equivalence "
                "within half the learning range)",
                "",
                f"{found[0]}",
                tests=[t],
            )
        )
    else:
        subs.append(
            Sub(
                "fp8 rollout + token TIS trains like the bf16 engine",
                NOT_TESTABLE,
                untestable("fp8-rollout with tis_token"),
            )
        )
    for mode in ("recompute", "bypass"):
        found = ev.find(("fp8-rollout", "none", mode), ("bf16-engine", "none", mode))
        if found:
            fp8, b16 = found[1].setting("fp8-rollout", mode=mode), found[1].setting("bf16-engine", mode=mode)
            subs.append(
                Sub(
                    f"without TIS, {mode}: fp8 rollout trains like the bf16 engine",
                    "",
                    f"{found[0]}: fp8 {_setting(fp8)}; bf16 {_setting(b16)}",
                    central=False,
                    tests=[no_difference(fp8, b16, found[1])],
                )
            )
    fp8 = "weight_quant=fp8_block,act_quant=fp8_block"
    e2e, one = ev.align_pair(
        "tiny-dense",
        (f"kernels=exact,dtype=bf16,{fp8}",) * 2,
        (f"kernels=exact,dtype=fp32,{fp8}", "kernels=exact,dtype=fp32"),
    ) or (None, None)
    subs.append(
        Sub(
            "end-to-end FP8 lowers the mismatch (fp8 block W8A8 on both sides vs fp8 rollout only, "
            "alignment table, tiny-dense)",
            NOT_TESTABLE if not (e2e and one) else DEMO if e2e["mean_abs_diff"] < one["mean_abs_diff"] else NOT,
            "no alignment row for both"
            if not (e2e and one)
            else f"{e2e['table']}: mean |delta| {fmt(e2e['mean_abs_diff'])} (max {fmt(e2e['max_abs_diff'])}) vs "
            f"{fmt(one['mean_abs_diff'])} (max {fmt(one['max_abs_diff'])})",
        )
    )
    return subs


@claim(
    "TRIAGE",
    "arXiv 2610.07043",
    "Under native NVFP4 RL the (A < 0, delta < 0) updates become imbalanced "
    "before the collapse (their precursor rose 1.02 -> 2.32): the quadrant imbalance leads the collapse.",
)
def triage(ev: Evidence) -> list[Sub]:
    """TRIAGE (arXiv 2610.07043): splits delta by the sign of A and of delta; the (A < 0, delta < 0) share of
    the update grows before the collapse (their precursor 1.02 -> 2.32). Read from the per-step
    `tim/neg_adv_imbalance` (timbench.metrics.direction) of untreated nvfp4 runs (rollout or W4A4) that collapsed:
    (1) it rose, its mean over the 3 steps before the collapse above its step-0 value, in >= 2/3 of them;
    (2) it leads: `timbench early-warning`'s rule (leave-one-seed-out envelopes, a warning after step 0) over every
    grid that logs it, warns >= 1 step early in >= 2/3 of all collapsed runs, and its verdict is `warns`
    (verdict_rules.warning_vs_false_alarms: the early rate above the false-alarm rate, Fisher's exact test); (3, the
    control, not central) the A > 0 ratio does not rise the same way."""
    key, ctl = "tim/neg_adv_imbalance", "tim/pos_adv_imbalance"
    runs, nv = [], []
    for name, d in ev.grids.items():
        for (cond, remedy, mode), cells in d.cells.items():
            rows = {r["seed"]: r for r in d.rows.get((cond, remedy, mode), [])}
            for c in ev.first_copies(name, cells):  # a run several grids hold is one run
                if not c.metrics or key not in c.metrics[0] or c.axes.get("seed") not in rows:
                    continue
                row = rows[c.axes["seed"]]
                step = row.get("collapse/step") if row.get("collapse/collapsed") else None
                runs.append(
                    Run(
                        name,
                        c.id,
                        int(c.axes["seed"]),
                        step,
                        None,
                        [int(m.get("step", i)) for i, m in enumerate(c.metrics)],
                        c.metrics,
                    )
                )
                if cond.startswith("nvfp4") and remedy == "none" and step is not None and step >= 1:
                    nv.append((f"{cond}/{mode} s{c.axes['seed']}", c.metrics, step))
    if not runs:
        why = (
            "no committed grid logs the per-step quadrant metrics (tim/quadrant_mass/*, tim/neg_adv_imbalance: "
            "timbench.metrics.direction); run bench/grids/nvfp4.yaml"
        )
        return [
            Sub(t, NOT_TESTABLE, why)
            for t in ("the quadrant imbalance rises before the collapse", "the quadrant imbalance leads the collapse")
        ]

    def rise(metrics, step, k):
        pre = [float(m[k]) for m in metrics[max(0, step - 3) : step]]
        return float(metrics[0][k]), sum(pre) / len(pre)

    rises = [(lbl, *rise(m, s, key), *rise(m, s, ctl)) for lbl, m, s in nv]
    up = sum(b > a for _, a, b, *_ in rises)
    nums = "; ".join(f"{lbl}: {a:.2f} -> {b:.2f}" for lbl, a, b, *_ in rises)
    subs = [
        Sub(
            "untreated nvfp4: the (A < 0, delta < 0) imbalance rises before the collapse (>= 2/3 of collapsed "
            "runs; theirs 1.02 -> 2.32)",
            NOT_TESTABLE if not rises else REPRODUCED if up * 3 >= 2 * len(rises) else NOT,
            f"{up}/{len(rises)} rose: {nums}" if rises else "no collapsed untreated nvfp4 run logs it",
        )
    ]
    r = score_candidate(Candidate(key, 1, "TRIAGE"), runs)
    n, e = r["collapsed_runs"], r["early"]
    warn = warning_vs_false_alarms("early vs false alarms (J)", e, n, r["false_alarms"], r["healthy_runs"])
    subs.append(
        Sub(
            "it leads the collapse (early-warning rule, every grid logging it: early in >= 2/3 of the "
            "collapsed runs, and it warns: its early rate above its false-alarm rate, Fisher)",
            lambda ws: (
                NOT_TESTED
                if ws[0] not in (WARNS, NO_WARNING)
                else REPRODUCED
                if ws[0] == WARNS and e * 3 >= 2 * n
                else NOT
            ),
            f"early {e}/{n} (late {r['late']}, missed {r['missed']}, outside the envelope at step 0 "
            f"{r['flagged_at_step0']}), median lead {r['median_lead']} steps, false alarms "
            f"{r['false_alarms']}/{r['healthy_runs']}",
            tests=[warn],
        )
    )
    if rises:
        up_ctl = sum(d > c for *_, c, d in rises)
        subs.append(
            Sub(
                "control: the A > 0 ratio does not rise as often",
                REPRODUCED if up_ctl < up else NOT,
                f"{up_ctl}/{len(rises)} rose: " + "; ".join(f"{x[0]}: {x[3]:.2f} -> {x[4]:.2f}" for x in rises),
                central=False,
            )
        )
    return subs


@claim(
    "GPU study (Qwen3-1.7B/8B)",
    "a public GPU study, vLLM vs transformers (shared reference notes)",
    "Under a bf16 engine token TIS, MIS and IcePop are indistinguishable from no correction; bypass (engine "
    "logprobs in PPO's ratio) collapsed one of two seeds, and the KL rose ~25 steps before the reward fell.",
)
def gpu_study(ev: Evidence) -> list[Sub]:
    """The public GPU study of Qwen3-1.7B/8B (vLLM vs transformers, 200 GRPO steps): token TIS/MIS/IcePop
    indistinguishable from none; bypass collapsed 1 of 2 seeds with the KL rising ~25 steps before the reward
    fell. The KL warning is F3's: smoothed k3_kl above KL_RISE x its first 5 steps (paper_claims.kl_alarm_step)."""
    subs = []
    for remedy in ("tis_token", "mis_token", "mis_seq", "icepop"):
        found = next(
            ((c, *f) for c in BF16_ENGINES if (f := ev.find((c, remedy, "recompute"), (c, "none", "recompute")))), None
        )
        text = f"bf16 engine: {remedy} indistinguishable from none (relative accuracy, paired)"
        if found:
            c, name, d = found
            subs.append(
                Sub(
                    text + "; equivalence within half the learning range",
                    "",
                    f"{name} {c} ({ev.steps[name]} steps)",
                    tests=[no_difference(d.setting(c, remedy), d.setting(c), d)],
                )
            )
        else:
            subs.append(Sub(text, NOT_TESTABLE, untestable(f"{remedy} on bf16-engine")))
    byp = [
        (n, ev.first_copies(n, d.setting("bf16-engine", mode="bypass")))
        for n, d in ev.find_all(("bf16-engine", "none", "bypass"))
    ]
    byp = [(n, rows) for n, rows in byp if rows]  # runs an earlier grid holds counted there, once
    k = sum(collapses(rows)[0] for _, rows in byp)
    subs.append(
        Sub(
            "bf16 engine, bypass: a seed collapses (theirs: 1 of 2)",
            NOT_TESTABLE if not byp else REPRODUCED if k else NOT,
            "; ".join(f"{n}: {_setting(rows)}" for n, rows in byp) or untestable("bf16-engine in bypass mode"),
        )
    )
    leads, early = [], 0
    for n, d in ev.grids.items():
        for cond in d.real():
            cells = _by_seed(d.cells.get((cond, "none", "bypass"), []))
            for r in ev.first_copies(n, d.setting(cond, mode="bypass")):
                step = r.get("collapse/step") if r.get("collapse/collapsed") else None
                if step is None or step < 5 + KL_LEAD:
                    early += step is not None
                    continue
                alarm = kl_alarm_step(cells[r["seed"]], d.smooth)
                leads.append((f"{n} {cond}/s{r['seed']}", None if alarm is None else step - alarm))
    warned = sum(1 for _, x in leads if x is not None and x >= KL_LEAD)
    subs.append(
        Sub(
            f"bypass collapses of real conditions: the KL warns >= {KL_LEAD} steps before (theirs ~25), "
            "in >= half of the collapsed seeds",
            NOT_TESTABLE if not leads else REPRODUCED if warned * 2 >= len(leads) else NOT,
            f"{warned}/{len(leads)} warned early; {early} seeds collapsed before step {5 + KL_LEAD}, too "
            "early to tell; " + ", ".join(f"{s}: lead {'none' if x is None else x}" for s, x in leads),
        )
    )
    return subs


@claim(
    "0.05 threshold",
    "IcePop (arXiv 2510.18855), Ring-mini-2.0",
    "Training essentially fails once the training-inference discrepancy exceeds 0.05.",
)
def threshold(ev: Evidence) -> list[Sub]:
    """The literature's magnitude (IcePop, arXiv 2510.18855, on Ring-mini-2.0): training fails past a discrepancy
    of 0.05. Placed on timbench's dose-response (paper_claims.dose_points: every real and noise setting, remedy
    none): per mode, the failure threshold lies between the largest mean |delta| that did not fail and the
    smallest that did (>= 2/3 seeds collapsed); the claim holds when the smallest failing mean |delta| lies
    within a factor 2 of 0.05, in [0.025, 0.1]."""
    found = next(((n, d) for n, d in ev.grids.items() if sum(d.kinds.get(c) == "noise" for c in d.kinds) >= 2), None)
    if not found:
        return [
            Sub(
                "the failure threshold of mean |delta| is near 0.05",
                NOT_TESTABLE,
                untestable("a noise sweep beside real conditions", "bench/grids/paper.yaml"),
            )
        ]
    name, d = found
    subs = []
    for mode in ("recompute", "bypass"):
        pts = sorted(
            (p for p in dose_points(d) if p["mode"] == mode and p["x"].mean is not None), key=lambda p: p["x"].mean
        )
        fail = [p for p in pts if p["collapses"] * 3 >= 2 * p["seeds"]]
        first = fail[0]["x"].mean if fail else None
        ok = max((p["x"].mean for p in pts if p not in fail and (first is None or p["x"].mean < first)), default=None)
        above = [p["label"] for p in pts if p not in fail and first is not None and p["x"].mean > first]
        meets = first is not None and THRESHOLD / 2 <= first <= THRESHOLD * 2
        subs.append(
            Sub(
                f"{mode}: the smallest mean |delta| at which >= 2/3 seeds collapse lies in "
                f"[{THRESHOLD / 2:g}, {THRESHOLD * 2:g}]",
                NOT_TESTABLE if not pts else REPRODUCED if meets else NOT,
                f"{name}: fails between {fmt(ok)} and {fmt(first)}"
                + (f" (yet did not fail above it: {', '.join(above)})" if above else "")
                + "; "
                + ", ".join(f"{p['label']} {fmt(p['x'].mean)} ({p['collapses']}/{p['seeds']})" for p in pts),
            )
        )
    return subs
