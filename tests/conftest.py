"""Shared fixtures: small seeded models (random init) for the reference-stack tests, and the `unit` tier's guard."""

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


@pytest.fixture(autouse=True)
def _unit_builds_no_model(request, monkeypatch):
    """The `unit` tier (make test-unit) builds no model: a test marked `unit` that builds one fails, naming why."""
    if request.node.get_closest_marker("unit") is None:
        return
    shared = {"model", "dense", "moe"} & set(request.fixturenames)
    assert not shared, f"a `unit` test uses the model fixture(s) {sorted(shared)}; its file leaves the unit tier"

    def refuse(self, *args, **kwargs):
        raise AssertionError("a `unit` test built a model (Qwen3ForCausalLM); its file leaves the unit tier")

    monkeypatch.setattr(Qwen3ForCausalLM, "__init__", refuse)
