"""The leaderboard of a grid (`timbench grid report results/NAME`): leaderboard.md/.html, summary.csv,
seeds.csv and figures/*.png.

Remedy score (the ranking): per seed, the mean over a remedy's finished cells under a mismatched
condition (kind != reference) of final accuracy relative to the same seed's zero-mismatch reference
cell, where a collapsed cell counts min(relative accuracy, SCORE_CAP = 0.5): a run that collapsed is
never worth more than half the reference, even if its last eval happened to land high. So does a cell
whose remedy rejected every token at every step (failed with `seeds.NOTHING_TRAINED` by `timbench track
run` / `timbench submit`): it kept the warm start by training on nothing. The score is
the mean of the per-seed scores with a 95% Student t interval over seeds; with one seed, the interval
propagates each cell's eval-set binomial error (SE = sqrt(p(1-p)/eval_n) / reference accuracy).
Ranks whose intervals overlap are listed as tied. A cell counts once it is done, or failed with a
collapse (a non-finite loss is the remedy's failure) or with nothing trained; cells still running, pending, failed for
other reasons, or whose reference has no accuracy yet are listed but not scored. A remedy with any cell that failed,
trained on nothing or has not finished ranks after every complete remedy, whatever its score: the quick track's
trm_avg, whose 3 nothing-trained cells kept the warm start, ranked first before this rule.

TIM tolerance of a remedy: the largest synthetic-noise sigma (engine spec `noise=KIND:SIGMA`) such
that none of the remedy's finished noise cells (any seed) at that sigma or any smaller one collapsed;
"< s" when it collapsed at the smallest sigma s tested, ">= s" when it never collapsed, "-" with no
noise cells.

Seed statistics of every (condition, remedy, mode) group: timbench.report.seeds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from ..grid.layout import PENDING
from ..metrics.schema import MEAN_K3_KL, MEAN_MEAN_ABS_DELTA
from ..tasks import UnknownTaskError, get_task
from ..util import manifest
from ..util.atomic import atomic_write
from . import stats
from .collapse import rule_from_dict
from .html import render_html
from .results import Grid, load_results
from .seeds import GROUP, SeedGroup, group_csv_row, group_key, is_finished, seed_groups, trained_nothing
from .stats import Interval
from .summary import csv_text, summarize, summary_csv
from .verdict_rules import rank_labels, tie_groups

SCORE_CAP = 0.5


@dataclass
class Table:
    title: str
    headers: list[str]
    rows: list[list[str]]
    note: str = ""


def fmt(x, digits: int = 3) -> str:
    if x is None:
        return "-"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, float):
        return "0" if x == 0 else f"{x:.{digits}g}"
    return str(x)


def is_scored(row: dict) -> bool:
    """Finished mismatched cell with a relative accuracy (see the module docstring)."""
    return row["kind"] != "reference" and is_finished(row) and row["relative_accuracy_t1"] is not None


def cell_score(row: dict) -> float | None:
    if not is_scored(row):
        return None
    rel = row["relative_accuracy_t1"]
    return min(rel, SCORE_CAP) if row["collapse/collapsed"] or trained_nothing(row) else rel


def tim_tolerance(rows: list[dict]) -> str:
    """Rendered TIM tolerance of one remedy's rows (module docstring)."""
    by_sigma: dict[float, list[bool]] = {}
    for r in rows:
        if r["kind"] == "noise" and r["noise_sigma"] is not None and (r["status"] == "done" or r["collapse/collapsed"]):
            by_sigma.setdefault(r["noise_sigma"], []).append(bool(r["collapse/collapsed"]))
    if not by_sigma:
        return "-"
    tol = None
    for sigma in sorted(by_sigma):
        if any(by_sigma[sigma]):
            return f"< {min(by_sigma):g}" if tol is None else f"{tol:g}"
        tol = sigma
    return f">= {tol:g}"


SETTING = ("task", "model", "algorithm", "condition", "mode")
"""What a remedy is applied to: two remedies are compared on the settings both of them ran."""


