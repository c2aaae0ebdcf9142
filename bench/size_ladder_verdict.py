"""The size ladder's verdicts: does a remedy's effect at a matched dose change with model size? (results/size_ladder)

    python bench/size_ladder_verdict.py results/size_ladder/grid

The grid (bench/grids/size_ladder.yaml) declared before it ran: the endpoint `last-half` (mean eval accuracy T=1
over steps 80-160), each size's dose (one mismatched condition per model, mean |delta| ~0.05) and its ~70%
rejection threshold, and the question: a size x setting interaction, not matching labels. Per model the settings
are read by role, not by label (the dose and the rejection threshold have a label per size):

  effect                       A                                 B
  none - baseline              dose, none, recompute             baseline, none, recompute
  tis_token - none             dose, tis_token, recompute        dose, none, recompute
  ppo_clip_0.05 - none         dose, ppo_clip_0.05, recompute    dose, none, recompute
  rejection ~70% - none        dose, tis+rs_k3_*, recompute      dose, none, recompute
  bypass - recompute           dose, none, bypass                dose, none, recompute

Per effect and size: A - B paired by seed, its 95% t interval. Per effect across the ladder (the primary family,
Holm over the five effects, timbench.report.verdict_rules): the interaction of each pair of sizes (the larger
model's A - B minus the smaller's, per seed, `size_interaction`) combined as
  `transfers`   every pair equivalent within +-MARGIN: TOST, the largest of the three p (an intersection-union
                test needs no correction inside it), then Holm over the effects;
  `differs by size`  a pair's interaction detected (two-sided t, Bonferroni over the three pairs, unadjusted
                across effects: a detected difference refutes equivalence);
  `inconclusive` otherwise; `not tested` with fewer than MIN_SEEDS paired seeds at some size, or when nothing
                happened at any size (no size detects its A - B and no pair's interaction is detected).
The interval shown is the ladder's span (medium-dense minus tiny-dense). DESCRIPTIVE, not a verdict: the slope of
the per-seed effects against log10 parameters (least squares, t interval), per effect. Every comparison rests on
the seeds finished so far; the page says how many. Writes DIR/verdict.md and DIR/verdict.json atomically; a
directory that is not such a grid is a one-line error, exit 2.
"""

from __future__ import annotations

import math
import sys
from itertools import combinations
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import verdict_page  # noqa: E402
from timbench.report.leaderboard import fmt  # noqa: E402
from timbench.report.stats import ALPHA, Interval, mean_interval, t_cdf, t_quantile, t_test  # noqa: E402
from timbench.report.verdict_rules import CORRECTION, NOT_TESTED, Test, decide, size_interaction  # noqa: E402
from timbench.studies.fidelity import ModelRuns, load_models  # noqa: E402

SIZES = ("tiny-dense", "small-dense", "medium-dense")
"""The ladder, smallest first (bench/grids/size_ladder.yaml)."""
EFFECTS = {
    "none - baseline": (("dose", "none", "recompute"), ("baseline", "none", "recompute")),
    "tis_token - none": (("dose", "tis_token", "recompute"), ("dose", "none", "recompute")),
    "ppo_clip_0.05 - none": (("dose", "ppo_clip_0.05", "recompute"), ("dose", "none", "recompute")),
    "rejection ~70% - none": (("dose", "rejection", "recompute"), ("dose", "none", "recompute")),
    "bypass - recompute": (("dose", "none", "bypass"), ("dose", "none", "recompute")),
}
"""Effect name -> (A, B) as (condition role, remedy role, mode): what is compared at every size."""
REJECTION = "tis+rs_k3_"
"""The rejection setting's remedy label prefix (its threshold differs per size)."""
MARGIN = 0.075
"""Equivalence margin of an interaction, absolute endpoint accuracy: half the F5 baseline's own gain (declared in
the grid spec before the run)."""
MIN_SEEDS = 3
"""Paired seeds every size needs before an effect's interaction is decided (the house's rule: >= 3 seeds)."""
PLANNED = 6
"""Seeds per setting in the grid spec."""


def _roles(m: ModelRuns) -> dict[str, str]:
    """The model's dose condition and rejection remedy label, read from the settings its grid declares."""
    conds = sorted({s[1] for s in m.planned if s[1] != m.reference})
    if len(conds) != 1:
        raise ValueError(
            f"{m.grid}: model {m.model} has {len(conds)} mismatched conditions ({', '.join(conds) or 'none'}); the "
            "size ladder gives each model exactly one dose (bench/grids/size_ladder.yaml)"
        )
    rs = sorted({s[2] for s in m.planned if s[2].startswith(REJECTION)})
    if len(rs) > 1:
        raise ValueError(f"{m.grid}: model {m.model} has {len(rs)} rejection settings ({', '.join(rs)}); valid: one")
    return {"baseline": m.reference, "dose": conds[0], "none": "none", "tis_token": "tis_token",
            "ppo_clip_0.05": "ppo_clip_0.05", "rejection": rs[0] if rs else REJECTION + "?"}  # fmt: skip


