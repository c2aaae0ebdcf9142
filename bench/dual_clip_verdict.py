"""Does verl's dual-clip change the 4-bit bypass collapse? The verdicts of results/dual_clip.

    python bench/dual_clip_verdict.py results/dual_clip

Reads the grid as `timbench paper` does (timbench.studies.paper.paper_data, at the endpoint the grid declared) and
decides with the repo's rules (timbench.report.verdict_rules, docs/verdicts.md), per mismatched condition, the
claim "dual-clip (dualclip_3) helps against none":
  primary family (Holm over the conditions): a lower collapse rate; Fisher exact on the collapsed seeds k/n;
  secondary family (Holm over the conditions): a higher endpoint relative to the same seed's zero-mismatch run,
    paired t over seeds;
  EXPLORATORY, not verdicts: the collapse step paired by seed (dual-clip minus none, seeds where both collapse),
    the `auc` endpoint (the whole eval curve: a slower decay shows there when both arms end at 0), and the
    mechanism over the first EARLY steps (where the collapses happen): the share of tokens the bound caps
    (actor/pg_clipfrac_lower) and the largest PPO ratio pi_theta / mu (actor/ratio_max) each step.
Writes DIR/verdict.md and DIR/verdict.json (atomically); exits 2 with a one-line error on a directory that is not
such a grid.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import verdict_page  # noqa: E402
from timbench.report.leaderboard import fmt  # noqa: E402
from timbench.report.stats import mean_interval, wilson  # noqa: E402
from timbench.report.verdict_rules import CORRECTION, decide, paired_effect, rate_vs_control  # noqa: E402
from timbench.studies.paper import paper_data  # noqa: E402
from timbench.studies.paper_claims import acc, at_floor, collapses, diffs, over_seeds, paired, rel  # noqa: E402

ARM, CONTROL, MODE = "dualclip_3", "none", "bypass"
EARLY = 10
"""Steps 0..EARLY-1: the window the 4-bit bypass runs collapse in (steps 3-9 in results/paper)."""


def _early(cells, key: str, reduce) -> dict:
    """Over seeds, reduce(key over steps < EARLY) of each cell's metrics rows."""
    vals = [
        reduce([r[key] for r in c.metrics if r.get("step", EARLY) < EARLY and r.get(key) is not None]) for c in cells
    ]
    return verdict_page.iv_json(mean_interval([v for v in vals if v is not None]))


def _mean(xs):
    return sum(xs) / len(xs) if xs else None


def _step(r: dict) -> int | None:
    return int(r["collapse/step"]) if r.get("collapse/collapsed") and r.get("collapse/step") is not None else None


def verdicts(path: str) -> dict:
    d, _ = paper_data(path)
    auc, _ = paper_data(path, "auc")
    lr, learns, gains = d.learning()
    conds = [c for c in d.kinds if (c, ARM, MODE) in d.rows and (c, CONTROL, MODE) in d.rows]
    if not conds:
        raise ValueError(
            f"{path}: no condition has both {ARM} and {CONTROL} cells in {MODE} mode; "
            "valid: a result dir of bench/grids/dual_clip.yaml"
        )
    rates, effects, out = (
        [],
        [],
        {
            "endpoint": d.endpoint,
            "declared": d.declared,
            "correction": CORRECTION,
            "learning_range": lr,
            "baseline_learns": learns,
            "conditions": {},
        },
    )
    for c in conds:
        arm, ctl = d.setting(c, ARM, MODE), d.setting(c, CONTROL, MODE)
        k, n = collapses(ctl)
        k0, n0 = collapses(arm)
        rates.append(rate_vs_control(f"{c}: none collapses more than dual-clip", k, n, k0, n0))
        effects.append(paired_effect(f"{c}: dual-clip - none rel", diffs(arm, ctl), lr, at_floor(arm, ctl), learns))
        both = [(r["seed"], _step(r), _step(s)) for r in arm for s in ctl if s["seed"] == r["seed"]]
        delays = [a - b for _, a, b in both if a is not None and b is not None]
        auc_arm, auc_ctl = auc.setting(c, ARM, MODE), auc.setting(c, CONTROL, MODE)
        out["conditions"][c] = {
            "seeds": sorted(r["seed"] for r in arm),
            "collapsed": {"dualclip_3": [k0, n0], "none": [k, n]},
            "collapse_step": {str(s): {"dualclip_3": a, "none": b} for s, a, b in both},
            "endpoint_acc": {
                "dualclip_3": verdict_page.iv_json(over_seeds(arm, acc)),
                "none": verdict_page.iv_json(over_seeds(ctl, acc)),
            },
            "endpoint_rel": {
                "dualclip_3": verdict_page.iv_json(over_seeds(arm, rel)),
                "none": verdict_page.iv_json(over_seeds(ctl, rel)),
            },
            "exploratory": {
                "collapse_delay_steps": verdict_page.iv_json(mean_interval(delays)),
                "auc_acc": {
                    "dualclip_3": verdict_page.iv_json(over_seeds(auc_arm, acc)),
                    "none": verdict_page.iv_json(over_seeds(auc_ctl, acc)),
                    "difference": verdict_page.iv_json(paired(auc_arm, auc_ctl, acc)),
                },
                f"pg_clipfrac_lower_mean_steps_0_{EARLY - 1}": _early(
                    d.cells[(c, ARM, MODE)], "actor/pg_clipfrac_lower", _mean
                ),
                f"ratio_max_steps_0_{EARLY - 1}": {
                    a: _early(d.cells[(c, a, MODE)], "actor/ratio_max", lambda xs: max(xs, default=None))
                    for a in (ARM, CONTROL)
                },
            },
        }
    for family, tests in (("collapse rate (primary)", decide(rates)), ("endpoint (secondary)", decide(effects))):
        out.setdefault("families", {})[family] = [
            {"label": t.label, "word": t.word(), "text": t.text(), "p": t.p, "p_holm": t.p_adj, "not_tested": t.blocked}
            for t in tests
        ]
    out["baseline_gain"] = verdict_page.iv_json(gains)
    return out