def _setting(row: dict) -> tuple:
    return tuple(str(row[k]) for k in SETTING)


def shared_settings(rows: list[dict]) -> set[tuple] | None:
    """Settings (SETTING values) every remedy with a scored mismatched cell was scored on; None if none shared.

    A remedy run on an easy condition must not outrank one run only on hard ones, so the
    ranking scores every remedy on the same settings when the grid has any in common.
    """
    per_remedy: dict[str, set[tuple]] = {}
    for r in rows:
        if r["kind"] != "reference" and is_scored(r):
            per_remedy.setdefault(r["remedy"], set()).add(_setting(r))
    common = set.intersection(*per_remedy.values()) if per_remedy else set()
    return common or None


def _ref_accuracy(row: dict, by_id: dict[str, dict]) -> float | None:
    ref = by_id.get(row["reference"])
    return ref["final_accuracy_t1"] if ref else None


def score_interval(scored: list[dict], by_id: dict[str, dict]) -> Interval:
    """Mean of per-seed scores with a t interval over seeds; one seed: the eval noise, propagated."""
    per_seed: dict = {}
    for r in scored:
        per_seed.setdefault(r["seed"], []).append(cell_score(r))
    seed_scores = [stats.mean(v) for _, v in sorted(per_seed.items(), key=lambda kv: str(kv[0]))]
    if len(seed_scores) != 1:
        return stats.mean_interval(seed_scores)
    m = seed_scores[0]
    ses = []
    for r in scored:
        ref, n = _ref_accuracy(r, by_id), r.get("eval_n")
        if not ref or not n:
            return stats.Interval(m, n=1)
        ses.append(stats.binomial_se(r["final_accuracy_t1"], n) / ref)
    hw = stats.z_quantile(0.5 + stats.LEVEL / 2) * math.sqrt(math.fsum(x * x for x in ses)) / len(ses)
    return stats.Interval(m, m - hw, m + hw, 1)


def remedy_ranking(rows: list[dict]) -> list[dict]:
    """One entry per remedy, best score first; a remedy with failed or unfinished cells (`incomplete` > 0: `failed`
    plus `unfinished`, the cells still running or pending) after every complete one, whatever its score (its capped
    or missing cells make the score incomparable), then unscored remedies, then by name.

    `rank` is the printed rank by verdict_rules.rank_labels: a tie ("2-4 (tied)") unless the entry's interval
    separates it from its neighbours' (within the complete, the failed and the unscored remedies apart);
    `tied_with` lists the ranks (1-based) of the other entries of its tie group.
    """
    out = []
    common = shared_settings(rows)
    by_id = {r["id"]: r for r in rows}
    for remedy in sorted({r["remedy"] for r in rows}):
        mine = [r for r in rows if r["remedy"] == remedy]
        mismatched = [r for r in mine if r["kind"] != "reference"]
        scored = [r for r in mismatched if is_scored(r) and (common is None or _setting(r) in common)]
        iv = score_interval(scored, by_id)
        out.append(
            {
                "remedy": remedy,
                "score": iv.mean,
                "interval": iv,
                "cells": len(scored),
                "seeds": len({r["seed"] for r in scored}),
                "collapses": sum(1 for r in scored if r["collapse/collapsed"]),
                # over the scored cells, so every column of a row describes the same cells
                "mean_abs_delta": stats.mean(
                    [r[MEAN_MEAN_ABS_DELTA] for r in scored if r[MEAN_MEAN_ABS_DELTA] is not None]
                ),
                "mean_k3_kl": stats.mean([r[MEAN_K3_KL] for r in scored if r[MEAN_K3_KL] is not None]),
                "tolerance": tim_tolerance(mine),
                # failed runs and remedies that trained on nothing, marked apart from their (capped) score; cells
                # not run yet (a campaign stopped part-way) are counted apart, as they are no failure
                "failed": sum(
                    1 for r in mine if trained_nothing(r) or (r["status"] == "failed" and not is_finished(r))
                ),
                "unfinished": sum(1 for r in mine if r["status"] in ("running", "pending")),
            }
        )
        out[-1]["incomplete"] = out[-1]["failed"] + out[-1]["unfinished"]
    out.sort(key=lambda e: (e["score"] is None, e["incomplete"] > 0, -(e["score"] or 0.0), e["remedy"]))
    start = 0
    for block in (
        [e for e in out if e["score"] is not None and not e["incomplete"]],
        [e for e in out if e["score"] is not None and e["incomplete"]],
        [e for e in out if e["score"] is None],
    ):
        ivs = [e["interval"] for e in block]
        for e, lab in zip(block, rank_labels(ivs, start)):
            e["rank"] = lab
        for g in tie_groups(ivs):
            for i in g:
                block[i]["tied_with"] = [start + j + 1 for j in g if j != i]
        start += len(block)
    return out


