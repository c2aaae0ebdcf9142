"""`timbench paper DIR`: the seed paper's figures F1-F5 and the dose-response, with a verdict per claim.

Reads a grid result directory (normally results/paper, made by bench/grids/paper.yaml) the same way
`timbench grid report` does, picks the settings each figure needs from what the grid holds, draws them
with seed bands (timbench.report.figures.paper) and decides each claim (timbench.studies.paper_claims).
Writes, atomically, into DIR: paper.md (verdicts with their numbers, figure list, cell status),
paper.json (the same, machine-readable) and figures/paper_*.png. Works on a half-run grid: unfinished
cells are left out and counted.

    timbench paper results/paper
"""

from __future__ import annotations

import json
import os
import re
from html import escape
from pathlib import Path

from ..grid.endpoint import DEFAULT, ENDPOINTS, label, with_endpoint
from ..metrics.schema import MEAN_MEAN_ABS_DELTA
from ..report.collapse import rule_from_dict
from ..report.figures import paper as pp
from ..report.figures import paper_bars as ppb
from ..report.html import figure_html, page, table_html
from ..report.leaderboard import Table, fmt, fmt_interval
from ..report.results import load_results
from ..report.seeds import is_finished
from ..report.summary import summarize
from ..report.verdict_rules import CORRECTION
from ..util.atomic import atomic_write
from .paper_claims import (
    KL_RISE,
    PaperData,
    Verdict,
    collapses,
    dose,
    dose_points,
    f1,
    f2,
    f3,
    f4,
    f5,
    mean_over_steps,
    over_seeds,
    rejection,
    rel,
    remedy_condition,
    seeds_used,
    sub_json,
)

CLAIMS = {
    "F1": (
        "paper_f1_collapse.png",
        "A zero-mismatch run keeps improving while a mismatched engine's run rises, "
        "then collapses (reward, eval accuracy, K3 KL, grad norm).",
    ),
    "F2": (
        "paper_f2_recompute_vs_bypass.png",
        "Recompute degrades and collapses with grad-norm spikes; bypass degrades silently, without a spike.",
    ),
    "F3": (
        "paper_f3_kl_warning.png",
        "K1/K3 stay nearly flat while the reward already falls: KL is a poor early warning.",
    ),
    "F4": (
        "paper_f4_objective_drift.png",
        "C(r) = -(r - 1) A with the trainer's vs the engine's old policy coincide "
        "under zero mismatch and separate under mismatch, skewed by the sign of A.",
    ),
    "F5": (
        "paper_f5_remedies.png",
        "Token TIS + sequence rejection is closest to zero mismatch; rejection on the "
        "correction ratio beats the PPO ratio; K1 ~ K3; a tighter PPO clip is not a fix.",
    ),
    "dose-response": (
        "paper_dose_response.png",
        "Damage grows with the realised mismatch |delta|; real conditions placed on the noise sweep's axis.",
    ),
}
"""Claim id -> (figure file, the paper's claim as the figure tests it)."""


def paper_data(path: str | Path, endpoint: str | None = None) -> tuple[PaperData, list[dict]]:
    """The grid's settings with every row's endpoint columns (timbench.grid.endpoint.with_endpoint) for
    `endpoint` (default: the one the grid declared, else the default)."""
    grid = load_results(path)
    by_id = {c.id: c for c in grid.cells}
    name = endpoint or grid.endpoint or DEFAULT
    rows = with_endpoint(
        summarize(grid), {c.id: c.evals for c in grid.cells}, {c.id: c.config.get("steps") for c in grid.cells}, name
    )
    cells, settings, kinds = {}, {}, {}
    for r in rows:
        kinds.setdefault(r["condition"], r["kind"])
        if is_finished(r):
            key = (r["condition"], r["remedy"], r["mode"])
            settings.setdefault(key, []).append(r)
            cells.setdefault(key, []).append(by_id[r["id"]])
    ref = (grid.reference_condition, "none", "recompute")
    d = PaperData(
        cells, settings, kinds, ref, rule_from_dict(grid.collapse).smooth, endpoint=name, declared=grid.endpoint
    )
    return d, rows


