"""Proxy fidelity across sizes (issue 30 item 4; `timbench proxy-fidelity DIR... --out OUT`): does each verdict a
grid reaches on its reference model survive the change to a smaller (or other) proxy model?

Reads grid result dirs whose cells vary the `model` axis (bench/grids/proxy_moe.yaml: tiny-moe with 8 experts and
its expert-pruned proxies tiny-moe-e4 and tiny-moe-e2). Each model is read from one dir, the one holding most of
its finished cells, so every comparison paired by seed stays inside one grid. Per model, three families of verdicts:

  1. collapse, per (condition, remedy): "collapses" when >= 2/3 of the finished seeds collapsed by the grid's own
     collapse rule (report.collapse, applied by report.summary), else "does not collapse";
  2. effect, per mismatched condition (remedy none): its final eval accuracy T=1 minus the same model's baseline;
  3. remedy order, per condition: every pair of its remedies (R3 vs none, R2 vs none, R3 vs R2) on final accuracy
     and, where the runs log `mismatch/routing_agreement`, on routing disagreement (1 - its mean over steps).

Comparisons are paired by seed (the same seed shares the warm start, prompts and sampler keys;
report.paper_claims.paired: a 95% Student t interval over seeds): "A > B detected" / "A < B detected" when the
interval excludes 0, else "no difference detected". Fewer than MIN_SEEDS finished (paired) seeds: "missing".
Then per verdict, the other model against the reference model: "same", "different", "reference undecided" (the
reference detects no difference, so there is no direction to carry over) or "missing cells". "Same direction" is
the claim (arXiv 2608.10823), not equal numbers. The control: on a model whose routing cannot disagree (every
expert routed, num_experts <= top-k: tiny-moe-e2) a routing-replay remedy replays nothing, so each of them vs none
must be "no difference detected". Pure functions; `write_fidelity` writes fidelity.md and fidelity.json atomically.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ..atomic import atomic_write
from .paper_claims import collapses, over_seeds, paired
from .results import load_results
from .seeds import SeedGroup, is_finished, seed_groups
from .stats import Interval, mean
from .results import column
from .summary import summarize

SETTING = ("task", "condition", "remedy", "mode", "algorithm")
"""What a setting of one model is: every grid axis but the model and the seed."""
MIN_SEEDS = 2
"""A verdict needs this many finished (paired) seeds; an interval needs two."""
ROUTING = "routing_disagreement"
"""Row key added per finished cell: 1 - the mean over steps of mismatch/routing_agreement (MoE runs only)."""
METRICS = {"final accuracy T=1": "final_accuracy_t1", "routing disagreement": ROUTING}
"""Metric label -> summary-row key the remedy-order verdicts compare."""
COLLAPSES, HOLDS, MISSING = "collapses", "does not collapse", "missing"
GT, LT, NO_DIFF = "A > B detected", "A < B detected", "no difference detected"
SAME, DIFFERENT, UNDECIDED, MISSING_CELLS = "same", "different", "reference undecided", "missing cells"
CONTROL = "control"
"""A routing-replay order on a model whose routing cannot disagree: expected to differ (nothing to replay), so it is
judged by the control check, not counted as a verdict that survives or not."""
WORDS = (SAME, DIFFERENT, UNDECIDED, MISSING_CELLS, CONTROL)
FAMILIES = ("collapse", "effect", "order")
LEGEND = (f"Legend: `{SAME}` the proxy's verdict equals the reference model's; `{DIFFERENT}` it does not (opposite "
          f"direction, or a detected effect vs `{NO_DIFF}`, or the other side of the collapse line); `{UNDECIDED}` "
          f"the reference model detects no difference, so no direction to carry over; `{MISSING_CELLS}` one side has "
          f"fewer than {MIN_SEEDS} finished (paired) seeds; `{CONTROL}` a routing-replay order on a model whose "
          "routing cannot disagree (judged by the control below, not counted).")


@dataclass
class ModelRuns:
    """One model's finished cells in one grid dir, by setting."""

    model: str
    grid: str
    """The dir it was read from."""
    reference: str
    """The grid's zero-mismatch condition."""
    planned: dict[tuple, int]
    """Setting -> seeds declared in cells.json (finished or not)."""
    rows: dict[tuple, list[dict]]
    """Setting -> finished summary rows (report.summary) in seed order, each with ROUTING."""
    groups: dict[tuple, SeedGroup]
    """Setting -> seed statistics (report.seeds)."""
    routing_fixed: bool
    """Every token routes to every expert (num_experts <= top-k): routing cannot disagree."""


