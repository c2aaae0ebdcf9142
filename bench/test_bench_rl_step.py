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
from timbench.rl.config import load_config
from timbench.rl.loop import make_lane, train_step
from timbench.shipped import resolve_checkpoint
from timbench.spec import parse_spec

from conftest import ROUNDS, thread_info

SPECS = {"exact": parse_spec("kernels=exact,dtype=fp32"), "torch": parse_spec("kernels=torch,dtype=fp32")}


@pytest.mark.parametrize("kernels", list(SPECS))
def test_rl_step_seconds(benchmark, kernels):
    cfg = load_config("bench/runs/baseline.yaml")
    base = load_checkpoint(resolve_checkpoint(cfg.model, cfg.task, cfg.preset))
    n = cfg.prompts_per_step * cfg.group_size
    lane = make_lane("main", base, cfg, SPECS[kernels], SPECS[kernels], n, cfg.remedy_impl)
    steps = itertools.count()
    timings = []

    def one():
        _, batch = train_step(lane, cfg, next(steps))
        timings.append(batch.timing)

    one()  # warm-up: numba compile / MKL init
    benchmark.pedantic(one, rounds=ROUNDS, iterations=1)
    split = {k: sum(t[k] for t in timings[1:]) / len(timings[1:]) for k in timings[0]}
    benchmark.extra_info.update(spec=f"{kernels}/{kernels} fp32", batch=f"{cfg.prompts_per_step}x{cfg.group_size}",
                                rounds=ROUNDS, **split, **thread_info())
