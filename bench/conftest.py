"""pytest config for the throughput benchmarks (pytest-benchmark); not part of the default `tests` run.

Run from the repo root:
    python -m pytest bench/test_bench_engine.py --benchmark-json results/bench/engine.json
    python -m pytest bench/test_bench_trainer.py --benchmark-json results/bench/trainer.json
    python -m pytest bench/test_bench_rl_step.py --benchmark-json results/bench/rl_step.json
    python bench/summarize.py

Smoke mode (CI): `python -m pytest bench/ --benchmark-disable` runs each
benchmark body once, untimed, with its own sanity asserts, so a suite cannot rot
unnoticed; the `smoke` fixture tells a body to skip its extra warm-up call.

Thread counts are fixed here, before any kernel runs, and recorded in every
benchmark's extra_info so a JSON file says how it was measured.
"""

from __future__ import annotations

import dataclasses
import os

import numba
import pytest
import torch

# numba cannot go above its launch-time pool (NUMBA_NUM_THREADS, default: the CPU count), so on a
# 1-CPU runner or under NUMBA_NUM_THREADS=1 the request is capped; thread_info() records what ran.
THREADS = min(int(os.environ.get("TIMBENCH_BENCH_THREADS", "2")), numba.config.NUMBA_NUM_THREADS)
ROUNDS = int(os.environ.get("TIMBENCH_BENCH_ROUNDS", "5"))

torch.set_num_threads(THREADS)
numba.set_num_threads(THREADS)

from timbench.model import Qwen3ForCausalLM, preset  # noqa: E402


def pytest_collection_modifyitems(config, items):
    # bench/ only holds benchmarks; keep them in file order (exact next to torch per config).
    for item in items:
        item.add_marker(pytest.mark.benchmark)


def pytest_configure(config):
    config.addinivalue_line("markers", "benchmark: throughput benchmark (bench/)")


def thread_info() -> dict:
    return {
        "torch_threads": torch.get_num_threads(),
        "numba_threads": numba.get_num_threads(),
        "numba_threading_layer": _threading_layer(),
        "torch_version": torch.__version__,
        "numba_version": numba.__version__,
    }


def _threading_layer() -> str:
    try:
        return numba.threading_layer()
    except ValueError:  # no parallel numba function has run yet
        return "unset"


def bench_config(name: str = "tiny-dense"):
    """The preset with EOS moved out of the vocabulary, so every sequence runs to its token limit.

    A random-init model samples EOS with p ~ 1/vocab per step (about half of 64-token
    sequences would stop early); moving the id changes nothing but the stop test.
    """
    cfg = preset(name)
    return dataclasses.replace(cfg, eos_token_id=cfg.vocab_size)


@pytest.fixture(scope="session")
def smoke(request) -> bool:
    """True under --benchmark-disable: bodies run once, untimed (a CI check, not a measurement)."""
    return bool(request.config.getoption("benchmark_disable"))


@pytest.fixture(scope="session")
def cfg():
    return bench_config()


@pytest.fixture(scope="session")
def model(cfg):
    return Qwen3ForCausalLM(cfg, seed=0)


def record(benchmark, tokens: int, **info) -> None:
    """Store the token count and tokens/s (by the median round) next to the timing stats."""
    benchmark.extra_info.update(info, tokens=tokens, rounds=ROUNDS, **thread_info())
    stats = getattr(benchmark, "stats", None)
    if stats is not None and getattr(stats, "stats", None) is not None:
        benchmark.extra_info["tokens_per_s_median"] = tokens / stats.stats.median