def setting_of(row: dict) -> tuple:
    return tuple(str(row[k]) for k in SETTING)


def routing_cannot_disagree(model: str) -> bool:
    from ..model.config import PRESETS  # imported on use: torch
    cfg = PRESETS.get(model)
    return cfg is not None and cfg.is_moe and cfg.num_experts <= cfg.num_experts_per_tok


def _model_runs(grid, model: str, rows: list[dict]) -> ModelRuns:
    cells = {c.id: c for c in grid.cells}
    planned, done = {}, {}
    for r in rows:
        s = setting_of(r)
        planned[s] = planned.get(s, 0) + 1
        if is_finished(r):
            agree = column(cells[r["id"]].metrics, "mismatch/routing_agreement")
            done.setdefault(s, []).append({**r, ROUTING: 1.0 - mean(agree) if agree else None})
    groups = {setting_of(g.rows[0]): g for g in seed_groups(rows)}
    return ModelRuns(model, str(grid.path), grid.reference_condition, planned, done, groups,
                     routing_cannot_disagree(model))


def load_models(dirs: list[str | Path], reference_model: str | None = None) -> list[ModelRuns]:
    """Every model of the grid dirs, the reference model first (default: the first grid's first model), each from
    the dir holding most of its finished cells (ties: the first given). One-line errors for a dir without a model
    axis and an unknown reference model."""
    found: dict[str, list] = {}
    for i, d in enumerate(dirs):
        grid = load_results(d)
        rows = summarize(grid)
        for model in dict.fromkeys(str(r["model"]) for r in rows):
            mine = [r for r in rows if str(r["model"]) == model]
            found.setdefault(model, []).append((sum(map(is_finished, mine)), -i, _model_runs(grid, model, mine)))
    names = list(found)
    if len(names) < 2:
        raise ValueError(f"{', '.join(map(str, dirs))}: the cells vary no model axis (models: "
                         f"{', '.join(names) or 'none'}); proxy fidelity compares >= 2 models, e.g. a grid of "
                         "bench/grids/proxy_moe.yaml")
    ref = reference_model or names[0]
    if ref not in found:
        raise ValueError(f"--reference-model {ref!r} is not a model of these grids; valid: {', '.join(names)}")
    best = {m: max(c, key=lambda x: x[:2])[2] for m, c in found.items()}
    return [best[ref]] + [best[m] for m in names if m != ref]


def _iv(iv: Interval) -> list | None:
    return None if iv.mean is None else [iv.mean, iv.lo, iv.hi]


def collapse_verdict(rows: list[dict]) -> dict:
    k, n = collapses(rows)
    word = MISSING if n < MIN_SEEDS else COLLAPSES if k * 3 >= 2 * n else HOLDS
    return {"word": word, "collapsed": k, "n": n, "seeds": [r["seed"] for r in rows],
            "final_accuracy": _iv(over_seeds(rows, lambda r: r.get("final_accuracy_t1")))}


