"""fidelity.md: the proxy-fidelity document (timbench.studies.fidelity) as markdown tables.

A summary (per proxy model and family, how many verdicts the interaction rule words transfers / differs by size /
inconclusive / not tested), one table per verdict family with every model's verdict and numbers beside the
interaction test against the reference model, the routing-replay control, and the per-setting
statistics the verdicts rest on. Pure function of the document; fidelity.py writes it.
"""

from __future__ import annotations

from ..report.leaderboard import fmt
from ..report.verdict_rules import DIFFERS, INCONCLUSIVE, NOT_TESTED, TRANSFERS
from .fidelity import COLLAPSES, CONTROL, FAMILIES, MIN_SEEDS, MISSING, WORDS

LEGEND = (
    f"Legend (timbench/report/verdict_rules.py): per proxy, the *interaction* is tested, not the labels: for an "
    f"effect or a remedy order, the proxy's A - B minus the reference model's, per seed (the difference of "
    f"paired differences, 95% t interval); `{TRANSFERS}` when it is equivalent to 0 within the margin (TOST, "
    f"Holm within the proxy's family), `{DIFFERS}` when it is detected, `{INCONCLUSIVE}` otherwise. For a "
    f"collapse, the proxy's collapse rate against the reference model's (Fisher's exact test): `{DIFFERS}` "
    f"when detected, else `{INCONCLUSIVE}` (2-6 seeds do not show two rates equal). `{NOT_TESTED}` when "
    "nothing happened at any size (neither model detects A - B; no seed collapses on either), with fewer "
    f"than {MIN_SEEDS} paired seeds, without a margin (routing disagreement has none), or when the smallest "
    f"detectable interaction exceeds the learning range. `{CONTROL}`: a routing-replay order on a model whose "
    "routing cannot disagree (judged by the control below, not counted)."
)

TITLES = {
    "collapse": (
        "1. Collapse or not, per condition / remedy",
        f"`{COLLAPSES}` when >= 2/3 of the finished seeds collapsed (the grid's collapse rule); numbers: "
        "collapsed/seeds, endpoint accuracy T=1 mean [95% t interval over seeds], seeds; vs reference: the "
        "proxy's collapse rate against the reference model's (Fisher).",
    ),
    "effect": (
        "2. Effect of each mismatch condition vs the same model's baseline (remedy none)",
        "A = the condition, B = the baseline; endpoint accuracy T=1, A - B paired by seed: mean [95% t "
        "interval], seeds; `detected` when the interval excludes 0; vs reference: the interaction.",
    ),
    "order": (
        "3. Remedy order per condition",
        "A - B paired by seed on endpoint accuracy T=1 (higher is better) or on routing disagreement "
        "(1 - mean over steps of mismatch/routing_agreement; lower is better): mean [95% t interval], seeds; "
        "vs reference: the interaction.",
    ),
}


def _iv(x) -> str:
    if x is None:
        return "-"
    return fmt(x[0]) if x[1] is None else f"{fmt(x[0])} [{fmt(x[1])}, {fmt(x[2])}]"


def _seeds(seeds: list) -> str:
    return "seeds " + (",".join(map(str, seeds)) or "none")


def result_text(r: dict) -> str:
    """One model's verdict with its numbers."""
    if "collapsed" in r and "n" in r:  # a collapse verdict
        if r["word"] == MISSING:
            return f"{MISSING} ({r['n']} finished seeds, {MIN_SEEDS} needed)"
        return f"{r['word']}: {r['collapsed']}/{r['n']}, acc {_iv(r['final_accuracy'])}, {_seeds(r['seeds'])}"
    (ka, na), (kb, nb) = r["collapsed"]
    if r["word"] == MISSING:
        return f"{MISSING} ({len(r['seeds'])} paired seeds, {MIN_SEEDS} needed)"
    return (
        f"{r['word']}: {_iv(r['diff'])} (A {_iv(r['a'])}, {ka}/{na} collapsed; B {_iv(r['b'])}, {kb}/{nb}), "
        f"{_seeds(r['seeds'])}"
    )