def _palette(names: list[str]) -> dict:
    from ..report.figures.paper import plt  # deferred: matplotlib is heavy

    cmap = plt.get_cmap("tab10")
    return {n: cmap(i % 10) for i, n in enumerate(names)}


def _figures(d: PaperData, variants: dict, verdict: dict[str, str] | None = None) -> dict:
    """Claim -> a function drawing its figure; `verdict`: claim -> the headline verdict paper.md prints for it,
    written under each figure's title (the same Verdict objects, so a figure never disagrees with its page)."""
    verdict = verdict or {}

    def title(claim: str, text: str) -> str:
        return f"{text}\nverdict: {verdict[claim]}" if claim in verdict else text

    colors = _palette([c for c in d.kinds if d.kinds[c] != "reference"])
    ref = pp.Setting(
        f"{d.reference[0]} (zero mismatch)", d.cells.get(d.reference, []), "black", summary=d.rows.get(d.reference, [])
    )

    def setting(cond, remedy="none", mode="recompute", label=None, color=None):
        key = (cond, remedy, mode)
        return pp.Setting(
            label or f"{cond} / {mode}",
            d.cells.get(key, []),
            color or colors.get(cond, "gray"),
            "-" if mode == "recompute" else "--",
            d.rows.get(key, []),
        )

    real = [c for c in d.real() if d.cells.get((c, "none", "recompute"))]
    both = [c for c in d.real() if d.cells.get((c, "none", "recompute")) and d.cells.get((c, "none", "bypass"))]
    mean_delta = {c: over_seeds(d.setting(c), lambda r: r.get(MEAN_MEAN_ABS_DELTA)).mean or 0 for c in both}
    strongest = sorted(both, key=lambda c: -mean_delta[c])[:2]

    # F3 shows the real conditions that lost accuracy (the claim is counted on them), most damaged first; noise
    # settings only fill the row when fewer than four real ones did (their KL level is the noise dial).
    def damaged(k, rows):
        iv = over_seeds(rows, rel)
        return (
            k[1] == "none"
            and k != d.reference
            and (any(r.get("collapse/collapsed") for r in rows) or (iv.hi is not None and iv.hi < 1))
        )

    hurt = sorted(
        ((k, rows) for k, rows in d.rows.items() if damaged(k, rows)),
        key=lambda kr: (d.kinds.get(kr[0][0]) == "noise", over_seeds(kr[1], rel).mean or 0, kr[0]),
    )
    collapsed = hurt[:4]
    drift_conds = [c for c in d.kinds if d.kinds[c] not in ("reference",) and d.rows.get((c, "none", "recompute"))]
    bars4 = [
        (
            c,
            d.kinds[c],
            *(
                over_seeds(d.setting(c), lambda r, c=c, k=k: mean_over_steps(d, c, r, k))
                for k in ("drift/diff_pos_adv_mean", "drift/diff_neg_adv_mean")
            ),
        )
        for c in drift_conds
    ]
    cond5 = remedy_condition(d)
    bars5, bands5 = [], [ref]
    if cond5:
        for mode in ("recompute", "bypass"):
            for lab in variants:
                rows = d.setting(cond5, lab, mode)
                if rows:
                    rj, (k, n) = rejection(rows), collapses(rows)
                    bars5.append(
                        (
                            f"{lab} ({mode})",
                            over_seeds(rows, rel),
                            f"{k}/{n} collapsed" + (f", rejects {rj:.0%} of seqs" if rj else ""),
                        )
                    )
                    if mode == "recompute" and len(bands5) < 7:
                        bands5.append(setting(cond5, lab, mode, f"{lab}", None))
        cmap = _palette([s.label for s in bands5[1:]])
        for s in bands5[1:]:
            s.color = cmap[s.label]
    sm = d.smooth
    return {
        # F1's verdict also reads the bypass cells (a silent collapse), so they are drawn too (dashed)
        "F1": lambda: pp.curves_figure(
            [ref]
            + [setting(c, mode=m) for c in d.real() for m in ("recompute", "bypass") if d.cells.get((c, "none", m))],
            title(
                "F1", "F1: zero mismatch vs mismatched rollout engines (remedy none; solid recompute, dashed bypass)"
            ),
            sm,
        ),
        "F2": lambda: pp.modes_figure(
            [ref] + [setting(c, mode=m) for c in strongest for m in ("recompute", "bypass")],
            title("F2", "F2: recompute (solid) vs bypass (dashed), remedy none"),
            sm,
        ),
        "F3": lambda: pp.kl_warning_figure(
            [setting(k[0], k[1], k[2]) for k, _ in collapsed],
            title("F3", "F3: reward vs KL (relative to its first 5 steps) where a real condition lost accuracy"),
            sm,
            KL_RISE,
        ),
        "F4": lambda: ppb.drift_figure(
            [ref] + [setting(c) for c in real],
            bars4,
            title("F4", "F4: effective-objective drift C(r_train) - C(r_rollout) by the sign of A (recompute mode)"),
            sm,
        ),
        "F5": lambda: ppb.remedy_figure(bands5, bars5, title("F5", _f5_title(cond5, bars5))),
        "dose-response": lambda: pp.dose_figure(
            dose_points(d),
            title("dose-response", "Dose-response: relative final accuracy vs realised mean |delta|, remedy none"),
        ),
    }


