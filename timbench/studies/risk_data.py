"""What `timbench risk` rests on: one row per committed grid cell, with the mismatch it measured and what it cost.

Every grid result directory under results/ (a `cells.json` one or two levels down: results/paper,
results/tracks/quick, ...) is read with the report's own loaders (`results.load_results`, `summary.summarize`,
`endpoint.with_endpoint`), so the collapse rule is the grid's (`collapse.rule_from_dict`) and the accuracy is the
grid's endpoint (declared, else `endpoint.DEFAULT`) over the same seed's zero-mismatch cell. Per finished cell:

- `stats`: each statistic of STATS averaged over the first FIRST_STEPS steps, i.e. measured at (close to) the
  warm-start policy, before any committed run collapsed, as an align table or a gate's alignment probe measures
  a user's stack; a statistic the run did not log (the tim/* metrics are newer than some grids) is absent;
- outcomes: `collapsed` (the grid's rule over the whole run), `collapsed_within` (that collapse dated before step
  HORIZON, so grids of different lengths answer the same question), `loss` (1 - the endpoint relative
  to the same seed's zero-mismatch run), `endpoint_t1`, `steps` (the planned horizon).

Reference (zero-mismatch) cells are kept: they anchor the remedy comparisons, and the map leaves them out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from ..grid.endpoint import DEFAULT, with_endpoint
from ..metrics.schema import (
    K3_KL,
    MAX_ABS_DELTA,
    MEAN_ABS_DELTA,
    P99_ABS_DELTA,
    PROBS_DIFF_MAX,
    PROBS_DIFF_MEAN,
    TIM_TOP1_AGREEMENT,
    TIM_TV_MAX,
    TIM_TV_MEAN,
)
from ..report.results import load_results
from ..report.seeds import is_finished
from ..report.summary import summarize
from ..util.registry import Registry

ROOT = Path(__file__).resolve().parents[2] / "results"
"""The committed results (a checkout or an editable install); `--results DIR` reads another tree."""
FIRST_STEPS = 3
"""Steps 0-2: the earliest committed collapse is dated at step 3 (4-bit bypass), so no statistic here has seen one."""
HORIZON = 24
"""`collapsed_within`: a collapse (the grid's rule, on the whole run) dated before step HORIZON. Runs shorter than
HORIZON (tracks/quick, vllm_moe, tracks/mini) do not answer it; every committed 4-bit bypass collapse and the
staleness collapses fall inside it."""


@dataclass(frozen=True)
class Stat:
    """A mismatch statistic: where a grid logs it, and where an align table / a gate's alignment probe do."""

    metric: str
    """metrics.jsonl key (verl/timbench name)."""
    doc: str
    align: str | None = None
    """Key in a `timbench align` row (and the gate's alignment probe, which runs align), or None."""
    complement: bool = False
    """The statistic is 1 - the logged value (an agreement turned into a disagreement, so larger = worse)."""


STATS: Registry[Stat] = Registry("statistic")
STATS.update(
    {
        "mean_abs_delta": Stat(MEAN_ABS_DELTA, "mean |log pi_train - log pi_rollout| per token", "mean_abs_diff"),
        "p99_abs_delta": Stat(P99_ABS_DELTA, "99th percentile of |delta| per token", "p99_abs_diff"),
        "max_abs_delta": Stat(MAX_ABS_DELTA, "largest |delta| in the batch", "max_abs_diff"),
        "k3_kl": Stat(K3_KL, "K3 estimate of KL(rollout || train) per token (verl)", "k3_kl"),
        "k1_kl": Stat("rollout_corr/kl", "K1 estimate of KL per token (verl rollout_corr/kl)", "kl"),
        "frac_tokens_differ": Stat(
            "mismatch/frac_tokens_differ", "share of tokens whose logprobs differ at all", "frac_tokens_differ"
        ),
        "extreme_frac_2": Stat("mismatch/extreme_frac_2", "share of tokens with a ratio outside [1/2, 2]"),
        "chi2_token": Stat("rollout_corr/chi2_token", "chi^2 divergence of token ratios (verl)"),
        "chi2_seq": Stat("rollout_corr/chi2_seq", "chi^2 divergence of sequence ratios (verl)"),
        "log_ppl_abs_diff": Stat("rollout_corr/log_ppl_abs_diff", "|log perplexity difference| per sequence (verl)"),
        "probs_diff_max": Stat(PROBS_DIFF_MAX, "largest |p_train - p_rollout| (verl)", "probs_diff_max"),
        "probs_diff_mean": Stat(PROBS_DIFF_MEAN, "mean |p_train - p_rollout| (verl)"),
        "drift_abs": Stat("drift/diff_abs_mean", "|C(r_train) - C(r_rollout)|: the objective drift (arXiv 2605.14220)"),
        "argmax_flips": Stat(TIM_TOP1_AGREEMENT, "share of positions whose argmax token differs", complement=True),
        "top5_changes": Stat("tim/top5_consistency", "share of positions whose top-5 set differs", complement=True),
        "tv_mean": Stat(TIM_TV_MEAN, "mean total-variation distance of the next-token distributions"),
        "tv_max": Stat(TIM_TV_MAX, "largest total-variation distance in the batch"),
        "neg_adv_imbalance": Stat("tim/neg_adv_imbalance", "TRIAGE mass(A<0, delta<0) / mass(A<0, delta>0)"),
        "pos_adv_imbalance": Stat("tim/pos_adv_imbalance", "the same ratio for A>0 (TRIAGE's control)"),
        "tail_seg_concentration": Stat(
            "tim/tail_seg_concentration", "share of the |delta| tail in the worst 10% of 64-token segments (TRIAGE)"
        ),
    }
)
"""Statistic name (what `--stat NAME=VALUE` takes) -> Stat. mean_abs_delta is the field's default dose."""
DOSE = "mean_abs_delta"


@dataclass
class RiskRow:
    """One finished cell of a committed grid."""

    grid: str
    task: str
    model: str
    condition: str
    kind: str
    remedy: str
    mode: str
    seed: int
    steps: int | None
    """Planned horizon (the cell's config `steps`)."""
    stats: dict = field(default_factory=dict)
    collapsed: bool = False
    collapse_step: int | None = None
    collapsed_within: bool | None = None
    """Collapsed, with the collapse dated before step HORIZON; None when the run is planned shorter than HORIZON."""
    endpoint_t1: float | None = None
    loss: float | None = None
    """1 - endpoint / the same seed's zero-mismatch endpoint (accuracy lost, relative); None without a reference."""
    response_length: float | None = None

    @property
    def unit(self) -> tuple:
        """The map's unit: one (grid, task, model, condition, mode) setting, over its seeds."""
        return (self.grid, self.task, self.model, self.condition, self.mode)


def grid_dirs(root: str | Path = ROOT) -> list[Path]:
    """Grid result directories under `root` (cells.json one or two levels down), sorted by path."""
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"results directory {root} does not exist")
    found = {p.parent for pat in ("*/cells.json", "*/*/cells.json") for p in root.glob(pat)}
    return sorted(found)


