"""Text of `timbench risk`: an answer (risk.answer) for the terminal, and the validation page (risk_validate)."""

from __future__ import annotations

from .risk import MODES
from .risk_data import DOSE, HORIZON
from .risk_validate import LOSS, MODE_ONLY


def _g(x, digits: int = 3) -> str:
    return "-" if x is None else f"{x:.{digits}g}"


def _ci(pair, digits: int = 3) -> str:
    if not pair or pair[0] is None:
        return ""
    return f" [{pair[0]:.{digits}f}, {pair[1]:.{digits}f}]"


def _grid(s: dict) -> str:
    """The grid, and the grids that replay the same runs bit for bit."""
    return s["grid"] + (f" (= {', '.join(s['also_in'])})" if s.get("also_in") else "")


def _setting(s: dict) -> list[str]:
    o = s["outcome"]
    model = s["model"] if s["task"] == "add-4d-v1" else f"{s['task']} {s['model']}"
    stats = ", ".join(f"{n} {v:.3g}" for n, v in s["stats"].items())
    first = f", first at step {o['first_collapse_step']}" if o["first_collapse_step"] is not None else ""
    within = (
        f"; within {HORIZON} steps {o['collapsed_within']}/{o['within_n']}"
        if o["within_n"]
        else f"; a run shorter than {HORIZON} steps"
    )
    lines = [
        f"  {_grid(s)} / {model} / {s['condition']} ({s['kind']}): {stats}; distance {s['distance']:.2f} (log10)",
        f"    {o['seeds']} seeds, {o['steps']} steps: accuracy lost {_g(o['accuracy_lost'])}"
        f"{_ci(o['accuracy_lost_ci'])} of the zero-mismatch endpoint; collapsed {o['collapsed']}/{o['seeds']}"
        f"{_ci(o['collapsed_ci'], 2)}{first}{within}",
    ]
    for r in s["remedies"]:
        src = f", {r['grid']}" if r.get("grid") and r["grid"] != s["grid"] else ""
        lines.append(
            f"    remedy {r['remedy']} ({r['seeds']} seeds{src}): endpoint "
            f"{r['endpoint_gain']:+.3f}{_ci(r['endpoint_gain_ci'])} vs none, {r['word']}; collapsed "
            f"{r['collapsed']}/{r['seeds']} vs {r['control_collapsed']}/{r['control_seeds']}"
            if r["endpoint_gain"] is not None
            else f"    remedy {r['remedy']} ({r['seeds']} seeds{src}): {r['word']}"
        )
    return lines


def validity_lines(v: dict) -> list[str]:
    lo, hi = v["dose_mean_abs_delta"] or (None, None)
    return [
        "validity of this map (what it rests on):",
        f"  models {', '.join(v['models'])}; tasks {', '.join(v['tasks'])}; {v['settings']} settings, "
        f"{v['seeds']} seeds from {len(v['grids'])} grids",
        f"  horizons {v['horizon_steps'][0]}-{v['horizon_steps'][1]} steps; responses "
        f"{v['response_tokens'][0]}-{v['response_tokens'][1]} tokens on average"
        if v["response_tokens"]
        else f"  horizons {v['horizon_steps'][0]}-{v['horizon_steps'][1]} steps",
        f"  doses: committed mean |delta| spans {_g(lo)}-{_g(hi)}",
        *(f"  - {c}" for c in v["caveats"]),
    ]


def answer_text(ans: dict, skipped: list[tuple[str, str]], validity: dict, safe: dict | None = None) -> str:
    """All answers of one invocation, the rows that could not be mapped, what level was safe in the committed
    real settings (risk.safe_levels), then the validity limits."""
    out = []
    for a in ans:
        out.append(f"{a['label']}:")
        for mode, settings in a["nearest"].items():
            out.append(f" {mode} ({MODES[mode]}): nearest committed settings")
            out += [x for s in settings for x in _setting(s)] or ["  none measured these statistics"]
    for label, why in skipped:
        out.append(f"{label}: not mapped: {why}")
    if safe:
        out.append("what level was safe in the committed real settings (not synthetic noise):")
        out += [_safe_line(m, s).replace("- **", "  ").replace("**", "") for m, s in safe.items()]
    return "\n".join(out + validity_lines(validity)) + "\n"


def _row(d: dict) -> str:
    def iv(x, ci):
        return "-" if x is None else f"{x:.3f}" + (f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else "")

    diff = "-" if d["statistic"] in (DOSE,) else iv(d["auc_minus_dose"], d["auc_minus_dose_ci"])
    return (
        f"| {d['statistic']} | {d['rows']} / {d['conditions']} | {d['damaged']} | {iv(d['auc'], d['auc_ci'])} | "
        f"{iv(d['accuracy'], d['accuracy_ci'])} | {_g(d['dose_auc'])} | {diff} |"
    )