def _f5_title(cond: str | None, bars: list[tuple]) -> str:
    """F5's title, naming the modes its bars hold (the remedy ablation ran recompute; the clip and none also
    bypass) and the mode of its curves (recompute)."""
    modes = [m for m in ("recompute", "bypass") if any(b[0].endswith(f"({m})") for b in bars)]
    return (
        f"F5: remedies on {cond}: final accuracy in {' and '.join(modes) or 'no'} mode"
        f"{'s' if len(modes) > 1 else ''} (bars), eval accuracy in recompute mode (curves)"
    )


def remedy_variants(d: PaperData) -> dict[str, dict]:
    """Remedy label -> {remedy, remedy_args, eps_low, eps_high} as the cells ran it (from their configs)."""
    out = {}
    for (_cond, remedy_label, _mode), cells in d.cells.items():
        cfg = cells[0].config
        out.setdefault(
            remedy_label,
            {
                "remedy": cfg.get("remedy", remedy_label),
                "remedy_args": cfg.get("remedy_args") or {},
                "eps_low": cfg.get("eps_low"),
                "eps_high": cfg.get("eps_high"),
            },
        )
    return dict(sorted(out.items(), key=lambda kv: (kv[0] != "none", kv[0])))


def verdicts(d: PaperData) -> list[Verdict]:
    return [f1(d), f2(d), f3(d), f4(d), f5(d, remedy_variants(d)), dose(d)]


DOCS = "docs/verdicts.md"
"""How to read a verdict (endpoint, family, correction, margin, power): linked from every claims page."""


def preamble(d: PaperData) -> list[str]:
    """The lines every paper page states before its verdicts: endpoint, learning range, family and correction."""
    lr, learns, g = d.learning()
    return [
        f"Primary {label(d.endpoint, d.declared)}.",
        f"Learning range: the zero-mismatch run's own gain {fmt_interval(g)} absolute, {fmt(lr)} of its endpoint "
        f"(relative scale){'' if learns else ': it does NOT learn here, so every comparison is not tested'}; "
        f"the equivalence margin of a no-difference claim is half of it ({fmt(lr / 2 if lr else None)}).",
        f"Each claim (F1-F5, dose-response) is one family: its tests' p-values are adjusted by {CORRECTION}'s "
        "method (the adjusted p is printed as Holm); paired t tests over seeds, TOST for equivalence, Fisher's "
        "exact test for a rate against its control, the exact binomial test for a share; every rate has its "
        f"Wilson interval. How to read a verdict: [{DOCS}](../../{DOCS}). Implementation checks (true by "
        "construction when the code is right) are listed as checks, outside the claim counts.",
    ]