def compare(a: list[dict], b: list[dict], col: str) -> dict:
    """A - B on summary column `col`, paired by seed."""
    key = lambda r: r.get(col)  # noqa: E731
    diff = paired(a, b, key)
    both = {r["seed"] for r in b if key(r) is not None}
    seeds = [r["seed"] for r in a if r["seed"] in both and key(r) is not None]
    word = MISSING if diff.n < MIN_SEEDS else GT if diff.lo > 0 else LT if diff.hi < 0 else NO_DIFF
    return {"word": word, "diff": _iv(diff), "seeds": seeds, "a": _iv(over_seeds(a, key)),
            "b": _iv(over_seeds(b, key)), "collapsed": [list(collapses(a)), list(collapses(b))]}


def fidelity(ref: str, other: str) -> str:
    if MISSING in (ref, other):
        return MISSING_CELLS
    if ref == NO_DIFF:
        return UNDECIDED
    return SAME if other == ref else DIFFERENT


def label(s: tuple, with_task: bool = False) -> str:
    """condition/remedy, then mode and algorithm where they are not the proxy grids' (recompute, grpo); prefixed
    with the task when the grids hold more than one."""
    task, cond, remedy, mode, algo = s
    return (f"{task}:" if with_task else "") + "/".join(
        [cond, remedy] + [x for x in (mode, algo) if x not in ("recompute", "grpo")])


def _many_tasks(models: list[ModelRuns]) -> bool:
    return len({s[0] for m in models for s in m.planned}) > 1


def specs(models: list[ModelRuns]) -> list[dict]:
    """Every verdict to decide: (family, label, A, B, metric) over the union of the settings the models declare."""
    settings = list(dict.fromkeys(s for m in models for s in m.planned))
    ref_cond = models[0].reference
    logged = {lbl: col for lbl, col in METRICS.items()
              if any(r.get(col) is not None for m in models for rows in m.rows.values() for r in rows)}
    out = [{"family": "collapse", "a": s, "b": None, "metric": None} for s in settings]
    base = lambda s: (s[0], ref_cond, "none", s[3], s[4])  # noqa: E731
    out += [{"family": "effect", "a": s, "b": base(s), "metric": "final accuracy T=1"} for s in settings
            if s[1] != ref_cond and s[2] == "none" and base(s) in settings]
    groups: dict[tuple, list[str]] = {}
    for s in settings:
        if s[1] != ref_cond:
            groups.setdefault((s[0], s[1], s[3], s[4]), []).append(s[2])
    for (task, cond, mode, algo), remedies in groups.items():
        treated = [r for r in remedies if r != "none"][::-1]  # the grid lists none, R2, R3: R3 vs none first
        pairs = [(r, "none") for r in treated if "none" in remedies]
        pairs += [(a, b) for i, a in enumerate(treated) for b in treated[i + 1:]]
        out += [{"family": "order", "a": (task, cond, a, mode, algo), "b": (task, cond, b, mode, algo),
                 "metric": lbl} for a, b in pairs for lbl in logged]
    return out


def decide(spec: dict, m: ModelRuns) -> dict:
    a = m.rows.get(spec["a"], [])
    if spec["family"] == "collapse":
        return collapse_verdict(a)
    return compare(a, m.rows.get(spec["b"], []), METRICS[spec["metric"]])


def replay_remedies() -> set[str]:
    """Remedies that replay MoE routing (the registry's `replay` hook: R2, R3)."""
    from ..remedies.registry import REMEDIES  # imported on use: torch
    return {n for n, cls in REMEDIES.items() if cls.replay is not None}


def verdicts(models: list[ModelRuns]) -> list[dict]:
    ref, replay, many = models[0], replay_remedies(), _many_tasks(models)
    out = []
    for sp in specs(models):
        res = {m.model: decide(sp, m) for m in models}
        judge = {m.model: CONTROL if m.routing_fixed and sp["family"] == "order" and replay & {sp["a"][2], sp["b"][2]}
                 else fidelity(res[ref.model]["word"], res[m.model]["word"]) for m in models[1:]}
        out.append({"family": sp["family"], "a": label(sp["a"], many),
                    "b": label(sp["b"], many) if sp["b"] else None,
                    "remedies": [sp["a"][2], sp["b"][2] if sp["b"] else None], "metric": sp["metric"], "models": res,
                    "fidelity": judge})
    return out