def first_steps(metrics: list[dict], stat: Stat, n: int = FIRST_STEPS) -> float | None:
    """Mean of the statistic over the first `n` metrics rows that log it; None when none does."""
    xs = [float(r[stat.metric]) for r in metrics[:n] if isinstance(r.get(stat.metric), (int, float))]
    xs = [x for x in xs if math.isfinite(x)]
    if not xs:
        return None
    m = math.fsum(xs) / len(xs)
    return 1.0 - m if stat.complement else m


def _within(steps: int | None, collapsed: bool, step: int | None) -> bool | None:
    """Collapsed before step HORIZON (None for a run planned shorter than HORIZON: it cannot say no)."""
    if not steps or steps < HORIZON:
        return None
    return bool(collapsed and step is not None and step < HORIZON)


def grid_rows(path: str | Path, name: str | None = None) -> list[RiskRow]:
    """RiskRows of one grid's finished cells (see the module docstring); `name` labels them (default: the dir)."""
    grid = load_results(path)
    name = name or Path(path).name
    cells = {c.id: c for c in grid.cells}
    rows = with_endpoint(
        summarize(grid),
        {c.id: c.evals for c in grid.cells},
        {c.id: c.config.get("steps") for c in grid.cells},
        grid.endpoint or DEFAULT,
    )
    out = []
    for r in rows:
        if not is_finished(r):
            continue
        cell = cells[r["id"]]
        stats = {k: v for k, s in STATS.items() if (v := first_steps(cell.metrics, s)) is not None}
        rel = r.get("endpoint_rel")
        lens = [float(m["response_length/mean"]) for m in cell.metrics if m.get("response_length/mean") is not None]
        steps, collapsed, step = cell.config.get("steps"), bool(r["collapse/collapsed"]), r["collapse/step"]
        out.append(
            RiskRow(
                grid=name,
                task=str(r["task"]),
                model=str(r["model"]),
                condition=r["condition"],
                kind=str(r["kind"]),
                remedy=r["remedy"],
                mode=r["mode"],
                seed=int(r["seed"] or 0),
                steps=steps,
                stats=stats,
                collapsed=collapsed,
                collapse_step=step,
                collapsed_within=_within(steps, collapsed, step),
                endpoint_t1=r.get("endpoint_t1"),
                loss=None if rel is None else 1.0 - rel,
                response_length=math.fsum(lens) / len(lens) if lens else None,
            )
        )
    return out


def gather(root: str | Path = ROOT) -> list[RiskRow]:
    """RiskRows of every grid under `root`, grid by grid in path order."""
    root = Path(root)
    dirs = grid_dirs(root)
    if not dirs:
        raise FileNotFoundError(f"no grid result directory (cells.json) under {root}")
    return [row for d in dirs for row in grid_rows(d, d.relative_to(root).as_posix())]


def mapped(rows: list[RiskRow]) -> list[RiskRow]:
    """The rows the map and its validation use: mismatched cells (not the reference) without a remedy, that
    measured the dose."""
    return [r for r in rows if r.kind != "reference" and r.remedy == "none" and DOSE in r.stats]
