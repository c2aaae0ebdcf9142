"""Synthetic logit noise (the engine spec's `noise=` key): one table of kinds, their parameters and arithmetic.

The noise for a token is keyed by (seed, request id, position) on its own
streams, never by the batch, so a noisy engine stays batch-invariant. The spec
parses `kind:sigma[:df]` against `NOISE_KINDS` and the sampler perturbs through
`perturb_logits`: a new kind is one entry here (its parameter count and the
function giving its unit-scale noise) and its test.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..kernels import KernelSet
from ..kernels.logprobs import token_logprobs_all
from ..kernels.noise_ops import keyed_normal, keyed_student_t, one_minus_prob

NOISE_STREAM_SAMPLING = 0
NOISE_STREAM_LOGITS = 1  # student_t also uses streams 2 .. 1 + df for its chi-square draws


@dataclass(frozen=True)
class Noise:
    """Synthetic logit noise on the engine's sampler: `kind:sigma[:df]`."""

    kind: str = "none"
    sigma: float = 0.0
    df: int = 0

    def __str__(self) -> str:
        if self.kind == "none":
            return "none"
        return f"{self.kind}:{self.sigma:g}" + (f":{self.df}" if self.kind == "student_t" else "")


def key_ids(t: torch.Tensor):
    """Request ids or positions as the int64 array the keyed-noise kernels take."""
    return t.numpy().astype("int64")


def _gaussian(noise: Noise, logits, params, req, pos, kernels):
    return keyed_normal(params.seed, NOISE_STREAM_LOGITS, key_ids(req), key_ids(pos), logits.shape[-1])


def _student_t(noise: Noise, logits, params, req, pos, kernels):
    return keyed_student_t(params.seed, NOISE_STREAM_LOGITS, key_ids(req), key_ids(pos), logits.shape[-1], noise.df)


def _lowprob(noise: Noise, logits, params, req, pos, kernels):
    # Scale unit noise by 1 - p (p from the clean tempered distribution): the model's likely
    # tokens barely move, its unlikely ones take the full sigma, where real mismatch concentrates.
    lp = token_logprobs_all(logits, params.temperature, kernels)
    return _gaussian(noise, logits, params, req, pos, kernels) * one_minus_prob(lp.contiguous().numpy())


@dataclass(frozen=True)
class NoiseKind:
    """One noise kind: how many `:`-parameters follow it and its unit-scale noise [B, V] (float64)."""

    n_params: int
    unit: Callable


NOISE_KINDS: dict[str, NoiseKind] = {
    "gaussian": NoiseKind(1, _gaussian),
    "lowprob": NoiseKind(1, _lowprob),
    "student_t": NoiseKind(2, _student_t),  # sigma and df
}


def parse_noise(v: str) -> Noise:
    """`none`, `gaussian:SIGMA`, `lowprob:SIGMA` or `student_t:SIGMA:DF` (DF a positive integer)."""
    if v == "none":
        return Noise()
    kind, *args = v.split(":")
    if kind not in NOISE_KINDS or NOISE_KINDS[kind].n_params != len(args):
        raise ValueError
    sigma = float(args[0])
    if not sigma >= 0 or sigma == float("inf"):
        raise ValueError
    df = int(args[1]) if kind == "student_t" else 0
    if kind == "student_t" and df < 1:
        raise ValueError
    return Noise(kind, sigma, df)


def perturb_logits(
    logits: torch.Tensor, noise: Noise, params, req: torch.Tensor, pos: torch.Tensor, kernels: KernelSet
) -> torch.Tensor:
    """fp32 logits + sigma * keyed noise (unchanged for `none` or sigma 0); `params` a SamplingParams."""
    if noise.kind == "none" or noise.sigma == 0:
        return logits
    unit = NOISE_KINDS[noise.kind].unit(noise, logits.float(), params, req, pos, kernels)
    return (logits.double() + noise.sigma * torch.from_numpy(unit)).float()