def survival(vs: list[dict], models: list[ModelRuns]) -> dict:
    """Per other model and family (and "all"): how many verdicts are same / different / undecided / missing."""
    out = {}
    for m in models[1:]:
        out[m.model] = {}
        for fam in (*FAMILIES, "all"):
            words = [v["fidelity"][m.model] for v in vs if fam in ("all", v["family"])]
            out[m.model][fam] = {w: words.count(w) for w in WORDS}
    return out


def control(vs: list[dict], models: list[ModelRuns]) -> list[dict]:
    """The routing-replay control on every model whose routing cannot disagree: each routing remedy vs none must be
    "no difference detected": passes when every decided check is, fails on any detected difference, "missing cells"
    when no check is decided (the checks left missing are counted)."""
    replay, out = replay_remedies(), []
    for m in models:
        if not m.routing_fixed:
            continue
        checks = [{"a": v["a"], "b": v["b"], "metric": v["metric"], "result": v["models"][m.model]} for v in vs
                  if v["family"] == "order" and v["remedies"][1] == "none" and v["remedies"][0] in replay]
        words = [c["result"]["word"] for c in checks]
        dis = [r[ROUTING] for rows in m.rows.values() for r in rows if r.get(ROUTING) is not None]
        verdict = "fails" if GT in words or LT in words else "passes" if NO_DIFF in words else MISSING_CELLS
        out.append({"model": m.model, "verdict": verdict, "checks": checks, "missing": words.count(MISSING),
                    "max_routing_disagreement": max(dis) if dis else None})
    return out


def proxy_fidelity(dirs: list[str | Path], reference_model: str | None = None) -> dict:
    models = load_models(dirs, reference_model)
    vs = verdicts(models)
    return {"grids": [str(d) for d in dirs], "reference_model": models[0].model,
            "models": {m.model: {"grid": m.grid, "routing_cannot_disagree": m.routing_fixed,
                                 "seeds": sorted({r["seed"] for rows in m.rows.values() for r in rows}),
                                 "settings": _settings(m, _many_tasks(models))} for m in models},
            "verdicts": vs, "survival": survival(vs, models), "control": control(vs, models)}


def _settings(m: ModelRuns, with_task: bool) -> list[dict]:
    """Per-setting statistics of one model (report.seeds): seeds finished of planned, final accuracy, collapses."""
    out = []
    for s, planned in m.planned.items():
        g, rows = m.groups.get(s), m.rows.get(s, [])
        out.append({"setting": label(s, with_task), "planned": planned, "finished": len(rows),
                    "seeds": [r["seed"] for r in rows], "collapsed": g.collapses if g else 0,
                    "final_accuracy": _iv(g.final_accuracy) if g else None,
                    "routing_disagreement": _iv(over_seeds(rows, lambda r: r.get(ROUTING)))})
    return out


def write_fidelity(dirs: list[str | Path], out: str | Path, command: str | None = None,
                   reference_model: str | None = None) -> dict[str, Path]:
    """Write fidelity.md and fidelity.json for the grid dirs into `out`; returns what was written."""
    from .fidelity_md import markdown
    out = Path(out)
    command = command or "timbench proxy-fidelity " + " ".join(map(str, dirs)) + f" --out {out}"
    doc = proxy_fidelity(dirs, reference_model)
    written = {"fidelity.md": out / "fidelity.md", "fidelity.json": out / "fidelity.json"}
    atomic_write(written["fidelity.md"], markdown(doc, command))
    atomic_write(written["fidelity.json"],
                 json.dumps({"command": command, **doc}, indent=1, sort_keys=True, allow_nan=False) + "\n")
    return written
