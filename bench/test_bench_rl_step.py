"""Seconds per RL step of the baseline config, `exact` kernels next to plain `torch` kernels.

One round is one full RL step of `bench/runs/baseline.yaml` on the shipped
tiny-dense warm start (32 prompts x 8 responses: rollout, trainer recompute,
remedy, two mini-batch updates, weight sync), as `timbench train` runs it minus
eval and file IO. The `torch` case is the same config with
`engine.kernels=torch` and `trainer.kernels=torch`, so the two cases differ in
the kernel set only and `bench/summarize.py` reports exact/torch (the
target: <= 1.15). Steps advance between rounds, so each round samples a fresh
batch, as in training; both cases see the same prompts.

Under --benchmark-disable (CI smoke) each case runs one step and checks it:
finite loss and grad norm, a full batch, and bitwise-zero mismatch for exact.
"""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import pytest
import torch
from conftest import ROUNDS, thread_info

from timbench.rl.config import load_config

BASELINE = Path(__file__).resolve().parent / "runs" / "baseline.yaml"
KERNELS = {"exact": [], "torch": ["engine.kernels=torch", "trainer.kernels=torch"]}


def rl_stepper(cfg):
    """`step(i) -> (metrics, timings)`: RL step `i` of run config `cfg`, set up as `timbench train` sets it up.

    The one place this benchmark reaches into the loop's internals (it mirrors the setup in
    `timbench.rl.loop.run`: warm start, main lane, then `train_step`). When the loop's step
    API changes, adapt this function only.
    """
    from timbench.model import load_checkpoint
    from timbench.rl.step import make_lane, train_step
    from timbench.util.shipped import resolve_checkpoint

    base = load_checkpoint(resolve_checkpoint(cfg.model, cfg.task, cfg.preset))
    lane = make_lane(
        "main", base, cfg, cfg.main_engine, cfg.main_trainer, cfg.prompts_per_step * cfg.group_size, cfg.remedy_impl
    )

    def step(i: int):
        metrics, batch = train_step(lane, cfg, i)
        return metrics, batch.timing

    return step


@pytest.fixture
def deterministic():
    # `timbench train` runs with deterministic algorithms on; restore the flag so later suites are unaffected.
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    yield
    torch.use_deterministic_algorithms(before)


PRESETS = ("tiny-dense", "tiny-moe")  # the baseline's model, and the MoE one (its shipped checkpoint)


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("kernels", list(KERNELS))
def test_rl_step_seconds(benchmark, smoke, deterministic, kernels, preset):
    cfg = load_config(BASELINE, KERNELS[kernels] + [f"preset={preset}"])
    assert cfg.engine.kernels == cfg.trainer.kernels == kernels
    step = rl_stepper(cfg)
    steps = itertools.count()
    results = []

    def one():
        results.append(step(next(steps)))

    if not smoke:
        one()  # warm-up: numba compile / MKL init, outside the timing
    benchmark.pedantic(one, rounds=ROUNDS, iterations=1)
    timed = results[-1:] if smoke else results[1:]

    for metrics, timings in timed:  # sanity of every timed step, so a smoke round checks the step it ran
        assert math.isfinite(metrics["actor/loss"]) and math.isfinite(metrics["actor/grad_norm"])
        assert 0.0 <= metrics["critic/rewards/mean"] <= 1.0
        assert metrics["response_length/mean"] > 0
        assert set(timings) >= {"time/rollout", "time/update"} and all(t > 0 for t in timings.values())
        if kernels == "exact":
            assert metrics["training/rollout_probs_diff_max"] == 0.0  # exact engine and trainer agree bitwise
    split = {k: sum(t[k] for _, t in timed) / len(timed) for k in timed[0][1]}
    tokens = round(
        sum(m["response_length/mean"] for m, _ in timed) / len(timed) * cfg.prompts_per_step * cfg.group_size
    )
    benchmark.extra_info.update(
        bench="rl_step",
        model=cfg.preset,
        kernels=kernels,
        dtype=cfg.engine.dtype,
        batch=f"{cfg.prompts_per_step}x{cfg.group_size}",
        config=BASELINE.name,
        tokens=tokens,
        rounds=ROUNDS,
        **split,
        **thread_info(),
    )
