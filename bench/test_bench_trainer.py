"""Trainer forward+backward throughput: tokens per second, `exact` vs `torch` kernels, tiny-dense and tiny-moe.

Each round scores 256 (prompt, response) pairs of 10 + 18 tokens with
`sequence_logprobs` and backpropagates the summed logprobs into the weights,
the shape of one policy-gradient mini-batch.
"""

from __future__ import annotations

import random

import pytest
from conftest import ROUNDS, bench_config, record

from timbench.kernels import get_kernels
from timbench.model import Compute, Qwen3ForCausalLM
from timbench.spec.keys import Spec
from timbench.trainer.forward import sequence_logprobs

N_SEQS, PROMPT_LEN, RESPONSE_LEN = 256, 10, 18
CASES = [(m, dt, k) for m in ("tiny-dense", "tiny-moe") for dt in ("fp32", "bf16") for k in ("exact", "torch")]


def sequences(cfg):
    rng = random.Random(0)
    tok = lambda n: tuple(rng.randrange(3, cfg.vocab_size) for _ in range(n))  # noqa: E731
    return [(tok(PROMPT_LEN), tok(RESPONSE_LEN)) for _ in range(N_SEQS)]


_MODELS: dict = {}


def _model(name: str):
    """One random-init model per preset for the session (the same weights for exact and torch)."""
    if name not in _MODELS:
        cfg = bench_config(name)
        _MODELS[name] = (cfg, Qwen3ForCausalLM(cfg, seed=0))
    return _MODELS[name]


@pytest.mark.parametrize("name,dtype,kernels", CASES, ids=[f"{m}-{dt}-{k}" for m, dt, k in CASES])
def test_trainer_fwd_bwd(benchmark, name, dtype, kernels):
    cfg, model = _model(name)
    compute = Compute(get_kernels(kernels), Spec(dtype=dtype))
    seqs = sequences(cfg)

    def step():
        model.zero_grad(set_to_none=True)
        out = sequence_logprobs(model, compute, seqs, temperature=1.0)
        out.logprobs.sum().backward()
        return out

    step()
    benchmark.pedantic(step, rounds=ROUNDS, iterations=1, warmup_rounds=1)
    tokens = N_SEQS * (PROMPT_LEN + RESPONSE_LEN)
    record(
        benchmark,
        tokens,
        bench="trainer",
        model=name,
        kernels=kernels,
        dtype=dtype,
        batch=N_SEQS,
        prompt_len=PROMPT_LEN,
        response_len=RESPONSE_LEN,
    )
