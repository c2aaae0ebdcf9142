"""Seconds per RL step on the default task and the shipped tiny-dense warm start.

One round = one full `train_step` (32 prompts x 8 responses: rollout, recompute,
two mini-batch updates, weight sync) for exact/exact and torch/torch specs, the
default batch of `bench/runs/baseline.yaml`. Steps advance between rounds, so
each round samples a fresh batch, as in training.
"""

from __future__ import annotations

import itertools

import pytest

from timbench.model import load_checkpoint
from timbench.rl.algorithms import get_algorithm
from timbench.rl.config import load_config
from timbench.rl.loop import _lane, resolve_checkpoint
from timbench.tasks import get_task

from conftest import ROUNDS, thread_info

SPECS = {"exact": {"kernels": "exact", "dtype": "fp32"}, "torch": {"kernels": "torch", "dtype": "fp32"}}


@pytest.mark.parametrize("kernels", list(SPECS))
def test_rl_step_seconds(benchmark, kernels):
    cfg = load_config("bench/runs/baseline.yaml")
    base = load_checkpoint(resolve_checkpoint(cfg))
    n = cfg.prompts_per_step * cfg.group_size
    lane = _lane("main", base, cfg, SPECS[kernels], SPECS[kernels], n)
    task, algo = get_task(cfg.task), get_algorithm(cfg.algorithm)
    from timbench.rl.loop import train_step
    steps = itertools.count()
    timings = []

    def one():
        _, _, t = train_step(lane, cfg, task, algo, next(steps))
        timings.append(t)

    one()  # warm-up: numba compile / MKL init
    benchmark.pedantic(one, rounds=ROUNDS, iterations=1)
    split = {k: sum(t[k] for t in timings[1:]) / len(timings[1:]) for k in timings[0]}
    benchmark.extra_info.update(spec=f"{kernels}/{kernels} fp32", batch=f"{cfg.prompts_per_step}x{cfg.group_size}",
                                rounds=ROUNDS, **split, **thread_info())
