"""Cost model for `timbench grid plan`: seconds per cell from a few constants measured on this machine.

One RL step costs about c * prompts_per_step * group_size * L, where L is the
task's mean response length in tokens: rollout, recompute and update all scale
with the number of generated tokens. The constants come from the zero-mismatch
baseline (docs/findings/baseline.md: exact/exact fp32, GRPO 32x8 on
add-4d-v1 tiny-dense, one thread, fixed-order backward; measured 2026-12-03 on
the 2-core Intel Xeon): 2.0 s per step, of which rollout 0.38 s, recompute
0.38 s and update 1.25 s. Relative factors come from the benchmarks (docs/internals/benchmarks.md):
plain PyTorch kernels cost ~0.7x of the exact ones for the whole step, MoE
~1.5x, a larger dense preset its measured factor (MODEL_FACTOR). Each eval
samples eval_n problems twice (T=1 and greedy) with the exact engine, priced
like rollout. Cost is linear in the batch down to 16x8: the
committed quick grid (16x8, 24 steps, 512 eval problems) measured 32.7 s per
cell against 30.8 s of steps and evals from these constants; the ~2 s left is
the per-cell start-up.
An estimate, not a promise: other jobs on the cores slow runs down 10-40x.
"""

from __future__ import annotations

import functools
import heapq

from ..tasks import get_task
from ..tasks.registry import response_stats

BASELINE_STEP_S = 2.0
"""Seconds per baseline step (32x8 = 256 responses on add-4d-v1, one thread)."""
BASELINE_SEQS = 32 * 8
PHASE_S = {"rollout": 0.38, "recompute": 0.38, "update": 1.25}
"""The baseline step split by phase (rollout runs on the engine spec, the rest on the trainer's)."""
KERNEL_FACTOR = {"exact": 1.0, "torch": 0.7}
"""Cost of a phase relative to the exact kernels (torch ~0.7x for the whole RL step)."""
MOE_FACTOR = 1.5
"""tiny-moe (8 experts, top-2) relative to tiny-dense."""
MODEL_FACTOR = {"small-dense": 2.3, "medium-dense": 5.7}
"""Measured cost of a preset's RL step relative to tiny-dense, where it is neither 1 nor MOE_FACTOR.
small-dense (3.2x the parameters): 2.33x per step, each phase 2.2-2.4x (rollout 0.84 s vs 0.38 s,
recompute 0.69 vs 0.30, update 2.20 vs 0.92; two interleaved 4-step `timbench train` runs of each, GRPO 16x8,
exact fp32, one thread, other jobs on the 2-core Xeon, 2026-12-04): at these widths per-op overhead is a
large share of a step, so cost grows slower than the parameter count. The size ladder's grid confirms 2.4x and
measures medium-dense (10x tiny-dense's parameters) at 5.7x: medians over its first 40 cells, 160 steps each,
two cells side by side on an otherwise quiet 2-core AMD EPYC Zen 4, exact fp32, one thread (tiny / small / medium
0.64 / 1.54 / 3.64 s a step in the step's phases; rollout 4.8x, recompute 5.9x, update 6.3x; 2026-12-07). An
earlier ~3.0x for medium-dense came from unpaired runs on a loaded machine and underpriced it."""
CELL_OVERHEAD_S = 2.0
"""Per-cell start-up: a fresh process imports torch/numba and loads the warm start."""


@functools.cache
def mean_response_tokens(task: str) -> float:
    return response_stats(get_task(task))["mean_response_tokens"]


def model_factor(name: str) -> float:
    """Cost of preset `name`'s RL step relative to tiny-dense: measured (MODEL_FACTOR), MoE MOE_FACTOR, an
    unmeasured dense preset its parameter count over tiny-dense's (an upper bound: small-dense measured 2.3x
    at 3.2x), a checkpoint outside the presets 1."""
    from ..model import PRESETS  # deferred: torch is heavy

    preset = PRESETS.get(name)
    if name in MODEL_FACTOR or preset is None:
        return MODEL_FACTOR.get(name, 1.0)
    if preset.is_moe:
        return MOE_FACTOR
    return preset.num_parameters() / PRESETS["tiny-dense"].num_parameters()


def cell_seconds(config: dict) -> float:
    """Estimated single-thread wall seconds of one RL run with this RunConfig dict."""
    scale = mean_response_tokens(config["task"]) / mean_response_tokens("add-4d-v1")
    per_seq = {k: v / BASELINE_SEQS * scale for k, v in PHASE_S.items()}
    size = model_factor(config["preset"])
    eng = KERNEL_FACTOR.get(config["engine"].get("kernels"), 1.0)
    trn = KERNEL_FACTOR.get(config["trainer"].get("kernels"), 1.0)
    seqs = config["prompts_per_step"] * config["group_size"]
    step = (
        seqs
        * (per_seq["rollout"] * eng + per_seq["recompute"] * trn + per_seq["update"] * trn * config["epochs"])
        * size
    )
    if config.get("replica", "none") != "none":  # timbench.replica: one more trainer recompute of the batch
        step += seqs * per_seq["recompute"] * trn * size
    if config.get("twin"):  # a zero-mismatch twin lane runs every step in lockstep
        step += seqs * sum(per_seq.values()) * size
    steps = config["steps"]
    evals = 1 + steps // config["eval_every"] + (1 if steps % config["eval_every"] else 0)
    eval_s = evals * 2 * config["eval_n"] * per_seq["rollout"] * size * (2 if config.get("twin") else 1)
    return CELL_OVERHEAD_S + steps * step + eval_s


def fmt_seconds(s: float) -> str:
    """A duration for people: 45s, 3m07s, 1h02m."""
    s = int(round(s))
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{sec:02d}s" if m else f"{sec}s"


def wall_seconds(costs: list[float], workers: int) -> float:
    """Makespan of running cells in list order on `workers` processes (each takes the next free one)."""
    free = [0.0] * max(1, min(workers, len(costs) or 1))
    for c in costs:
        heapq.heappush(free, heapq.heappop(free) + c)
    return max(free)
