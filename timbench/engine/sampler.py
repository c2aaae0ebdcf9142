"""Reproducible sampling: Gumbel-max with noise keyed by (seed, request id, position).

The noise for a token is a pure function of its key, never of which other
sequences share the batch, so with batch-invariant logits a request samples the
same tokens in any batch. The reported logprob is that of the distribution the
token was drawn from (temperature applied, top-p renormalised), as vLLM's
processed logprobs.

The synthetic-noise condition (`noise=` in the engine spec) perturbs the logits
before temperature, with noise keyed like the Gumbel noise but on its own
streams; the engine then samples from, and reports the logprobs of, the
perturbed distribution, so delta = log pi - log mu is the realised noise effect.
"""


from __future__ import annotations

from dataclasses import dataclass

import torch

from ..kernels import KernelSet
from ..kernels.logprobs import token_logprobs_all
from ..kernels.numba_ops import keyed_gumbel, top_p_logprobs
from ..noise import NOISE_STREAM_LOGITS, NOISE_STREAM_SAMPLING, Noise, key_ids, perturb_logits  # noqa: F401


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0
    """Softmax temperature; 0 means greedy (argmax)."""
    top_p: float = 1.0
    """Nucleus mass; 1.0 disables it."""
    seed: int = 0
    """Seed of the keyed sampling noise."""

    def __post_init__(self):
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")


def gumbel(seed: int, req: torch.Tensor, pos: torch.Tensor, width: int, stream: int = NOISE_STREAM_SAMPLING):
    """Standard Gumbel noise [len(req), width] in float64, keyed by (seed, stream, request, position)."""
    return torch.from_numpy(keyed_gumbel(seed, stream, key_ids(req), key_ids(pos), width))


def sample(logits: torch.Tensor, params: SamplingParams, req: torch.Tensor, pos: torch.Tensor,
           kernels: KernelSet, noise: Noise = Noise()) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one token per row of logits[B, V]; returns (tokens[B], logprobs[B])."""
    logits = perturb_logits(logits, noise, params, req, pos, kernels)
    # The model may run on a GPU (the `device` key); sampling stays on the host, keyed, the same everywhere.
    lp = token_logprobs_all(logits, params.temperature, kernels).cpu()
    if params.top_p < 1.0:
        lp = _top_p(lp, params.top_p)
    if params.temperature == 0:
        tok = torch.argmax(lp, dim=-1)
    else:
        tok = torch.argmax(lp.double() + gumbel(params.seed, req, pos, lp.shape[-1]), dim=-1)
    return tok, lp.gather(-1, tok[:, None])[:, 0]


def _top_p(lp: torch.Tensor, top_p: float) -> torch.Tensor:
    return torch.from_numpy(top_p_logprobs(lp.detach().contiguous().numpy(), float(top_p)))