def reendpoint(d: PaperData, name: str) -> PaperData:
    """The same grid read at another endpoint (the rows' endpoint columns recomputed from the cells' evals)."""
    cells = {c.id: c for cs in d.cells.values() for c in cs}
    flat = [r for rows in d.rows.values() for r in rows]
    new = {
        r["id"]: r
        for r in with_endpoint(
            flat, {i: c.evals for i, c in cells.items()}, {i: c.config.get("steps") for i, c in cells.items()}, name
        )
    }
    rows = {k: [new[r["id"]] for r in rs] for k, rs in d.rows.items()}
    return PaperData(d.cells, rows, d.kinds, d.reference, d.smooth, endpoint=name, declared=d.declared)


def sensitivity(d: PaperData) -> list[list[str]]:
    """One row per sub-claim: its word at each endpoint (ENDPOINTS order), and whether any differs from the
    word at the page's endpoint."""
    words = {
        name: [(v.claim, s.text, s.verdict) for v in verdicts(reendpoint(d, name)) for s in v.subs]
        for name in ENDPOINTS
    }
    rows = []
    shorts = [text.split(" (")[0] for _, text, _ in words[d.endpoint]]
    for i, (claim, text, _) in enumerate(words[d.endpoint]):
        ws = [words[n][i][2] for n in ENDPOINTS]
        short = (
            shorts[i]
            if shorts.count(shorts[i]) == 1
            else f"{shorts[i]} ({text.split(' (', 1)[-1].split(':')[0].rstrip(')')})"
        )  # e.g. the clip's two modes
        rows.append([claim, short, *ws, "flips" if len(set(ws)) > 1 else ""])
    return rows


def _markdown(
    vs: list[Verdict], rows: list[dict], command: str, path: Path, seeds: str, d: PaperData, sens: list[list[str]]
) -> str:
    status = {}
    for r in rows:
        status[r["status"]] = status.get(r["status"], 0) + 1
    lines = [
        f"# Paper claims (arXiv 2605.14220) at CPU scale: {path.name}",
        "",
        f"regenerate: `{command}`",
        "",
        "cells: " + ", ".join(f"{n} {s}" for s, n in sorted(status.items())) + f" of {len(rows)}",
        "",
        f"seeds used (finished, per setting; every sub-claim below reads these): {seeds}",
        "",
        "Verdicts are decided by the rules in `timbench/studies/paper_claims.py` and "
        "`timbench/report/verdict_rules.py` from the committed cells; intervals are 95% Student t over seeds "
        "(paired by seed where two settings are compared), Wilson for rates.",
        "",
    ]
    for line in preamble(d):
        lines += [line, ""]
    for v in vs:
        fig, text = CLAIMS[v.claim]
        lines += [
            f"## {v.claim}: {v.verdict} ({d.endpoint}, {seeds_of(d)})",
            "",
            f"Paper: {text}",
            "",
            f"![{v.claim}](figures/{fig})",
            "",
        ]
        for s in sorted(v.subs, key=lambda s: s.check):  # claims first, implementation checks after
            parts = [p for p in re.split(r" \| |; ", s.numbers) if p]
            tag = "implementation check, " if s.check else "" if s.central else "not central, "
            lines += [f"- **{tag}{s.verdict}**: {s.text}." + (f" {parts[0]}" if len(parts) == 1 else "")]
            lines += [f"  - {p}" for p in parts] if len(parts) > 1 else []
        lines += [""]
    lines += [
        "## Sensitivity to the endpoint",
        "",
        "Each sub-claim's word at every endpoint ("
        + "; ".join(f"{n}: {t}" for n, t in ENDPOINTS.items())
        + f"). The page's verdicts read `{d.endpoint}`; a word that changes with the endpoint is marked.",
        "",
        "| claim | sub-claim | " + " | ".join(ENDPOINTS) + " | |",
        "|" + "---|" * (len(ENDPOINTS) + 3),
    ]
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in r) + " |" for r in sens]
    return "\n".join(lines) + "\n"


