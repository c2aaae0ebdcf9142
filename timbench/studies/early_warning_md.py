"""early_warning.md: the early-warning document (timbench.studies.early_warning) as markdown.

The headline (real conditions: does any metric warn?), its full table, one line per condition kind (synthetic
noise last, outside the headline) and the kinds' tables. Pure function of the document.
"""

from __future__ import annotations

from ..report.stats import ALPHA
from ..report.verdict_rules import CORRECTION, WARNS

RULE = (
    "Rule (timbench/studies/early_warning.py): a metric warns at the first step *after step 0* at which it "
    "leaves the healthy envelope (its largest value in any surviving run of a real condition of the *other* "
    "seeds: leave one seed out), counted only for a run that started inside it, or at which its rise since step "
    "0 exceeds the largest rise of those runs (a within-run change). A run already outside at step 0 is flagged "
    "by its condition, not warned. Lead = collapse step - warning step, early when >= 1; a collapse by step 1 "
    "leaves no room (too soon, outside the rates). A surviving run that is warned is a false alarm. Rates: "
    "Wilson 95%; J = early rate - false-alarm rate with Newcombe's 95% interval; mean lead: Student t 95% over "
    f"runs. Verdict (timbench/report/verdict_rules.py): `{WARNS}` when the early rate is above the false-alarm "
    f"rate by Fisher's exact test, {CORRECTION}-adjusted p < {ALPHA:.2g} over the table's candidates; `does not "
    "warn` otherwise; `not tested` when no run of one side logs it or too few to detect even a perfect warning. "
    "A candidate is scored only on the runs that log it (the `tim/` metrics exist in grids made after they "
    "were added). How to read a verdict: [docs/verdicts.md](../../../docs/verdicts.md)."
)
HEAD = (
    "| rank | metric | warns on | collapsed runs | early | late | missed | outside at step 0 | too soon | "
    "early rate | median lead | mean lead | false alarms | J | Fisher p (Holm) | verdict |"
)


def _iv(x, digits=2) -> str:
    return "-" if x is None else f"{x[0]:.{digits}f} [{x[1]:.{digits}f}, {x[2]:.{digits}f}]"


def _p(p) -> str:
    return "-" if p is None else f"{p:.2g}" if p >= 0.001 else "<0.001"


def _table(rows: list[dict]) -> list[str]:
    lines = [HEAD, "|" + "---|" * HEAD.count(" | ") + "---|"]
    for i, r in enumerate(rows, 1):
        fa = f"{r['false_alarms']}/{r['healthy_runs']} {_iv(r['false_alarm_rate'])}"
        j = _iv(r["j_interval"]) if r["j_interval"] else "-" if r["youden_j"] is None else f"{r['youden_j']:.2f}"
        lines.append(
            f"| {i} | `{r['metric']}` | {r['direction']} | {r['collapsed_runs']} | {r['early']} | "
            f"{r['late']} | {r['missed']} | {r['flagged_at_step0']} | {r['too_soon']} | "
            f"{_iv(r['early_rate'])} | {'-' if r['median_lead'] is None else r['median_lead']} | "
            f"{_iv(r['mean_lead'], 1)} | {fa} | {j} | {_p(r['p'])} ({_p(r['p_holm'])}) | "
            f"{r['verdict']}" + (f" ({r['not_tested']})" if r["not_tested"] else "") + " |"
        )
    return lines


def headline(real: dict, rows: list[dict]) -> str:
    """One plain sentence: which metrics warn on the real conditions, or that none does."""
    n = len(rows)
    timing = (
        f"{real['runs']} runs of real conditions, {real['collapsed']} collapsed, "
        f"{real['collapsed_by_step8']} of them by step 8"
    )
    if not real["warns"]:
        return (
            f"**No metric warns on real conditions**: none of the {n} candidates has an early-warning rate above "
            f"its false-alarm rate ({CORRECTION} over {n}). {timing}."
        )
    return (
        f"**{len(real['warns'])} of {n} candidates warn on real conditions**: "
        + ", ".join(f"`{m}`" for m in real["warns"])
        + f" ({CORRECTION} over {n}). {timing}."
    )


def _kinds(doc: dict) -> list[str]:
    lines = [
        "## Per condition kind",
        "",
        "Each kind scored on its own runs, envelopes from the real conditions' surviving runs; the verdicts "
        f"are {CORRECTION}-adjusted within each kind. `noise` (zero-mean noise on the logits) is synthetic: "
        "its dose sets the mismatch metrics from step 0, so it is kept out of the headline.",
        "",
        "| kind | runs | collapsed | collapsed by step 8 | collapse steps | metrics that warn |",
        "|---|---|---|---|---|---|",
    ]
    for k in doc["kinds"]:
        steps = k["collapse_steps"]
        span = "-" if not steps else f"{steps[0]}-{steps[-1]} (median {steps[len(steps) // 2]})"
        lines.append(
            f"| {k['kind']}{' (synthetic, not in the headline)' if k['kind'] == 'noise' else ''} | "
            f"{k['runs']} | {k['collapsed']} | {k['collapsed_by_step8']} | {span} | "
            f"{', '.join(f'`{m}`' for m in k['warns']) or 'none'} |"
        )
    lines.append("")
    for k in doc["kinds"]:
        if k["collapsed"]:
            lines += [f"### {k['kind']}", ""] + _table(k["table"]) + [""]
    return lines


def markdown(doc: dict, command: str) -> str:
    lines = [
        "# Early warnings of a collapse",
        "",
        f"Grids: {', '.join(doc['grids'])}. {doc['runs']} finished runs, {doc['collapsed']} collapsed (each "
        f"grid's collapse rule); seeds {doc['seeds']}.",
        "",
        headline(doc["real"], doc["table"]),
        "",
        RULE,
        "",
        "## Real conditions (every kind but synthetic noise)",
        "",
    ]
    lines += _table(doc["table"]) + [""] + _kinds(doc) + [f"Regenerate: `{command}`", ""]
    return "\n".join(lines)