def _family_table(doc: dict, fam: str) -> list[str]:
    models = list(doc["models"])
    ref, others = models[0], models[1:]
    title, how = TITLES[fam]
    head = ["verdict", f"{ref} (reference)"] + [x for m in others for x in (m, f"{m} vs reference")]
    lines = [f"## {title}", "", how, "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for v in (v for v in doc["verdicts"] if v["family"] == fam):
        name = (
            v["a"] if v["b"] is None else f"A {v['a']} vs B {v['b']}" + (f", {v['metric']}" if fam == "order" else "")
        )
        cells = [name, result_text(v["models"][ref])]
        cells += [
            x
            for m in others
            for x in (
                result_text(v["models"][m]),
                f"**{v['fidelity'][m]}**" + (f": {v['tests'][m]['text']}" if m in v.get("tests", {}) else ""),
            )
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines + [""]


def _count(c: dict) -> str:
    return ", ".join(f"{c[w]} {w}" for w in WORDS if c[w]) or "-"


def _summary(doc: dict) -> list[str]:
    lines = [
        "## Summary: what the interaction rule says per proxy",
        "",
        'Counts of the rule\'s words per family (no "k of n same": a verdict on which nothing happened at any '
        "size is `not tested`, not a verdict that survives).",
        "",
        "| model | collapse | effect vs baseline | remedy order | all |",
        "|---|---|---|---|---|",
    ]
    for m, fams in doc["survival"].items():
        lines.append(f"| {m} | " + " | ".join(_count(fams[f]) for f in (*FAMILIES, "all")) + " |")
    return lines + [""]


def _control(doc: dict) -> list[str]:
    lines = [
        "## Control: routing replay where routing cannot disagree",
        "",
        "With every expert routed (num_experts <= top-k, e.g. tiny-moe-e2: 2 experts, top-2) engine and trainer "
        "pick the same experts, so R2/R3 replay nothing: each routing remedy vs none must be `no difference "
        "detected` (passes); a detected difference fails the control.",
        "",
    ]
    if not doc["control"]:
        return lines + ["No model of these grids routes every token to every expert: the control is not run.", ""]
    for c in doc["control"]:
        lines.append(
            f"- **{c['model']}: {c['verdict']}** ({c['missing']} of {len(c['checks'])} checks missing cells; "
            f"largest routing disagreement of any finished run: {fmt(c['max_routing_disagreement'])})"
        )
        lines += [f"  - A {x['a']} vs B {x['b']}, {x['metric']}: {result_text(x['result'])}" for x in c["checks"]]
    return lines + [""]


def _settings(doc: dict) -> list[str]:
    lines = [
        "## Per-setting statistics",
        "",
        "Seeds finished of planned; collapsed seeds; endpoint accuracy T=1 "
        f"({doc['endpoint']}, the verdicts' endpoint) and routing disagreement: mean [95% t interval over "
        "seeds].",
        "",
        "| model | grid | setting | finished/planned | seeds | collapsed | endpoint accuracy T=1 | "
        "routing disagreement |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for m, d in doc["models"].items():
        for s in d["settings"]:
            lines.append(
                f"| {m} | {d['grid']} | {s['setting']} | {s['finished']}/{s['planned']} | "
                f"{','.join(map(str, s['seeds'])) or '-'} | {s['collapsed']} | {_iv(s['endpoint_accuracy'])} | "
                f"{_iv(s['routing_disagreement'])} |"
            )
    return lines + [""]


def markdown(doc: dict, command: str) -> str:
    models = ", ".join(
        f"{m} ({d['grid']}, seeds {','.join(map(str, d['seeds'])) or 'none finished'})"
        for m, d in doc["models"].items()
    )
    lines = [
        "# Proxy fidelity across sizes",
        "",
        f"Regenerate: `{command}`",
        "",
        f"Reference model: {doc['reference_model']}. Models: {models}.",
        "",
        f"Endpoint: {doc['endpoint']} ({doc['endpoint_text']}; "
        f"{'pre-registered' if doc['endpoint_declared'] else 'default; the grid declares none'}). Margin: "
        f"+-{fmt(doc['learning_range'] / 2 if doc['learning_range'] else None)}, half the reference model's "
        f"learning range (its zero-mismatch own gain, {fmt(doc['learning_range'])}). How to read a verdict: "
        "[docs/verdicts.md](../../../docs/verdicts.md).",
        "",
        'Does each verdict on the reference model survive the change of proxy size? "Same direction" is the '
        "claim (arXiv 2608.10823), not equal numbers. Rules: timbench/studies/fidelity.py.",
        "",
        LEGEND,
        "",
    ]
    lines += _summary(doc)
    for fam in FAMILIES:
        lines += _family_table(doc, fam)
    return "\n".join(lines + _control(doc) + _settings(doc))
