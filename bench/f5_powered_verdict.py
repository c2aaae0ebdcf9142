"""The powered F5 remedy ablation's pre-registered verdicts (bench/grids/f5_powered.yaml).

    python bench/f5_powered_verdict.py results/f5_powered

Declared before the grid ran (bench/grids/f5_powered.yaml; shared/reference/science-review.md, Exp 3):
  endpoint: the grid's (`last-half`, the mean eval accuracy T=1 over steps 40-80), absolute, paired by seed;
  one family, Holm over its tests (timbench.report.verdict_rules.decide):
    1. token TIS helps:                         tis_token - none > 0
    2. the tightened PPO clip helps:             ppo_clip_0.05 - none > 0
    3. sequence rejection adds to token TIS:     tis+rs_k3 - tis_token > 0
    4. rejection on rho beats it on the PPO ratio: tis+rs_k3 - tis+rs_k3_ppo > 0
    5. K1 and K3 work about equally:             tis+rs_k1 - tis+rs_k3 within +-MARGIN (TOST)
  collapse rates per remedy against none (Fisher exact, Holm over the remedies) are reported as a second family.
Every test is paired over the seeds both settings finished, so the page can be read while the grid runs; it says
how many seeds each comparison rests on and which were planned. Writes DIR/verdict.md and DIR/verdict.json
atomically; a directory that is not such a grid is a one-line error, exit 2.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import verdict_page  # noqa: E402
from timbench.report.leaderboard import fmt  # noqa: E402
from timbench.report.stats import wilson  # noqa: E402
from timbench.report.verdict_rules import CORRECTION, decide, paired_effect, paired_no_difference, rate_vs_control  # noqa: E402
from timbench.studies.paper import paper_data  # noqa: E402
from timbench.studies.paper_claims import acc, at_floor, collapses, diffs, over_seeds  # noqa: E402
from timbench.studies.paper_evidence import rejection  # noqa: E402
from timbench.studies.paper_f4_f5 import _ppo_rejection  # noqa: E402

CONDITION = "nvfp4-rollout"
MARGIN = 0.075
"""The K1/K3 equivalence margin, absolute endpoint accuracy: half the baseline's gain (science-review Exp 3)."""
PLANNED = {"none": 24, "tis_token": 24, "tis+rs_k3": 36, "tis+rs_k1": 36, "tis+rs_k3_ppo": 24, "ppo_clip_0.05": 24}
"""Seeds the grid spec plans per remedy (the baseline: 24)."""
FAMILY = [  # (label, arm, control, kind): the pre-registered comparisons, in the order above
    ("token TIS helps", "tis_token", "none", "effect"),
    ("the tightened PPO clip (eps 0.05) helps", "ppo_clip_0.05", "none", "effect"),
    ("sequence rejection (K3 <= 0.01) adds to token TIS", "tis+rs_k3", "tis_token", "effect"),
    ("rejection on rho beats rejection on the PPO ratio", "tis+rs_k3", "tis+rs_k3_ppo", "effect"),
    (
        f"K1 (<= 0.03) and K3 (<= 0.01) work about equally (equivalence within +-{MARGIN})",
        "tis+rs_k1",
        "tis+rs_k3",
        "equivalence",
    ),
]