def _scored_on(rows: list[dict]) -> str:
    common = shared_settings(rows)
    if common is None:
        return "no (condition, mode) setting is shared by every remedy, so each is scored on all its cells"
    names = sorted({f"{s[SETTING.index('condition')]}/{s[SETTING.index('mode')]}" for s in common})
    return f"every remedy is scored on the {len(common)} settings all of them ran ({', '.join(names)})"


def _task_line(rows: list[dict]) -> str:
    parts = []
    for name in sorted({str(r["task"]) for r in rows}):
        try:
            parts.append(f"{name} (version {get_task(name).version})")
        except UnknownTaskError as e:
            raise ValueError(f"grid cell task: {e}") from None
    return "task: " + ", ".join(parts)


def fmt_interval(iv: Interval, digits: int = 3) -> str:
    """`mean [lo, hi]`, or the mean alone when there is no interval."""
    if iv.mean is None:
        return "-"
    if iv.lo is None:
        return fmt(iv.mean, digits)
    return f"{fmt(iv.mean, digits)} [{fmt(iv.lo, digits)}, {fmt(iv.hi, digits)}]"


def _incomplete(e: dict) -> str:
    """The ranking's `failed` column: failed cells, and apart from them the cells not run yet."""
    parts = ([f"failed {e['failed']}"] if e["failed"] else []) + (
        [f"{e['unfinished']} not run yet"] if e["unfinished"] else []
    )
    return ", ".join(parts) or "0"


def _ranking_table(rows: list[dict], stamp: str) -> Table:
    ranked = remedy_ranking(rows)
    body = [
        [
            e["rank"],
            ", ".join(map(str, e["tied_with"])) or "-",
            e["remedy"],
            fmt_interval(e["interval"]),
            str(e["seeds"]),
            f"{e['collapses']}/{e['cells']}",
            _incomplete(e),
            fmt(e["mean_abs_delta"]),
            fmt(e["mean_k3_kl"]),
            e["tolerance"],
        ]
        for i, e in enumerate(ranked)
    ]
    return Table(
        "Remedies ranked by score",
        [
            "rank",
            "tied with",
            "remedy",
            "score [95% CI]",
            "seeds",
            "collapses/cells",
            "failed",
            "mean |delta|",
            "mean k3_kl",
            "TIM tolerance (sigma)",
        ],
        body,
        f"{stamp}. Score: per seed, the mean over finished mismatched cells of final accuracy / the same seed's "
        f"reference, a collapsed cell (or one whose remedy trained on nothing) capped at {SCORE_CAP}; then the "
        f"mean over seeds with a 95% Student t interval (one seed: the eval-set binomial error, propagated). "
        f"A rank is a tie unless its interval separates it from the next one's (overlapping neighbours chain into "
        f"one tie group, printed e.g. 1-3 (tied); timbench/report/verdict_rules.py rank_labels). failed: the "
        f"remedy's cells that failed, trained on nothing or have not finished; such a remedy ranks after every "
        f"complete one, whatever its score. "
        f"{_scored_on(rows)[0].upper()}{_scored_on(rows)[1:]}.",
    )


