"""Tempered token log-probabilities from logits: the one formula the engine's sampler and the trainer share."""

from __future__ import annotations

import torch

from .base import KernelSet


def token_logprobs_all(logits: torch.Tensor, temperature: float, kernels: KernelSet) -> torch.Tensor:
    """fp32 log-probabilities [..., V] of the tempered distribution (temperature 0 scores as 1)."""
    t = 1.0 if temperature == 0 else temperature
    return kernels.log_softmax(logits.float() / t)
