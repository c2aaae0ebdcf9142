"""Proxy fidelity across sizes (docs/findings/proxy-fidelity.md; `timbench proxy-fidelity DIR... --out OUT`): does each
verdict a grid reaches on its reference model survive the change to a smaller (or other) proxy model?

Reads grid result dirs whose cells vary the `model` axis (bench/grids/proxy_moe.yaml: tiny-moe with 8 experts and
its expert-pruned proxies tiny-moe-e4 and tiny-moe-e2). Each model is read from one dir, the one holding most of
its finished cells, so every comparison paired by seed stays inside one grid. Per model, three families of verdicts:

  1. collapse, per (condition, remedy): "collapses" when >= 2/3 of the finished seeds collapsed by the grid's own
     collapse rule (report.collapse, applied by report.summary), else "does not collapse";
  2. effect, per mismatched condition (remedy none): its endpoint accuracy T=1 (the grid's endpoint,
     grid.endpoint) minus the same model's baseline;
  3. remedy order, per condition: every pair of its remedies (R3 vs none, R2 vs none, R3 vs R2) on the endpoint
     accuracy and, where the runs log `mismatch/routing_agreement`, on routing disagreement (1 - its mean).

Per model, comparisons are paired by seed (report.paper_claims.paired: a 95% Student t interval over seeds): "A > B
detected" / "A < B detected" when the interval excludes 0, else "no difference detected"; fewer than MIN_SEEDS finished
(paired) seeds: "missing". Whether a verdict survives the change of size is then *tested*, not read off the labels (two
labels can agree by chance at few seeds): per proxy model, the interaction, i.e. the proxy's A - B minus the reference
model's per seed, by verdict_rules.size_interaction (equivalence within half the reference model's learning range by
TOST: `transfers`; a detected interaction: `differs by size`), and a collapse rate against the reference model's by
verdict_rules.rate_interaction (Fisher); Holm within each proxy's family; `not tested` when nothing happened at any
size. "Same direction" is the claim (arXiv 2608.10823), not equal numbers. The control: on a model whose routing cannot
disagree (every expert routed, num_experts <= top-k: tiny-moe-e2) a routing-replay remedy replays nothing, so each of
them vs none must be "no difference detected". Pure functions; `write_fidelity` writes fidelity.md and fidelity.json
atomically.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ..grid.endpoint import DEFAULT, ENDPOINTS, with_endpoint
from ..remedies.registry import REMEDIES  # imported on use: torch
from ..report.results import column, load_results
from ..report.seeds import SeedGroup, is_finished, seed_groups
from ..report.stats import Interval, mean
from ..report.summary import summarize
from ..report.verdict_rules import DIFFERS, INCONCLUSIVE, NOT_TESTED, TRANSFERS, Test
from ..report.verdict_rules import decide as holm_family
from ..util.atomic import atomic_write
from .fidelity_interaction import learning_range, size_test, test_json
from .paper_claims import collapses, over_seeds, paired

SETTING = ("task", "condition", "remedy", "mode", "algorithm")
"""What a setting of one model is: every grid axis but the model and the seed."""
MIN_SEEDS = 2
"""A verdict needs this many finished (paired) seeds; an interval needs two."""
ROUTING = "routing_disagreement"
"""Row key added per finished cell: 1 - the mean over steps of mismatch/routing_agreement (MoE runs only)."""
ACCURACY = "endpoint accuracy T=1"
METRICS = {ACCURACY: "endpoint_t1", "routing disagreement": ROUTING}
"""Metric label -> summary-row key the remedy-order verdicts compare."""
COLLAPSES, HOLDS, MISSING = "collapses", "does not collapse", "missing"
GT, LT, NO_DIFF = "A > B detected", "A < B detected", "no difference detected"
MISSING_CELLS = "missing cells"
"""The routing-replay control with no decided check."""
CONTROL = "control"
"""A routing-replay order on a model whose routing cannot disagree: expected to differ (nothing to replay), so it is
judged by the control check, not counted as a verdict that survives or not."""
WORDS = (TRANSFERS, DIFFERS, INCONCLUSIVE, NOT_TESTED, CONTROL)
FAMILIES = ("collapse", "effect", "order")


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
    endpoint: str | None = None
    """The endpoint the grid declared (None: the default)."""


def setting_of(row: dict) -> tuple:
    return tuple(str(row[k]) for k in SETTING)


def routing_cannot_disagree(model: str) -> bool:
    from ..model.config import PRESETS  # deferred: torch is heavy

    cfg = PRESETS.get(model)
    return cfg is not None and cfg.is_moe and cfg.num_experts <= cfg.num_experts_per_tok


def _model_runs(grid, model: str, rows: list[dict]) -> ModelRuns:
    cells = {c.id: c for c in grid.cells}
    rows = with_endpoint(
        rows,
        {c.id: c.evals for c in grid.cells},
        {c.id: c.config.get("steps") for c in grid.cells},
        grid.endpoint or DEFAULT,
    )
    planned, done = {}, {}
    for r in rows:
        s = setting_of(r)
        planned[s] = planned.get(s, 0) + 1
        if is_finished(r):
            agree = column(cells[r["id"]].metrics, "mismatch/routing_agreement")
            done.setdefault(s, []).append({**r, ROUTING: 1.0 - mean(agree) if agree else None})
    groups = {setting_of(g.rows[0]): g for g in seed_groups(rows)}
    return ModelRuns(
        model,
        str(grid.path),
        grid.reference_condition,
        planned,
        done,
        groups,
        routing_cannot_disagree(model),
        grid.endpoint,
    )


def load_models(dirs: list[str | Path], reference_model: str | None = None) -> list[ModelRuns]:
    """Every model of the grid dirs, the reference model first (default: the first grid's first model), each from
    the dir holding most of its finished cells (ties: the first given). One-line errors for a dir without a model
    axis and an unknown reference model."""
    from ..grid.same_run import distinct_dirs

    found: dict[str, list] = {}
    for i, d in enumerate(distinct_dirs(dirs, "grid result directory")):
        for m in models_of(d):
            found.setdefault(m.model, []).append((sum(map(len, m.rows.values())), -i, m))
    names = list(found)
    if len(names) < 2:
        raise ValueError(
            f"{', '.join(map(str, dirs))}: the cells vary no model axis (models: "
            f"{', '.join(names) or 'none'}); proxy fidelity compares >= 2 models, e.g. a grid of "
            "bench/grids/proxy_moe.yaml"
        )
    ref = reference_model or names[0]
    if ref not in found:
        raise ValueError(f"--reference-model {ref!r} is not a model of these grids; valid: {', '.join(names)}")
    best = {m: max(c, key=lambda x: x[:2])[2] for m, c in found.items()}
    return [best[ref]] + [best[m] for m in names if m != ref]


def models_of(d: str | Path) -> list[ModelRuns]:
    """Every model of one grid dir, in the order its cells first name them."""
    grid = load_results(d)
    rows = summarize(grid)
    return [
        _model_runs(grid, model, [r for r in rows if str(r["model"]) == model])
        for model in dict.fromkeys(str(r["model"]) for r in rows)
    ]


def _iv(iv: Interval) -> list | None:
    return None if iv.mean is None else [iv.mean, iv.lo, iv.hi]


def collapse_verdict(rows: list[dict]) -> dict:
    k, n = collapses(rows)
    word = MISSING if n < MIN_SEEDS else COLLAPSES if k * 3 >= 2 * n else HOLDS
    return {
        "word": word,
        "collapsed": k,
        "n": n,
        "seeds": [r["seed"] for r in rows],
        "final_accuracy": _iv(over_seeds(rows, lambda r: r.get("endpoint_t1"))),
    }


def compare(a: list[dict], b: list[dict], col: str) -> dict:
    """A - B on summary column `col`, paired by seed."""
    key = lambda r: r.get(col)  # noqa: E731
    diff = paired(a, b, key)
    both = {r["seed"] for r in b if key(r) is not None}
    seeds = [r["seed"] for r in a if r["seed"] in both and key(r) is not None]
    word = MISSING if diff.n < MIN_SEEDS else GT if diff.lo > 0 else LT if diff.hi < 0 else NO_DIFF
    return {
        "word": word,
        "diff": _iv(diff),
        "seeds": seeds,
        "a": _iv(over_seeds(a, key)),
        "b": _iv(over_seeds(b, key)),
        "collapsed": [list(collapses(a)), list(collapses(b))],
    }


def label(s: tuple, with_task: bool = False) -> str:
    """condition/remedy, then mode and algorithm where they are not the proxy grids' (recompute, grpo); prefixed
    with the task when the grids hold more than one."""
    task, cond, remedy, mode, algo = s
    return (f"{task}:" if with_task else "") + "/".join(
        [cond, remedy] + [x for x in (mode, algo) if x not in ("recompute", "grpo")]
    )


def _many_tasks(models: list[ModelRuns]) -> bool:
    return len({s[0] for m in models for s in m.planned}) > 1


def specs(models: list[ModelRuns]) -> list[dict]:
    """Every verdict to decide: (family, label, A, B, metric) over the union of the settings the models declare."""
    settings = list(dict.fromkeys(s for m in models for s in m.planned))
    ref_cond = models[0].reference
    logged = {
        lbl: col
        for lbl, col in METRICS.items()
        if any(r.get(col) is not None for m in models for rows in m.rows.values() for r in rows)
    }
    out = [{"family": "collapse", "a": s, "b": None, "metric": None} for s in settings]
    base = lambda s: (s[0], ref_cond, "none", s[3], s[4])  # noqa: E731
    out += [
        {"family": "effect", "a": s, "b": base(s), "metric": ACCURACY}
        for s in settings
        if s[1] != ref_cond and s[2] == "none" and base(s) in settings
    ]
    groups: dict[tuple, list[str]] = {}
    for s in settings:
        if s[1] != ref_cond:
            groups.setdefault((s[0], s[1], s[3], s[4]), []).append(s[2])
    for (task, cond, mode, algo), remedies in groups.items():
        treated = [r for r in remedies if r != "none"][::-1]  # the grid lists none, R2, R3: R3 vs none first
        pairs = [(r, "none") for r in treated if "none" in remedies]
        pairs += [(a, b) for i, a in enumerate(treated) for b in treated[i + 1 :]]
        out += [
            {"family": "order", "a": (task, cond, a, mode, algo), "b": (task, cond, b, mode, algo), "metric": lbl}
            for a, b in pairs
            for lbl in logged
        ]
    return out


def decide(spec: dict, m: ModelRuns) -> dict:
    a = m.rows.get(spec["a"], [])
    if spec["family"] == "collapse":
        return collapse_verdict(a)
    return compare(a, m.rows.get(spec["b"], []), METRICS[spec["metric"]])


def replay_remedies() -> set[str]:
    """Remedies that replay MoE routing (the registry's `replay` hook: R2, R3)."""
    return {n for n, cls in REMEDIES.items() if cls.replay is not None}


def interaction(spec: dict, ref: ModelRuns, m: ModelRuns, lr: float | None) -> Test:
    """The proxy `m` against the reference model on one verdict (timbench.studies.fidelity_interaction)."""
    rows = lambda x, k: x.rows.get(spec[k], []) if spec[k] else []  # noqa: E731
    return size_test(
        spec["family"],
        METRICS.get(spec["metric"]),
        spec["metric"] == ACCURACY,
        ref.model,
        m.model,
        (rows(ref, "a"), rows(ref, "b")),
        (rows(m, "a"), rows(m, "b")),
        lr,
    )


def verdicts(models: list[ModelRuns]) -> list[dict]:
    ref, replay, many = models[0], replay_remedies(), _many_tasks(models)
    lr = learning_range(ref.rows, ref.reference)
    out, tests = [], {}
    for sp in specs(models):
        res = {m.model: decide(sp, m) for m in models}
        judge = {}
        for m in models[1:]:
            if m.routing_fixed and sp["family"] == "order" and replay & {sp["a"][2], sp["b"][2]}:
                judge[m.model] = CONTROL
            else:
                judge[m.model] = interaction(sp, ref, m, lr)
                tests.setdefault((m.model, sp["family"]), []).append(judge[m.model])
        out.append(
            {
                "family": sp["family"],
                "a": label(sp["a"], many),
                "b": label(sp["b"], many) if sp["b"] else None,
                "remedies": [sp["a"][2], sp["b"][2] if sp["b"] else None],
                "metric": sp["metric"],
                "models": res,
                "fidelity": judge,
            }
        )
    for family in tests.values():  # Holm within each proxy model's family of verdicts
        holm_family(family)
    for v in out:
        v["tests"] = {m: test_json(t) for m, t in v["fidelity"].items() if isinstance(t, Test)}
        v["fidelity"] = {m: t.word() if isinstance(t, Test) else t for m, t in v["fidelity"].items()}
    return out


def survival(vs: list[dict], models: list[ModelRuns]) -> dict:
    """Per other model and family (and "all"): how many verdicts the rule words transfers / differs / ..."""
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
        checks = [
            {"a": v["a"], "b": v["b"], "metric": v["metric"], "result": v["models"][m.model]}
            for v in vs
            if v["family"] == "order" and v["remedies"][1] == "none" and v["remedies"][0] in replay
        ]
        words = [c["result"]["word"] for c in checks]
        dis = [r[ROUTING] for rows in m.rows.values() for r in rows if r.get(ROUTING) is not None]
        verdict = "fails" if GT in words or LT in words else "passes" if NO_DIFF in words else MISSING_CELLS
        out.append(
            {
                "model": m.model,
                "verdict": verdict,
                "checks": checks,
                "missing": words.count(MISSING),
                "max_routing_disagreement": max(dis) if dis else None,
            }
        )
    return out


def proxy_fidelity(dirs: list[str | Path], reference_model: str | None = None) -> dict:
    models = load_models(dirs, reference_model)
    vs = verdicts(models)
    ref = models[0]
    return {
        "grids": [str(d) for d in dirs],
        "reference_model": ref.model,
        "endpoint": ref.endpoint or DEFAULT,
        "endpoint_text": ENDPOINTS[ref.endpoint or DEFAULT],
        "endpoint_declared": ref.endpoint is not None,
        "learning_range": learning_range(ref.rows, ref.reference),
        "models": {
            m.model: {
                "grid": m.grid,
                "routing_cannot_disagree": m.routing_fixed,
                "seeds": sorted({r["seed"] for rows in m.rows.values() for r in rows}),
                "settings": _settings(m, _many_tasks(models)),
            }
            for m in models
        },
        "verdicts": vs,
        "survival": survival(vs, models),
        "control": control(vs, models),
    }


def _settings(m: ModelRuns, with_task: bool) -> list[dict]:
    """Per-setting statistics of one model: seeds finished of planned, collapses (report.seeds) and the endpoint
    accuracy the verdicts read (not the final eval: a table beside the verdicts must show their numbers)."""
    out = []
    for s, planned in m.planned.items():
        g, rows = m.groups.get(s), m.rows.get(s, [])
        out.append(
            {
                "setting": label(s, with_task),
                "planned": planned,
                "finished": len(rows),
                "seeds": [r["seed"] for r in rows],
                "collapsed": g.collapses if g else 0,
                "endpoint_accuracy": _iv(over_seeds(rows, lambda r: r.get("endpoint_t1"))) if rows else None,
                "routing_disagreement": _iv(over_seeds(rows, lambda r: r.get(ROUTING))),
            }
        )
    return out


def write_fidelity(
    dirs: list[str | Path], out: str | Path, command: str | None = None, reference_model: str | None = None
) -> dict[str, Path]:
    """Write fidelity.md and fidelity.json for the grid dirs into `out`; returns what was written."""
    from .fidelity_md import markdown  # cycle: timbench.studies.fidelity_md imports this module

    out = Path(out)
    command = command or "timbench proxy-fidelity " + " ".join(map(str, dirs)) + f" --out {out}"
    doc = proxy_fidelity(dirs, reference_model)
    written = {"fidelity.md": out / "fidelity.md", "fidelity.json": out / "fidelity.json"}
    atomic_write(written["fidelity.md"], markdown(doc, command))
    atomic_write(
        written["fidelity.json"],
        json.dumps({"command": command, **doc}, indent=1, sort_keys=True, allow_nan=False) + "\n",
    )
    return written