def _seed_table(groups: list[SeedGroup], stamp: str) -> Table:
    varying = [k for k in ("task", "model", "algorithm") if len({g.key[k] for g in groups}) > 1]
    body = []
    for g in groups:
        rate = g.collapse_rate
        collapse = "-" if not g.seeds else f"{g.collapses}/{g.seeds} [{fmt(rate.lo, 2)}, {fmt(rate.hi, 2)}]"
        body.append(
            [g.key[k] for k in varying]
            + [
                g.key["condition"],
                fmt(g.kind),
                g.key["remedy"],
                g.key["mode"],
                f"{g.seeds}/{len(g.rows)}",
                fmt_interval(g.final_accuracy),
                fmt_interval(g.peak_accuracy),
                fmt_interval(g.relative_accuracy),
                collapse,
                fmt(g.median_collapse_step),
                fmt_interval(g.metrics.get("mean_abs_delta", Interval(None))),
                fmt_interval(g.metrics.get("k3_kl", Interval(None))),
                fmt_interval(g.metrics.get("cum_drift", Interval(None))),
            ]
        )
    return Table(
        "Conditions over seeds (mean [95% CI])",
        varying
        + [
            "condition",
            "kind",
            "remedy",
            "mode",
            "seeds done/cells",
            "final acc T=1",
            "peak acc T=1",
            "rel acc (paired by seed)",
            "collapse rate [Wilson]",
            "median collapse step (KM)",
            "mean |delta|",
            "k3_kl",
            "cum drift C(r)",
        ],
        body,
        f"{stamp}. Intervals: Student t over seeds (n - 1 df); with one seed, accuracy gets the eval-set Wilson "
        "interval and the other columns none. Relative accuracy divides each seed by the same seed's reference "
        "cell. Median collapse step: Kaplan-Meier over seeds (non-collapsed seeds censored at their last step), "
        "'-' while at least half the seeds survive; the curves are in figures/time_to_collapse.png.",
    )


def tables(grid: Grid, rows: list[dict], command: str, groups: list[SeedGroup] | None = None) -> list[Table]:
    stamp = f"{_task_line(rows)}; regenerate with `{command}`"
    groups = seed_groups(rows) if groups is None else groups
    varying = [k for k in ("task", "model", "algorithm", "seed") if len({r[k] for r in rows}) > 1]
    cell_rows = []
    for r in rows:
        c = r["collapse/collapsed"]
        collapse = "-" if c is None else (f"collapsed@{r['collapse/step']} ({r['collapse/reason']})" if c else "no")
        cell_rows.append(
            [fmt(r[k]) for k in varying]
            + [
                r["condition"],
                fmt(r["kind"]),
                r["remedy"],
                r["mode"],
                "failed: nothing trained" if trained_nothing(r) else r["status"],
                collapse,
                fmt(r["final_accuracy_t1"]),
                fmt(r["relative_accuracy_t1"]),
                fmt(r[MEAN_MEAN_ABS_DELTA]),
                fmt(r[MEAN_K3_KL]),
                fmt(r["cum/drift/diff_mean"]),
                fmt(r["collapse/kl_lead_steps"]),
            ]
        )
    cells = Table(
        "Every cell",
        varying
        + [
            "condition",
            "kind",
            "remedy",
            "mode",
            "status",
            "collapse",
            "final acc T=1",
            "rel acc",
            "mean |delta|",
            "k3_kl",
            "cum drift C(r)",
            "KL lead (steps)",
        ],
        cell_rows,
        f"{stamp}. cum drift = sum over steps of drift/diff_mean; KL lead = collapse step - first "
        "step with k3_kl above kl_warn (negative: the KL warned late).",
    )
    return [_ranking_table(rows, stamp), _seed_table(groups, stamp), cells]