def verdicts(path: str) -> dict:
    d, _ = paper_data(path)
    rec = {lab: d.setting(CONDITION, lab) for lab in PLANNED}
    if not rec["none"] or not any(rec[lab] for lab in PLANNED if lab != "none"):
        raise ValueError(
            f"{path}: no finished {CONDITION} recompute cells of none and a remedy; valid: a result "
            "dir of bench/grids/f5_powered.yaml"
        )
    lr, learns, gains = d.learning()
    tests = []
    for _label, arm, ctl, kind in FAMILY:
        ds = diffs(rec[arm], rec[ctl], acc)
        floor = at_floor(rec[arm], rec[ctl])
        name = f"{arm} - {ctl}"
        tests.append(
            paired_effect(name, ds, None, floor, learns)
            if kind == "effect"
            else paired_no_difference(name, ds, MARGIN, None, floor, learns)
        )
    decide(tests)
    rates = []
    for lab in PLANNED:
        if lab != "none" and rec[lab]:
            k0, n0 = collapses(rec["none"])
            k, n = collapses(rec[lab])
            rates.append(rate_vs_control(f"none collapses more than {lab}", k0, n0, k, n))
    decide(rates)
    ref = d.setting(*d.reference)
    return {
        "path": path,
        "condition": CONDITION,
        "endpoint": d.endpoint,
        "declared": d.declared,
        "correction": CORRECTION,
        "margin": MARGIN,
        "baseline_gain": verdict_page.iv_json(gains),
        "baseline_learns": learns,
        "baseline_endpoint": verdict_page.iv_json(over_seeds(ref, acc)),
        "baseline_seeds": len(ref),
        "settings": {
            lab: {
                "seeds": len(rows),
                "planned": PLANNED[lab],
                "endpoint": verdict_page.iv_json(over_seeds(rows, acc)),
                "collapsed": list(collapses(rows)),
                "rejected_seqs": _ppo_rejection(d, CONDITION, lab) if lab.endswith("_ppo") else rejection(rows),
            }
            for lab, rows in rec.items()
        },
        "family": [
            {
                "claim": label,
                "test": t.label,
                "word": t.word(),
                "text": t.text(),
                "p": t.p,
                "p_holm": t.p_adj,
                "n": t.interval.n,
                "not_tested": t.blocked,
            }
            for (label, *_), t in zip(FAMILY, tests)
        ],
        "collapse_rates": [
            {"test": t.label, "word": t.word(), "text": t.text(), "p_holm": t.p_adj, "not_tested": t.blocked}
            for t in rates
        ],
    }


def markdown(v: dict, path: str) -> str:
    done = sum(s["seeds"] for s in v["settings"].values()) + v["baseline_seeds"]
    planned = sum(v["settings"][lab]["planned"] for lab in v["settings"]) + 24
    lines = [
        f"# F5, powered: the remedy ablation on {v['condition']}, recompute, tiny-dense ({v['path']})",
        "",
        "Regenerate: `python bench/f5_powered_verdict.py " + v["path"] + "` (grid: bench/grids/f5_powered.yaml; "
        "the design, the endpoint and the family were declared in the spec before it ran).",
        "",
        f"Cells finished: {done} of {planned} planned"
        + (
            " (the grid is still running: every number below rests on the seeds finished so far)."
            if done < planned
            else "."
        ),
        "",
        f"Endpoint: {v['endpoint']} (declared: {v['declared']}), absolute accuracy T=1, paired by seed; "
        f"{v['correction']} over the family; every interval is 95%. Zero-mismatch baseline: endpoint "
        f"{verdict_page.fmt_json(v['baseline_endpoint'])}, "
        f"own gain {verdict_page.fmt_json(v['baseline_gain'])} ({v['baseline_seeds']} seeds). "
        "How to read a verdict: [docs/verdicts.md](../../docs/verdicts.md).",
        "",
        "## The pre-registered family",
        "",
        "| claim | verdict | numbers |",
        "|---|---|---|",
    ]
    lines += [f"| {t['claim']} | **{t['word']}** | {t['text']} |" for t in v["family"]]
    lines += [
        "",
        "## Per setting",
        "",
        "| remedy | seeds (planned) | endpoint accuracy | collapsed [Wilson] | sequences rejected |",
        "|---|---|---|---|---|",
    ]
    for lab, s in v["settings"].items():
        k, n = s["collapsed"]
        w = wilson(k, n)
        rej = fmt(s["rejected_seqs"]) if s["rejected_seqs"] is not None else "-"
        lines.append(
            f"| {lab} | {s['seeds']} ({s['planned']}) | {verdict_page.fmt_json(s['endpoint'])} | {k}/{n} "
            f"[{fmt(w.lo)}, {fmt(w.hi)}] | {rej} |"
        )
    lines += ["", "## Collapse rates against none (Fisher exact, Holm over the remedies)", ""]
    lines += [f"- **{t['word']}**: {t['text']}" for t in v["collapse_rates"]]
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    return verdict_page.main(argv, "f5_powered_verdict.py", verdicts, markdown)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
