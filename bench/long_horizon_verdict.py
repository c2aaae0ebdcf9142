"""The long-horizon campaign's verdicts: does a small mismatch change 1,000 steps of RL? (results/long_horizon)

    python bench/long_horizon_verdict.py results/long_horizon

The grid (bench/grids/long_horizon.yaml) declared its endpoint before it ran: `last-half`, the mean eval accuracy
T=1 over steps 500-1000. The family below was fixed on 2026-12-07, when 4 of the 30 cells (seed 0 of four
settings) had finished and been read; seeds 1-5 had not run. It is decided by the repo's rules
(timbench.report.verdict_rules, docs/verdicts.md):
  primary family (Holm over the four mismatched settings): "setting S learns like zero mismatch": the per-seed
    difference S - baseline of the endpoint, paired by seed, lies within +-MARGIN (TOST equivalence);
  secondary family (Holm): "S collapses more often than zero mismatch" (Fisher exact on the collapse rule's
    collapsed seeds k/n, timbench.report.collapse), with how many collapsed seeds rose first (the paper's
    rise-then-collapse) and, for each collapse, whether K3 warned at least KL_LEAD steps before it (F3);
  DESCRIPTIVE, not verdicts: per setting the peak step, the drop from peak to final eval, the final accuracy.
Every comparison rests on the seeds both settings finished, so the page can be read while the campaign runs; it
says how many. Writes DIR/verdict.md and DIR/verdict.json atomically; a directory that is not such a grid is a
one-line error, exit 2.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import verdict_page  # noqa: E402
from timbench.report.leaderboard import fmt  # noqa: E402
from timbench.report.stats import mean_interval, wilson  # noqa: E402
from timbench.report.verdict_rules import CORRECTION, decide, paired_no_difference, rate_vs_control  # noqa: E402
from timbench.studies.paper import paper_data  # noqa: E402
from timbench.studies.paper_claims import acc, at_floor, collapses, diffs, over_seeds  # noqa: E402
from timbench.studies.paper_evidence import KL_LEAD, kl_alarm_step, rose_before_collapse  # noqa: E402

SETTINGS = [
    ("bf16-engine", "recompute"),
    ("bf16-engine", "bypass"),
    ("fp8-rollout", "recompute"),
    ("fp8-rollout", "bypass"),
]
"""The mismatched settings of the grid, each compared with the zero-mismatch baseline (recompute)."""
PLANNED = 6
"""Seeds per setting in the grid spec."""
MARGIN = 0.05
"""Equivalence margin, absolute endpoint accuracy: about an eighth of the seed-0 baseline's own gain over the run
(0.427: 0.367 at step 0 to 0.794 over the last half), two binomial standard errors of one 256-problem eval near
p = 0.8; a difference this small is below what a user would act on at this scale."""
MIN_SEEDS = 3
"""Paired seeds a comparison needs before it is decided (the house's rule: evidence is >= 3 seeds; the repo's
generic rules decide from 2)."""


def _eval_curve(cell) -> list[tuple[int, float]]:
    return [(int(e["step"]), float(e["accuracy_t1"])) for e in cell.evals if e.get("accuracy_t1") is not None]


def _shape(cells) -> dict:
    """Over seeds: the step of the peak eval, the drop from the peak to the final eval, the final eval."""
    peaks, drops, finals = [], [], []
    for c in cells:
        curve = _eval_curve(c)
        if not curve:
            continue
        step, top = max(curve, key=lambda sv: (sv[1], -sv[0]))
        peaks.append(step)
        drops.append(top - curve[-1][1])
        finals.append(curve[-1][1])
    return {
        k: verdict_page.iv_json(mean_interval(v)) for k, v in (("peak_step", peaks), ("drop", drops), ("final", finals))
    }


def _collapse_detail(d, key, rows) -> dict:
    """How many collapsed seeds rose first, and how many had a K3 warning >= KL_LEAD steps before the collapse."""
    by_seed = {c.axes.get("seed"): c for c in d.cells.get(key, [])}
    rose = warned = 0
    for r in rows:
        if not r.get("collapse/collapsed") or r.get("collapse/step") is None:
            continue
        cell = by_seed.get(r["seed"])
        if cell is None:
            continue
        rose += rose_before_collapse(cell, r, d.smooth)
        alarm = kl_alarm_step(cell, d.smooth)
        warned += alarm is not None and alarm <= int(r["collapse/step"]) - KL_LEAD
    return {"rose_first": rose, "k3_warned": warned}


def verdicts(path: str) -> dict:
    d, _ = paper_data(path)
    ref = d.setting(*d.reference)
    present = [(c, m) for c, m in SETTINGS if d.setting(c, "none", m)]
    if not ref or not present:
        raise ValueError(
            f"{path}: no finished zero-mismatch and bf16/fp8 cells of remedy none; valid: a result dir of "
            "bench/grids/long_horizon.yaml"
        )
    lr, learns, gains = d.learning()
    equiv, rates, out = [], [], {}
    for c, m in SETTINGS:
        rows = d.setting(c, "none", m)
        name = f"{c}/{m}"
        ds = diffs(rows, ref, acc)
        test = paired_no_difference(f"{name} - baseline", ds, MARGIN, None, at_floor(rows, ref), learns)
        if test.blocked is None and len(ds) < MIN_SEEDS:
            test.blocked = f"{len(ds)} paired seeds, fewer than {MIN_SEEDS}"
        equiv.append(test)
        k, n = collapses(rows)
        k0, n0 = collapses(ref)
        rates.append(rate_vs_control(f"{name} collapses more than zero mismatch", k, n, k0, n0))
        out[name] = {
            "seeds": len(rows),
            "planned": PLANNED,
            "endpoint": verdict_page.iv_json(over_seeds(rows, acc)),
            "mean_abs_delta": verdict_page.iv_json(over_seeds(rows, lambda r: r.get("mean/mismatch/mean_abs_delta"))),
            "collapsed": [k, n],
            **_collapse_detail(d, (c, "none", m), rows),
            "shape": _shape(d.cells.get((c, "none", m), [])),
        }
    decide(equiv)
    decide(rates)

    def rows_of(tests):
        return [
            {"test": t.label, "word": t.word(), "text": t.text(), "p": t.p, "p_holm": t.p_adj, "n": t.interval.n}
            | {"not_tested": t.blocked}
            for t in tests
        ]

    return {
        "path": path,
        "endpoint": d.endpoint,
        "declared": d.declared,
        "correction": CORRECTION,
        "margin": MARGIN,
        "baseline_gain": verdict_page.iv_json(gains),
        "baseline_learns": learns,
        "baseline": {
            "seeds": len(ref),
            "endpoint": verdict_page.iv_json(over_seeds(ref, acc)),
            "collapsed": list(collapses(ref)),
            "shape": _shape(d.cells.get(d.reference, [])),
        },
        "settings": out,
        "equivalence": rows_of(equiv),
        "collapse_rates": rows_of(rates),
    }


def _shape_cells(s: dict) -> str:
    return " | ".join(verdict_page.fmt_json(s["shape"][k]) for k in ("peak_step", "drop", "final"))


def markdown(v: dict, path: str) -> str:
    done = v["baseline"]["seeds"] + sum(s["seeds"] for s in v["settings"].values())
    planned = PLANNED * (1 + len(v["settings"]))
    lines = [
        f"# The long horizon: 1,000 steps under a bf16 or FP8 mismatch, verdicts ({v['path']})",
        "",
        f"Regenerate: `python bench/long_horizon_verdict.py {v['path']}` (grid: bench/grids/long_horizon.yaml; "
        "the endpoint was declared in the spec before it ran; the family and its margin were fixed when 4 of 30 "
        "cells, seed 0 of four settings, had been read: bench/long_horizon_verdict.py says so).",
        "",
        f"Cells finished: {done} of {planned} planned"
        + (
            " (the campaign is still running: every number rests on the seeds finished so far)."
            if done < planned
            else "."
        ),
        "",
        f"Endpoint: {v['endpoint']} (declared: {v['declared']}), absolute accuracy T=1, paired by seed; "
        f"{v['correction']} within each family; every interval is 95%. Zero-mismatch baseline: endpoint "
        f"{verdict_page.fmt_json(v['baseline']['endpoint'])}, own gain {verdict_page.fmt_json(v['baseline_gain'])} "
        f"({v['baseline']['seeds']} seeds). How to read a verdict: [docs/verdicts.md](../../docs/verdicts.md).",
        "",
        f"## Primary: each mismatched setting learns like zero mismatch (equivalence within +-{v['margin']})",
        "",
        "| comparison | verdict | numbers |",
        "|---|---|---|",
    ]
    lines += [f"| {t['test']} | **{t['word']}** | {t['text']} |" for t in v["equivalence"]]
    lines += ["", "## Secondary: collapse rates against zero mismatch (Fisher exact, Holm)", ""]
    lines += [f"- **{t['word']}**: {t['text']}" for t in v["collapse_rates"]]
    lines += [
        "",
        "## Per setting",
        "",
        "Collapse: the grid's collapse rule (timbench.report.collapse); rose first: the smoothed reward climbed 5% "
        f"above its first window before the collapse (the paper's rise-then-collapse); K3 warned: K3 rose above 2x "
        f"its first 5 steps at least {KL_LEAD} steps before the collapse (F3). Peak step, drop (peak eval - final "
        "eval) and final eval are descriptive.",
        "",
        "| setting | seeds (planned) | mean \\|delta\\| | endpoint | collapsed [Wilson] | rose first | K3 warned "
        "| peak step | drop from peak | final eval |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    b = v["baseline"]
    k, n = b["collapsed"]
    w = wilson(k, n)
    lines.append(
        f"| baseline (zero mismatch) | {b['seeds']} ({PLANNED}) | 0 | {verdict_page.fmt_json(b['endpoint'])} | {k}/{n} "
        f"[{fmt(w.lo)}, {fmt(w.hi)}] | - | - | {_shape_cells(b)} |"
    )
    for name, s in v["settings"].items():
        k, n = s["collapsed"]
        w = wilson(k, n)
        lines.append(
            f"| {name} | {s['seeds']} ({s['planned']}) | {verdict_page.fmt_json(s['mean_abs_delta'])} | "
            f"{verdict_page.fmt_json(s['endpoint'])} | {k}/{n} [{fmt(w.lo)}, {fmt(w.hi)}] | {s['rose_first']} | "
            f"{s['k3_warned']} | {_shape_cells(s)} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    return verdict_page.main(argv, "long_horizon_verdict.py", verdicts, markdown)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
