"""The engine factory: the one place that turns an engine spec (and optionally weights) into a rollout engine.

`engine=timbench` (default) is timbench's own engine with the spec's kernels and
conditions; `engine=vllm` is a real vLLM (the optional `vllm` extra), imported
only when asked for so that timbench never needs it installed. RL lanes, the
evaluator, the warm start and the alignment probe all build engines here.
"""

from __future__ import annotations

import torch

from ..model import ModelConfig
from ..spec.faults import FAULTS, Faulty
from ..spec.keys import Spec, parse_spec
from .engine import Engine


def _vllm(config: ModelConfig, spec: Spec, max_num_seqs: int, max_len: int | None):
    try:
        from .vllm_engine import VllmEngine  # deferred: optional (may be absent)
    except ImportError as e:
        raise ValueError(f"engine=vllm needs the vllm extra (pip install -e '.[vllm]'): {e}") from None
    return VllmEngine(config, spec, max_num_seqs=max_num_seqs, max_len=max_len)


def _timbench(config: ModelConfig, spec: Spec, max_num_seqs: int, max_len: int | None):
    return Engine(config, spec, max_num_seqs=max_num_seqs, max_len=max_len)


BACKENDS = {"timbench": _timbench, "vllm": _vllm}


def make_engine(
    config: ModelConfig,
    spec: Spec | str | dict | None = None,
    max_num_seqs: int = 256,
    max_len: int | None = None,
    weights: torch.nn.Module | None = None,
):
    """A rollout engine for `spec`: `generate(requests, params) -> [Completion]`, `load_weights(model)`.

    With `weights` (a model), the engine starts with that model's weights; otherwise call
    `engine.load_weights(model)` before generating. A spec string is parsed here (the edge
    for library callers); a Spec passes through.
    """
    s = parse_spec(spec, "engine spec", side="engine")
    fault = FAULTS.get(s.fault)
    if fault is not None and fault.config is not None:
        config = fault.config(config)
    engine = BACKENDS[s.engine](config, s, max_num_seqs, max_len)
    if weights is not None:
        engine.load_weights(weights)  # the start-up load is not a sync: a sync fault bites from the first sync on
    if fault is not None:
        engine = Faulty(engine, s.fault)  # the fault library (timbench.spec.faults): the release gate must catch it
    return engine
