"""Tempered token log-probabilities from logits: the one formula the engine's sampler and the trainer share."""

from __future__ import annotations

import torch

from .base import KernelSet


def token_logprobs_all(logits: torch.Tensor, temperature: float, kernels: KernelSet) -> torch.Tensor:
    """fp32 (float64 for float64 logits) log-probabilities [..., V] of the tempered distribution (temperature 0 scores
    as 1)."""
    t = 1.0 if temperature == 0 else temperature
    # float64 stays float64 (the diagnose reference); everything else is scored in fp32.
    x = logits if logits.dtype == torch.float64 else logits.float()
    return kernels.log_softmax(x / t)