def markdown(v: dict, path: str) -> str:
    lines = [
        f"# Dual-clip (verl clip_ratio_c = 3) vs none, 4-bit rollouts, bypass: {path}",
        "",
        f"endpoint: {v['endpoint']} (declared: {v['declared']}); correction: {v['correction']} within each "
        f"family; every interval is 95%; baseline own gain {verdict_page.fmt_json(v['baseline_gain'])}, learning range "
        f"{fmt(v['learning_range'])}",
        "",
    ]
    for family, tests in v["families"].items():
        lines += [f"## {family}", ""] + [f"- **{t['word']}**: {t['text']}" for t in tests] + [""]
    lines += [
        "## Per condition",
        "",
        "| condition | arm | collapsed [Wilson] | endpoint acc | endpoint rel | auc acc (EXPLORATORY) |",
        "|---|---|---|---|---|---|",
    ]
    for c, x in v["conditions"].items():
        for arm in ("none", "dualclip_3"):
            k, n = x["collapsed"][arm]
            w = wilson(k, n)
            lines.append(
                f"| {c} | {arm} | {k}/{n} [{fmt(w.lo)}, {fmt(w.hi)}] | "
                f"{verdict_page.fmt_json(x['endpoint_acc'][arm])} | {verdict_page.fmt_json(x['endpoint_rel'][arm])} | "
                f"{verdict_page.fmt_json(x['exploratory']['auc_acc'][arm])} |"
            )
    lines += [
        "",
        "## Collapse step by seed (EXPLORATORY; '-' = did not collapse)",
        "",
        "| condition | seed | none | dualclip_3 |",
        "|---|---|---|---|",
    ]
    for c, x in v["conditions"].items():
        for s, st in x["collapse_step"].items():
            lines.append(
                f"| {c} | {s} | {st['none'] if st['none'] is not None else '-'} | "
                f"{st['dualclip_3'] if st['dualclip_3'] is not None else '-'} |"
            )
        lines.append(
            f"| {c} | delay (dual-clip - none, both collapsed) | | "
            f"{verdict_page.fmt_json(x['exploratory']['collapse_delay_steps'])} |"
        )
        lines.append(
            f"| {c} | auc acc difference (dual-clip - none, paired) | | "
            f"{verdict_page.fmt_json(x['exploratory']['auc_acc']['difference'])} |"
        )
    lines += [
        "",
        f"## Mechanism, steps 0-{EARLY - 1} (EXPLORATORY; mean over seeds of each seed's value)",
        "",
        "| condition | tokens capped by dual-clip (mean share per step) | max PPO ratio pi/mu, none | "
        "max PPO ratio, dualclip_3 |",
        "|---|---|---|---|",
    ]
    for c, x in v["conditions"].items():
        e = x["exploratory"]
        rmax = e[f"ratio_max_steps_0_{EARLY - 1}"]
        lines.append(
            f"| {c} | {verdict_page.fmt_json(e[f'pg_clipfrac_lower_mean_steps_0_{EARLY - 1}'])} | "
            f"{verdict_page.fmt_json(rmax[CONTROL])} | "
            f"{verdict_page.fmt_json(rmax[ARM])} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    return verdict_page.main(argv, "dual_clip_verdict.py", verdicts, markdown)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