def seeds_of(d: PaperData) -> str:
    ns = sorted({len(rows) for rows in d.rows.values()})
    return f"{ns[0]} seeds" if len(ns) == 1 else f"{ns[0]}-{ns[-1]} seeds"


def leaderboard_href(path: Path, out: Path) -> str | None:
    """The grid's leaderboard page as seen from `out`: beside paper.html when it is there, or will be (`out` is
    the grid dir, where `timbench grid report` writes it; make paper runs it after this), else the grid dir's
    own, by a relative path; None when there is none (`timbench paper results/paper` writes build/paper, where
    no leaderboard.html is unless `timbench grid report results/paper` also ran)."""
    if (out / "leaderboard.html").is_file() or out.resolve() == path.resolve():
        return "leaderboard.html"
    if (path / "leaderboard.html").is_file():
        return Path(os.path.relpath(path.resolve() / "leaderboard.html", out.resolve())).as_posix()
    return None


def _html(
    vs: list[Verdict],
    rows: list[dict],
    command: str,
    path: Path,
    pngs: dict[str, bytes],
    seeds: str,
    d: PaperData,
    sens: list[list[str]],
    leaderboard: str | None = None,
) -> str:
    """paper.html: per claim its verdict, the paper's statement, the figure and a small table of sub-claims."""
    body = []
    for v in vs:
        fig, text = CLAIMS[v.claim]
        body += [
            f"<h2>{escape(v.claim)}: {escape(v.verdict)} ({escape(d.endpoint)}, {seeds_of(d)})</h2>",
            f"<p>Paper: {escape(text)}</p>",
        ]
        if v.claim in pngs:
            body.append(figure_html(f"{v.claim} (figures/{fig})", pngs[v.claim]))
        body.append(
            table_html(
                Table(
                    f"{v.claim}: sub-claims",
                    ["verdict", "sub-claim", "numbers"],
                    [
                        [("implementation check: " if s.check else "") + s.verdict, s.text, s.numbers]
                        for s in sorted(v.subs, key=lambda s: s.check)
                    ],
                    "",
                )
            )
        )
    body.append(table_html(Table("Sensitivity to the endpoint", ["claim", "sub-claim", *ENDPOINTS, ""], sens, "")))
    status = {}
    for r in rows:
        status[r["status"]] = status.get(r["status"], 0) + 1
    pre = [
        f"regenerate: `{command}`",
        "cells: " + ", ".join(f"{n} {s}" for s, n in sorted(status.items())) + f" of {len(rows)}",
        f"seeds used (finished, per setting; every sub-claim below reads these): {seeds}",
        "Verdicts are decided by the rules in timbench/studies/paper_claims.py and "
        "timbench/report/verdict_rules.py from the committed cells; intervals are 95% Student t over seeds "
        "(paired by seed where two settings are compared), Wilson for rates.",
    ] + preamble(d)
    return page(
        f"Paper claims (arXiv 2605.14220) at CPU scale: {path.name}",
        pre,
        body,
        links=[("the grid's leaderboard", leaderboard)] if leaderboard else [],
    )


PAPER_STEPS = 80
"""The paper grid's step budget (bench/grids/paper.yaml; rise_collapse.yaml runs 160, paper_vllm.yaml 80): its
claims (a run rises, then collapses; the KL warns >= KL_LEAD steps after a 5-step window) are decided on runs
this long, so a shorter grid (results/quick, 24 steps) would get verdicts the design cannot support."""