def _rows(m: ModelRuns, roles: dict, side: tuple) -> list[dict]:
    cond, remedy, mode = side
    return [r for s, rows in m.rows.items() if (s[1], s[2], s[3]) == (roles[cond], roles[remedy], mode) for r in rows]


def _by_seed(rows: list[dict]) -> dict:
    return {r["seed"]: r["endpoint_t1"] for r in rows if r.get("endpoint_t1") is not None}


def effect_by_seed(m: ModelRuns, roles: dict, effect: str) -> dict:
    """seed -> A - B of the endpoint for one effect on one model, on the seeds both finished."""
    a, b = (_by_seed(_rows(m, roles, side)) for side in EFFECTS[effect])
    return {s: a[s] - b[s] for s in sorted(a) if s in b}


def trend(points: list[tuple[float, float]]) -> dict:
    """Least-squares slope of y on x with its 95% t interval (n - 2 degrees of freedom) and two-sided p."""
    n = len(points)
    if n < 3 or len({x for x, _ in points}) < 2:
        return {"slope": None, "lo": None, "hi": None, "p": None, "n": n}
    mx, my = math.fsum(x for x, _ in points) / n, math.fsum(y for _, y in points) / n
    sxx = math.fsum((x - mx) ** 2 for x, _ in points)
    slope = math.fsum((x - mx) * (y - my) for x, y in points) / sxx
    rss = math.fsum((y - my - slope * (x - mx)) ** 2 for x, y in points)
    se = math.sqrt(rss / (n - 2) / sxx)
    if se == 0:
        return {"slope": slope, "lo": slope, "hi": slope, "p": 0.0 if slope else 1.0, "n": n}
    q = t_quantile(1 - ALPHA / 2, n - 2)
    return {
        "slope": slope,
        "lo": slope - q * se,
        "hi": slope + q * se,
        "p": 2 * (1 - t_cdf(abs(slope) / se, n - 2)),
        "n": n,
    }


def ladder_test(effect: str, per_size: dict[str, dict]) -> tuple[Test, list[Test]]:
    """The effect's interaction across the ladder (see the module docstring) and its pairwise tests."""
    sizes = [s for s in SIZES if s in per_size]
    by_pair = {(a, b): size_interaction(f"{b} - {a}", per_size[a], per_size[b], MARGIN, None)
               for a, b in combinations(sizes, 2)}  # fmt: skip
    pairs = list(by_pair.values())
    span = by_pair.get((sizes[0], sizes[-1])) if sizes else None  # the ladder's ends
    iv = span.interval if span else Interval(None)
    t = Test("interaction", f"{effect}: {sizes[-1]} - {sizes[0]}" if sizes else effect, iv.mean, iv, None,
             mde=span.mde if span else None, margin=MARGIN)  # fmt: skip
    short = [s for s in SIZES if len(per_size.get(s, {})) < MIN_SEEDS]
    n_paired = [len(set(per_size[a]) & set(per_size[b])) for a, b in combinations(sizes, 2)]
    if short or len(sizes) < len(SIZES) or min(n_paired, default=0) < MIN_SEEDS:
        t.blocked = f"fewer than {MIN_SEEDS} paired seeds at {', '.join(short) or 'some pair of sizes'}"
        return t, pairs
    tested = [p for p in pairs if p.p is not None]
    t.p = max(p.p for p in tested) if len(tested) == len(pairs) else None
    diffs = [p.p_diff for p in pairs if p.p_diff is not None]
    t.p_diff = min(1.0, len(pairs) * min(diffs)) if diffs else None
    detected_at_a_size = any((t_test(list(per_size[s].values())) or 1.0) < ALPHA for s in sizes)
    if not detected_at_a_size and not (t.p_diff is not None and t.p_diff < ALPHA):
        t.blocked = "nothing happened at any size (no size detects its A - B)"
    return t, pairs