def validation_markdown(v: dict, command: str) -> str:
    out = [
        "# Which mismatch statistic predicts damage? (leave-one-condition-out)",
        "",
        f"Regenerate: `{command}`",
        "",
        "Rows: one per seed of every committed grid setting without a remedy and with a mismatch (not the "
        f"zero-mismatch reference), statistics averaged over the first steps. Each statistic is fitted per rollout "
        "mode (a threshold and a one-variable logistic on log10 of it) on every condition but one and scored on "
        "the held-out condition only (the condition by name, in every grid, model and mode). Intervals: 95% "
        f"percentile, bootstrap over conditions ({v['bootstrap']} draws, seed {v['seed']}). `{MODE_ONLY}` is "
        "the control without any statistic. `dose AUC` is mean |delta| refitted on the same rows; `AUC - dose` "
        "is the paired difference (a statistic beats mean |delta| only when its interval is above 0).",
        "",
    ]
    for o in v["outcomes"].values():
        out += [
            f"## Damage = {o['definition']}",
            "",
            f"**{o['verdict']}.**",
            "",
            "| statistic | rows / conditions | damaged rows | LOCO AUC | LOCO threshold accuracy | dose AUC | "
            "AUC - dose |",
            "|---|---:|---:|---:|---:|---:|---:|",
        ]
        out += [_row(d) for d in o["ranked"]] + [""]
    out += [
        "## Reading it",
        "",
        "- Synthetic zero-mean noise does less damage than rounding at the same mean |delta|; the sections "
        "`real conditions only` rank the statistics without it.",
        f"- Accuracy lost counts as damage above {LOSS:.0%} of the same seed's zero-mismatch endpoint; a "
        f"collapse counts when the grid's rule dates it before step {HORIZON}.",
        "- The tim/* statistics are logged only by the newer grids, so they are scored on fewer conditions; "
        "their comparison with mean |delta| is on their own rows.",
        "- Few conditions (a few dozen at most) and one task at CPU scale: a ranking here is a hypothesis for "
        "larger models, not a result about them.",
        "",
    ]
    return "\n".join(out)


def _safe_line(mode: str, s: dict) -> str:
    ok, bad = s["largest_undamaged"], s["smallest_damaged"]
    where = lambda w: f"{w['dose']:.3g} ({w['condition']}, {w['model']}, {w['grid']})"  # noqa: E731
    rng = s["below_range"]
    below = (
        f"all {s['undamaged_below']} real settings below it ({rng[0]:.3g}-{rng[1]:.3g}) were undamaged"
        if rng
        else "no real setting lies below it"
    )
    return (
        f"- **{mode}** ({s['settings']} real settings, {s['damaged']} damaged): the smallest mean |delta| with "
        f"damage is {where(bad) if bad else 'none'}; {below}. The largest without damage: "
        f"{where(ok) if ok else 'none'}."
    )


def map_markdown(settings: list[dict], safe: dict, validity: dict, command: str) -> str:
    """results/risk/map.md: every committed setting without a remedy, by mode and dose, with the safe-level lines."""
    out = [
        "# The mismatch risk map: every committed setting without a remedy",
        "",
        f"Regenerate: `{command}`",
        "",
        "Statistics: mean over seeds of each run's first steps. Accuracy lost: 1 - the grid's endpoint over the "
        "same seed's zero-mismatch run (mean, 95% t interval over seeds). Collapsed: the grid's rule, k/n seeds "
        f"(Wilson interval). Damaged: any seed collapsed or more than {LOSS:.0%} accuracy lost. Query it with "
        "`timbench risk --mean-abs-delta X` (docs/risk.md).",
        "",
        "## What level was safe here (real conditions, not synthetic noise)",
        "",
        *(_safe_line(m, s) for m, s in safe.items()),
        "",
        "The two doses need not be ordered: damage is not a function of mean |delta| alone (results/risk/"
        "validation.md).",
        "",
    ]
    for mode in MODES:
        out += [
            f"## {mode}",
            "",
            "| mean abs delta | k3_kl | argmax flips | condition (kind) | model | grid | seeds x "
            "steps | accuracy lost | collapsed | damaged |",
            "|---:|---:|---:|---|---|---|---:|---:|---:|---|",
        ]
        for s in (x for x in settings if x["mode"] == mode):
            o, st = s["outcome"], s["stats"]
            out.append(
                f"| {_g(st.get(DOSE))} | {_g(st.get('k3_kl'))} | {_g(st.get('argmax_flips'))} | "
                f"{s['condition']} ({s['kind']}) | {s['model']} | {_grid(s)} | {o['seeds']} x {o['steps']} | "
                f"{_g(o['accuracy_lost'])}{_ci(o['accuracy_lost_ci'])} | {o['collapsed']}/{o['seeds']}"
                f"{_ci(o['collapsed_ci'], 2)} | {'yes' if s['damaged'] else 'no'} |"
            )
        out.append("")
    return "\n".join(out + [*validity_lines(validity), ""])
