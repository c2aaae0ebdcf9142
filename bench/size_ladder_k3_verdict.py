"""The size ladder's K3 control: is bypass's larger cost at medium-dense the size or the tail of the dose?

    python bench/size_ladder_k3_verdict.py results/size_ladder/grid results/size_ladder_k3

The ladder (bench/size_ladder_verdict.py) matched its doses on mean |delta| ~0.05 and found bypass - recompute
`differs by size`: about twice as costly at medium-dense as at tiny- and small-dense, where medium-dense's dose
also had the heavier K3 (0.0185 against 0.0140 and 0.0142). bench/grids/size_ladder_k3.yaml reruns that one pair
on medium-dense at the sigma whose K3 matches the smaller rungs' (0.65: K3 0.0144). Declared with the grid,
before it ran: the endpoint (last-half mean eval accuracy, T=1), the effect (bypass - recompute, paired by seed)
and the ladder's margin (+-0.075), and three interactions, each the K3-matched medium-dense effect minus another
rung's, paired by seed (`size_interaction`); equivalence by TOST, Holm over the three, a difference by the
two-sided t, Bonferroni over the three:

  medium-dense (K3-matched) - tiny-dense                        the size, with the tail matched
  medium-dense (K3-matched) - small-dense                       the size, with the tail matched
  medium-dense (K3-matched) - medium-dense (the ladder's dose)  the tail, with the size fixed

How it reads (`reading`): **the tail** when both size interactions are equivalent within the margin and the tail's
is detected; **the size** when a size interaction is detected and the tail's is equivalent; **both** when a size
interaction and the tail's are detected; **undecided** otherwise. Each interaction's word is the ladder's
(`transfers` = equivalent, `differs by size` = detected, `inconclusive`, `not tested` below 3 paired seeds).
Reads whatever seeds have finished and says how many. Writes K3_DIR/verdict.md and verdict.json atomically; a
directory that is not such a grid is a one-line error, exit 2.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import verdict_page  # noqa: E402
from bench.size_ladder_verdict import MARGIN, MIN_SEEDS, _roles, effect_by_seed  # noqa: E402
from timbench.report.stats import mean_interval  # noqa: E402
from timbench.report.verdict_rules import CORRECTION, decide, size_interaction  # noqa: E402
from timbench.studies.fidelity import models_of  # noqa: E402

EFFECT = "bypass - recompute"
"""The one effect the control re-measures (bench/size_ladder_verdict.EFFECTS)."""
CONTROL_MODEL = "medium-dense"
"""The rung whose dose the control re-matches on K3."""
RUNGS = ("tiny-dense", "small-dense", "medium-dense")
"""The ladder's rungs the control is compared with (the last is the same size at the mean-|delta| match)."""


def _per_seed(m) -> dict:
    return effect_by_seed(m, _roles(m), EFFECT)


def _load(path: str, models: tuple[str, ...], what: str) -> dict:
    try:
        found = {m.model: m for m in models_of(path)}
    except (OSError, ValueError) as e:
        raise ValueError(f"{e}; valid: {what}") from e
    missing = [m for m in models if m not in found]
    if missing:
        raise ValueError(f"{path}: no cells of {', '.join(missing)}; valid: {what}")
    return found


def label(rung: str) -> str:
    """The interaction's name: the K3-matched control minus a ladder rung (the same size: the ladder's dose)."""
    return f"{CONTROL_MODEL} (K3-matched) - {rung}" + (" (the ladder's dose)" if rung == CONTROL_MODEL else "")


def reading(words: dict[str, str]) -> str:
    """The declared reading of the three interaction words (module docstring)."""
    size = [words[label(r)] for r in RUNGS[:2]]
    tail = words[label(CONTROL_MODEL)]
    if all(w == "transfers" for w in size) and tail == "differs by size":
        return "the tail"
    if "differs by size" in size and tail == "transfers":
        return "the size"
    if "differs by size" in size and tail == "differs by size":
        return "both"
    return "undecided"