def check_paper_cells(d: PaperData, path) -> None:
    """Refuse (one-line ValueError) a grid without the paper grid's settings: runs of >= PAPER_STEPS steps, and
    the cells F1 reads: the zero-mismatch reference and a real (not noise) mismatched condition finished with
    remedy none, in either mode. The full paper grid (bench/grids/paper.yaml) has every claim's cells; a
    narrower grid, e.g. bench/grids/rise_collapse.yaml (recompute only, 160 steps), answers what its cells can
    and says "not tested" for the rest."""
    steps = sorted({c.config.get("steps") for cells in d.cells.values() for c in cells}, key=lambda s: s or 0)
    if steps and (steps[0] or 0) < PAPER_STEPS:
        raise ValueError(
            f"{path} is not a paper grid: its runs are {'/'.join(map(str, steps))} steps, the "
            f"paper's claims are decided on runs of >= {PAPER_STEPS} steps (bench/grids/paper.yaml, "
            "paper_vllm.yaml: 80, rise_collapse.yaml: 160; see docs/tasks/reproduce-paper.md)"
        )
    real = [c for c in d.real() if d.setting(c, "none", "recompute") or d.setting(c, "none", "bypass")]
    if d.setting(*d.reference) and real:
        return
    have = ", ".join(f"{c}/{m}" for (c, r, m) in sorted(d.rows) if r == "none") or "no finished cells"
    raise ValueError(
        f"{path} is not a paper grid: F1 needs the reference {d.reference[0]!r} and a real "
        f"(not noise) mismatched condition with remedy none; it has {have} "
        "(run bench/grids/paper.yaml, see docs/tasks/reproduce-paper.md)"
    )


def write_paper(
    path: str | Path, command: str | None = None, out: str | Path | None = None, endpoint: str | None = None
) -> dict[str, Path]:
    """Write paper.md, paper.html, paper.json and figures/paper_*.png for the grid dir `path` into `out` (default
    `path`); returns what was written. A grid without the paper's cells is refused (`check_paper_cells`)."""
    from ..report.figures.curves import png_bytes  # deferred: matplotlib is heavy

    path = Path(path)
    out = Path(out) if out is not None else path
    d, rows = paper_data(path, endpoint)
    check_paper_cells(d, path)
    command = command or f"timbench paper {path}"
    vs, seeds, sens = verdicts(d), seeds_used(d), sensitivity(d)
    written, pngs = {}, {}
    for claim, build in _figures(d, remedy_variants(d), {v.claim: v.verdict for v in vs}).items():
        p = out / "figures" / CLAIMS[claim][0]
        pngs[claim] = png_bytes(build())
        atomic_write(p, pngs[claim])
        written[claim] = p
    written["paper.md"] = out / "paper.md"
    atomic_write(written["paper.md"], _markdown(vs, rows, command, path, seeds, d, sens))
    written["paper.html"] = out / "paper.html"
    atomic_write(
        written["paper.html"], _html(vs, rows, command, path, pngs, seeds, d, sens, leaderboard_href(path, out))
    )
    doc = {
        "command": command,
        "seeds": seeds,
        "endpoint": d.endpoint,
        "declared_endpoint": d.declared,
        "exploratory": d.endpoint != (d.declared or DEFAULT),
        "correction": CORRECTION,
        "learning_range": d.learning()[0],
        "claims": [
            {
                "claim": v.claim,
                "verdict": v.verdict,
                "figure": CLAIMS[v.claim][0],
                "subclaims": [sub_json(s) for s in v.subs],
            }
            for v in vs
        ],
        "sensitivity": [dict(zip(["claim", "subclaim", *ENDPOINTS, "flips"], r)) for r in sens],
    }
    written["paper.json"] = out / "paper.json"
    atomic_write(written["paper.json"], json.dumps(doc, indent=1, sort_keys=True, allow_nan=False) + "\n")
    return written