def eval_noise_line(rows: list[dict]) -> str:
    """The eval noise in words: eval-set size(s) and the binomial SE of an accuracy measured on them."""
    ns = sorted({int(r["eval_n"]) for r in rows if r.get("eval_n")})
    if not ns:
        return "eval noise: unknown (the cells' configs do not say eval_n)"
    refs = [r["final_accuracy_t1"] for r in rows if r["kind"] == "reference" and r["final_accuracy_t1"] is not None]
    parts = []
    for n in ns:
        part = f"{n} problems: binomial SE sqrt(p(1-p)/{n}) <= {stats.binomial_se(0.5, n):.3f} (p = 0.5)"
        if refs:
            p = stats.mean(refs)
            part += f", {stats.binomial_se(p, n):.3f} at the reference's mean final accuracy {p:.3f}"
        parts.append(part)
    return "eval noise (one evaluation of one seed): " + "; ".join(parts)


def seeds_line(rows: list[dict]) -> str:
    per_group: dict[tuple, set] = {}
    for r in rows:
        per_group.setdefault(group_key(r), set()).add(r["seed"])
    counts = sorted({len(v) for v in per_group.values()})
    seeds = sorted({r["seed"] for r in rows}, key=str)
    return (
        f"seeds: {', '.join(map(str, seeds))} ({'/'.join(map(str, counts))} per condition x remedy x mode); "
        "every interval is 95%"
    )


def markdown(title: str, preamble: list[str], tabs: list[Table]) -> str:
    out = [f"# {title}", ""] + [line + "  " for line in preamble] + [""]
    for t in tabs:
        out += [
            f"## {t.title}",
            "",
            t.note,
            "",
            "| " + " | ".join(h.replace("|", "\\|") for h in t.headers) + " |",
            "|" + "|".join("---" for _ in t.headers) + "|",
        ]
        out += ["| " + " | ".join(v.replace("|", "\\|") for v in row) + " |" for row in t.rows] + [""]
    return "\n".join(out)


def figures(
    grid: Grid, rows: list[dict], groups: list[SeedGroup] | None = None, highlight: str | None = None
) -> list[tuple[str, str, object]]:
    """(file name, caption, figure builder) for every figure of the report; `highlight`: a submitted remedy."""
    groups = seed_groups(rows) if groups is None else groups
    # Imported here: matplotlib costs ~1 s, and build_parser imports this module for every command.
    from .figures.cells import (  # deferred: matplotlib is heavy
        delta_distribution_figure,
        delta_histogram_figure,
        dose_response_figure,
        has_histograms,
    )
    from .figures.curves import drift_figure, kl_grad_figure, reward_accuracy_figure  # deferred: matplotlib is heavy
    from .figures.forest import forest_figure  # deferred: matplotlib is heavy
    from .figures.heatmap import relative_accuracy_heatmap  # deferred: matplotlib is heavy

    cells = grid.cells
    out = [
        (
            "remedy_scores.png",
            "remedy scores with 95% intervals (forest plot; the submitted remedy highlighted, failed cells marked)",
            lambda: forest_figure(remedy_ranking(rows), highlight),
        ),
        (
            "reward_accuracy.png",
            "(a) training reward and eval accuracy per condition vs the zero-mismatch "
            "reference (mean, 95% band over seeds)",
            lambda: reward_accuracy_figure(cells),
        ),
        (
            "kl_grad_norm.png",
            "(b) rollout_corr/k3_kl (log, geometric band; exact zeros at the bottom) and "
            "actor/grad_norm (95% band over seeds)",
            lambda: kl_grad_figure(cells),
        ),
        (
            "relative_accuracy_heatmap.png",
            "(c) final accuracy / reference, condition x remedy, per mode",
            lambda: relative_accuracy_heatmap(rows),
        ),
        (
            "drift_by_adv_sign.png",
            "(d) C(r) drift split by advantage sign per condition (95% band over seeds)",
            lambda: drift_figure(cells),
        ),
        (
            "abs_delta_distribution.png",
            "(e) per-step mean / p99 / max |delta| per condition (log)",
            lambda: delta_distribution_figure(cells),
        ),
        (
            "dose_response.png",
            "(f) dose-response: relative accuracy vs realised mean |delta|",
            lambda: dose_response_figure(rows),
        ),
    ]
    from .figures.survival import survival_figure  # deferred: matplotlib is heavy

    out.append(
        (
            "time_to_collapse.png",
            "(g) time to collapse over seeds (Kaplan-Meier, censored at the last step)",
            lambda: survival_figure(groups),
        )
    )
    if has_histograms(cells):
        out.append(
            ("abs_delta_histogram.png", "(e') |delta| histograms over all steps", lambda: delta_histogram_figure(cells))
        )
    return out


