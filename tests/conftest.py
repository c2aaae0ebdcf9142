"""Shared fixtures: small seeded models (random init) for the reference-stack tests."""

import pytest
import torch

from timbench.model import PRESETS, Qwen3ForCausalLM

# One torch thread: tests check values, not speed; the models are tiny, and two threads thrash
# when other jobs share the cores. numba keeps its default, so exact kernels still split rows.
torch.set_num_threads(1)


@pytest.fixture(scope="session", params=["tiny-dense", "tiny-moe"])
def model(request):
    return Qwen3ForCausalLM(PRESETS[request.param], seed=7)


@pytest.fixture(scope="session")
def dense():
    return Qwen3ForCausalLM(PRESETS["tiny-dense"], seed=3)


@pytest.fixture(scope="session")
def moe():
    return Qwen3ForCausalLM(PRESETS["tiny-moe"], seed=5)