def verdicts(ladder: str, control: str) -> dict:
    rungs = _load(ladder, RUNGS, "a result dir of bench/grids/size_ladder.yaml")
    k3 = _load(control, (CONTROL_MODEL,), "a result dir of bench/grids/size_ladder_k3.yaml")[CONTROL_MODEL]
    ctrl = _per_seed(k3)
    per = {r: _per_seed(rungs[r]) for r in RUNGS}
    tests = []
    for r in RUNGS:
        t = size_interaction(label(r), per[r], ctrl, MARGIN, None)
        if len(set(per[r]) & set(ctrl)) < MIN_SEEDS:
            t.blocked = f"fewer than {MIN_SEEDS} paired seeds (the control has {len(ctrl)})"
        # A detected difference is read at Bonferroni over the three, as the ladder reads its pairs.
        t.p_diff = None if t.p_diff is None else min(1.0, len(RUNGS) * t.p_diff)
        tests.append(t)
    decide(tests)
    words = {t.label: t.word() for t in tests}
    return {
        "ladder": ladder,
        "control": control,
        "effect": EFFECT,
        "margin": MARGIN,
        "correction": CORRECTION,
        "doses": {"control": _roles(k3)["dose"], **{r: _roles(rungs[r])["dose"] for r in RUNGS}},
        "cells": {"finished": sum(map(len, k3.rows.values())), "planned": sum(k3.planned.values())},
        "effects": {
            "control": {"seeds": sorted(ctrl), "effect": verdict_page.iv_json(mean_interval(list(ctrl.values())))},
            **{
                r: {"seeds": sorted(per[r]), "effect": verdict_page.iv_json(mean_interval(list(per[r].values())))}
                for r in RUNGS
            },
        },
        "tests": [
            {
                "test": t.label,
                "word": t.word(),
                "text": t.text(),
                "p_tost": t.p,
                "p_holm": t.p_adj,
                "p_difference": t.p_diff,
                "not_tested": t.blocked,
            }
            for t in tests
        ],
        "reading": reading(words),
    }


def markdown(v: dict, _path: str = "") -> str:
    c = v["cells"]
    lines = [
        f"# The size ladder's K3 control: verdicts ({v['control']})",
        "",
        f"Regenerate: `python bench/size_ladder_k3_verdict.py {v['ladder']} {v['control']}` (grid: "
        "bench/grids/size_ladder_k3.yaml; the effect, the endpoint, the three interactions and the margin were "
        "declared before it ran).",
        "",
        f"Control cells finished: {c['finished']} of {c['planned']}"
        + (
            " (still running: every number rests on the seeds finished so far)."
            if c["finished"] < c["planned"]
            else "."
        ),
        "",
        f"**Reading: {v['reading']}** (the tail: both size interactions equivalent within +-{v['margin']} and the "
        "tail's detected; the size: a size interaction detected and the tail's equivalent; both: both detected; "
        "undecided otherwise).",
        "",
        f"## {v['effect']} (last-half eval accuracy, T=1, paired by seed, 95% t interval)",
        "",
        "| rung | dose | seeds | effect |",
        "|---|---|---|---|",
        f"| medium-dense, K3-matched | {v['doses']['control']} | {len(v['effects']['control']['seeds'])} | "
        f"{verdict_page.fmt_json(v['effects']['control']['effect'])} |",
    ]
    for r in RUNGS:
        e = v["effects"][r]
        lines.append(f"| {r} (ladder) | {v['doses'][r]} | {len(e['seeds'])} | {verdict_page.fmt_json(e['effect'])} |")
    lines += [
        "",
        f"## Interactions (equivalence within +-{v['margin']}, {v['correction']} over the three)",
        "",
        "| interaction | verdict | numbers |",
        "|---|---|---|",
    ]
    lines += [f"| {t['test']} | **{t['word']}** | {t['text']} |" for t in v["tests"]]
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    return verdict_page.main(argv, "size_ladder_k3_verdict.py", verdicts, markdown, ("LADDER_DIR", "K3_DIR"))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
