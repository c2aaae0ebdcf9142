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


def _setting(s: dict) -> list[str]:
    o = s["outcome"]
    model = s["model"] if s["task"] == "add-4d-v1" else f"{s['task']} {s['model']}"
    stats = ", ".join(f"{n} {v:.3g}" for n, v in s["stats"].items())
    first = f", first at step {o['first_collapse_step']}" if o["first_collapse_step"] is not None else ""
    within = (f"; within {HORIZON} steps {o['collapsed_within']}/{o['within_n']}" if o["within_n"] else
              f"; a run shorter than {HORIZON} steps")
    lines = [f"  {s['grid']} / {model} / {s['condition']} ({s['kind']}): {stats}; distance {s['distance']:.2f} "
             f"(log10)",
             f"    {o['seeds']} seeds, {o['steps']} steps: accuracy lost {_g(o['accuracy_lost'])}"
             f"{_ci(o['accuracy_lost_ci'])} of the zero-mismatch endpoint; collapsed {o['collapsed']}/{o['seeds']}"
             f"{_ci(o['collapsed_ci'], 2)}{first}{within}"]
    for r in s["remedies"]:
        lines.append(f"    remedy {r['remedy']} ({r['seeds']} seeds): endpoint "
                     f"{r['endpoint_gain']:+.3f}{_ci(r['endpoint_gain_ci'])} vs none, {r['word']}; collapsed "
                     f"{r['collapsed']}/{r['seeds']} vs {r['control_collapsed']}/{r['control_seeds']}"
                     if r["endpoint_gain"] is not None else
                     f"    remedy {r['remedy']} ({r['seeds']} seeds): {r['word']}")
    return lines


def validity_lines(v: dict) -> list[str]:
    lo, hi = v["dose_mean_abs_delta"] or (None, None)
    return ["validity of this map (what it rests on):",
            f"  models {', '.join(v['models'])}; tasks {', '.join(v['tasks'])}; {v['settings']} settings, "
            f"{v['seeds']} seeds from {len(v['grids'])} grids",
            f"  horizons {v['horizon_steps'][0]}-{v['horizon_steps'][1]} steps; responses "
            f"{v['response_tokens'][0]}-{v['response_tokens'][1]} tokens on average" if v["response_tokens"] else
            f"  horizons {v['horizon_steps'][0]}-{v['horizon_steps'][1]} steps",
            f"  doses: committed mean |delta| spans {_g(lo)}-{_g(hi)}",
            *(f"  - {c}" for c in v["caveats"])]


def answer_text(ans: dict, skipped: list[tuple[str, str]], validity: dict) -> str:
    """All answers of one invocation, then the rows that could not be mapped, then the validity limits."""
    out = []
    for a in ans:
        out.append(f"{a['label']}:")
        for mode, settings in a["nearest"].items():
            out.append(f" {mode} ({MODES[mode]}): nearest committed settings")
            out += [x for s in settings for x in _setting(s)] or ["  none measured these statistics"]
    for label, why in skipped:
        out.append(f"{label}: not mapped: {why}")
    return "\n".join(out + validity_lines(validity)) + "\n"


def _row(d: dict) -> str:
    def iv(x, ci):
        return "-" if x is None else f"{x:.3f}" + (f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else "")

    diff = "-" if d["statistic"] in (DOSE,) else iv(d["auc_minus_dose"], d["auc_minus_dose_ci"])
    return (f"| {d['statistic']} | {d['rows']} / {d['conditions']} | {d['damaged']} | {iv(d['auc'], d['auc_ci'])} | "
            f"{iv(d['accuracy'], d['accuracy_ci'])} | {_g(d['dose_auc'])} | {diff} |")


def validation_markdown(v: dict, command: str) -> str:
    out = ["# Which mismatch statistic predicts damage? (leave-one-condition-out)", "",
           f"Regenerate: `{command}`", "",
           "Rows: one per seed of every committed grid setting without a remedy and with a mismatch (not the "
           f"zero-mismatch reference), statistics averaged over the first steps. Each statistic is fitted per rollout "
           "mode (a threshold and a one-variable logistic on log10 of it) on every condition but one and scored on "
           "the held-out condition only (the condition by name, in every grid, model and mode). Intervals: 95% "
           f"percentile, bootstrap over conditions ({v['bootstrap']} draws, seed {v['seed']}). `{MODE_ONLY}` is "
           "the control without any statistic. `dose AUC` is mean |delta| refitted on the same rows; `AUC - dose` "
           "is the paired difference (a statistic beats mean |delta| only when its interval is above 0).", ""]
    for name, o in v["outcomes"].items():
        out += [f"## Damage = {o['definition']}", "", f"**{o['verdict']}.**", "",
                "| statistic | rows / conditions | damaged rows | LOCO AUC | LOCO threshold accuracy | dose AUC | "
                "AUC - dose |", "|---|---:|---:|---:|---:|---:|---:|"]
        out += [_row(d) for d in o["ranked"]] + [""]
    out += ["## Reading it", "",
            f"- Accuracy lost counts as damage above {LOSS:.0%} of the same seed's zero-mismatch endpoint; a "
            f"collapse counts when the grid's rule dates it before step {HORIZON}.",
            "- The tim/* statistics are logged only by the newer grids, so they are scored on fewer conditions; "
            "their comparison with mean |delta| is on their own rows.",
            "- Few conditions (a few dozen at most) and one task at CPU scale: a ranking here is a hypothesis for "
            "larger models, not a result about them.", ""]
    return "\n".join(out)