def write_report(
    path: str | Path, command: str | None = None, highlight: str | None = None, out: str | Path | None = None
) -> dict[str, Path]:
    """Write the report files of the grid dir `path` into `out` (default: `path` itself); returns {name: path
    written}. `highlight` names a submitted remedy, drawn apart in the forest plot."""
    grid = load_results(path)
    dest = Path(out) if out is not None else grid.path
    # The report's manifest goes first and comes back last: a report killed half-way has none, so `grid verify`
    # names it instead of passing a mix of two generations.
    had_cells = "cells.json" in ((manifest.read(dest) if dest.resolve() == grid.path.resolve() else None) or {})
    (dest / manifest.MANIFEST).unlink(missing_ok=True)
    rows = summarize(grid)
    command = command or f"timbench grid report {path}"
    rule = rule_from_dict(grid.collapse)
    groups = seed_groups(rows)
    status = {s: sum(1 for r in rows if r["status"] == s) for s in ("done", "failed", "running", PENDING)}
    preamble = [
        _task_line(rows),
        f"regenerate: `{command}`",
        f"grid {grid.name}: {len(rows)} cells (" + ", ".join(f"{n} {s}" for s, n in status.items()) + ")",
        seeds_line(rows),
        eval_noise_line(rows),
        f"collapse rule (timbench.report.collapse): alpha={rule.alpha}, window={rule.window}, "
        f"smooth={rule.smooth}, grad_spike={rule.grad_spike}, min_peak={rule.min_peak}, kl_warn={rule.kl_warn}",
    ]
    tabs = tables(grid, rows, command, groups)
    written = {"summary.csv": dest / "summary.csv", "seeds.csv": dest / "seeds.csv"}
    atomic_write(written["summary.csv"], summary_csv(rows))
    seed_rows = [group_csv_row(g) for g in groups]
    atomic_write(written["seeds.csv"], csv_text(seed_rows, tuple(seed_rows[0]) if seed_rows else GROUP))
    from .figures.curves import png_bytes  # deferred: matplotlib is heavy

    pngs = []
    for name, caption, build in figures(grid, rows, groups, highlight):
        png = png_bytes(build())
        written[f"figures/{name}"] = dest / "figures" / name
        atomic_write(written[f"figures/{name}"], png)
        pngs.append((caption, png))
    title = f"TIM leaderboard: {grid.name}"
    written["leaderboard.md"] = dest / "leaderboard.md"
    atomic_write(written["leaderboard.md"], markdown(title, preamble, tabs))
    written["leaderboard.html"] = dest / "leaderboard.html"
    # Link the claims page when `timbench paper` has written one beside it (make paper runs it first).
    links = [("paper claims", "paper.html")] if (dest / "paper.html").is_file() else []
    atomic_write(written["leaderboard.html"], render_html(title, preamble, tabs, pngs, links))
    # The grid's own cells.json stays covered (grid.layout.prepare added it) when the report goes beside it.
    cells = ["cells.json"] if dest.resolve() == grid.path.resolve() and had_cells else []
    written["manifest.json"] = manifest.stamp(dest, [p.relative_to(dest).as_posix() for p in written.values()] + cells)
    return written