def verdicts(path: str) -> dict:
    models = {m.model: m for m in load_models([path], SIZES[0])}
    missing = [s for s in SIZES if s not in models]
    if missing:
        raise ValueError(
            f"{path}: no cells of {', '.join(missing)}; valid: a result dir of bench/grids/size_ladder.yaml "
            f"(models {', '.join(SIZES)})"
        )
    roles = {s: _roles(models[s]) for s in SIZES}
    from timbench.model.config import PRESETS  # deferred: torch is heavy

    params = {s: PRESETS[s].num_parameters() for s in SIZES}
    tests, out = [], {}
    for effect in EFFECTS:
        per_size = {s: effect_by_seed(models[s], roles[s], effect) for s in SIZES}
        t, pairs = ladder_test(effect, per_size)
        tests.append(t)
        slope = trend([(math.log10(params[s]), v) for s in SIZES for v in per_size[s].values()])
        out[effect] = {
            "per_size": {
                s: {
                    "seeds": sorted(per_size[s]),
                    "effect": verdict_page.iv_json(mean_interval(list(per_size[s].values()))),
                }
                for s in SIZES
            },  # fmt: skip
            "pairs": [{"test": p.label, "text": p.text(), "p_tost": p.p, "p_difference": p.p_diff} for p in pairs],
            "slope_per_decade": slope,
        }
    decide(tests)
    for effect, t in zip(EFFECTS, tests):
        out[effect]["test"] = {"word": t.word(), "text": t.text(), "p_iut": t.p, "p_holm": t.p_adj,
                               "p_difference": t.p_diff, "not_tested": t.blocked}  # fmt: skip
    done = {
        s: {"finished": sum(len(r) for r in models[s].rows.values()), "planned": sum(models[s].planned.values())}
        for s in SIZES
    }
    return {
        "path": path,
        "endpoint": models[SIZES[0]].endpoint or "default",
        "correction": CORRECTION,
        "margin": MARGIN,
        "parameters": params,
        "doses": {s: roles[s]["dose"] for s in SIZES},
        "rejection": {s: roles[s]["rejection"] for s in SIZES},
        "cells": done,
        "effects": out,
    }


def _iv(d: dict) -> str:
    return verdict_page.fmt_json(d) if d["mean"] is not None else "-"


def _slope(s: dict) -> str:
    if s["slope"] is None:
        return "-"
    return f"{fmt(s['slope'])} [{fmt(s['lo'])}, {fmt(s['hi'])}] (n {s['n']}, p {s['p']:.2g})"


def markdown(v: dict, path: str) -> str:
    fin = sum(c["finished"] for c in v["cells"].values())
    planned = sum(c["planned"] for c in v["cells"].values())
    lines = [
        f"# The size ladder at matched mismatch: verdicts ({v['path']})",
        "",
        f"Regenerate: `python bench/size_ladder_verdict.py {v['path']}` (grid: bench/grids/size_ladder.yaml; the "
        "endpoint, the doses, the thresholds and the margin were declared in the spec before it ran).",
        "",
        f"Cells finished: {fin} of {planned}"
        + (
            " (the campaign is still running: every number rests on the seeds finished so far)."
            if fin < planned
            else "."
        ),  # fmt: skip
        "",
        "| size | parameters | dose (mean \\|delta\\| ~0.05) | rejection (~70% kept at step 0) | cells finished |",
        "|---|---:|---|---|---|",
    ]
    for s in SIZES:
        c = v["cells"][s]
        lines.append(
            f"| {s} | {v['parameters'][s]:,} | {v['doses'][s]} | {v['rejection'][s]} | "
            f"{c['finished']} of {c['planned']} |"
        )
    lines += [
        "",
        f"Endpoint: {v['endpoint']}, absolute accuracy T=1, paired by seed; every interval is 95%. How to read a "
        "verdict: [docs/verdicts.md](../../../docs/verdicts.md).",
        "",
        f"## Primary: does each effect change with size? (interaction, equivalence within +-{v['margin']}, "
        f"{v['correction']} over the five effects)",
        "",
        "| effect | verdict | numbers |",
        "|---|---|---|",
    ]
    lines += [f"| {e} | **{o['test']['word']}** | {o['test']['text']} |" for e, o in v["effects"].items()]
    lines += [
        "",
        "## Per size (A - B, paired by seed) and the trend in log10 parameters (descriptive)",
        "",
        "| effect | " + " | ".join(SIZES) + " | slope per decade of parameters |",
        "|---|" + "---|" * len(SIZES) + "---|",
    ]
    for e, o in v["effects"].items():
        cells = [_iv(o["per_size"][s]["effect"]) for s in SIZES]
        lines.append(f"| {e} | " + " | ".join(cells) + f" | {_slope(o['slope_per_decade'])} |")
    lines += ["", "## Pairwise interactions (inside each primary test)", ""]
    for e, o in v["effects"].items():
        lines += [f"- {e}: " + "; ".join(p["text"] for p in o["pairs"]) if o["pairs"] else f"- {e}: -"]
    if any(o["test"]["word"] == NOT_TESTED for o in v["effects"].values()):
        lines += ["", f"`{NOT_TESTED}` rows say why in their numbers column."]
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    return verdict_page.main(argv, "size_ladder_verdict.py", verdicts, markdown)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
