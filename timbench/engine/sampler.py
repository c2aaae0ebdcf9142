"""Reproducible sampling: Gumbel-max with noise keyed by (seed, request id, position).

The noise for a token is a pure function of its key, never of which other
sequences share the batch, so with batch-invariant logits a request samples the
same tokens in any batch. The reported logprob is that of the distribution the
token was drawn from (temperature applied, top-k / top-p renormalised), as
vLLM's processed logprobs: the filters set the logits outside the kept set
(the "sampling support") to -inf and the logprobs are the log-softmax of what
is left, top-k first, then top-p on the top-k distribution (vLLM's order).
`sample` also returns that support per row, the mask a trainer needs to score
the same truncated distribution (sampling replay, timbench.remedies.support).
`draw` returns besides the full tempered log-distribution each row was truncated
from (raw, before top-k / top-p: the policy's own distribution), which the
engine hands out when `SamplingParams.full_logprobs` asks (distribution-level
mismatch metrics, timbench.metrics.dist); computing it costs nothing, since
the truncation starts from it.

The synthetic-noise condition (`noise=` in the engine spec) perturbs the logits
before temperature, with noise keyed like the Gumbel noise but on its own
streams; the engine then samples from, and reports the logprobs of, the
perturbed distribution, so delta = log pi - log mu is the realised noise effect.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import NamedTuple

import torch

from ..kernels import KernelSet
from ..kernels.logprobs import token_logprobs_all
from ..kernels.numba_ops import keyed_gumbel, top_p_logprobs
from ..spec.noise import NOISE_STREAM_LOGITS, NOISE_STREAM_SAMPLING, Noise, key_ids, perturb_logits  # noqa: F401


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0
    """Softmax temperature; 0 means greedy (argmax)."""
    top_p: float = 1.0
    """Nucleus mass; 1.0 disables it."""
    top_k: int = 0
    """Keep only the k most likely tokens (ties to the lower id); 0 disables it."""
    seed: int = 0
    """Seed of the keyed sampling noise."""
    full_logprobs: bool = False
    """Also return, per sampled token, the whole tempered log-distribution over the vocabulary
    (`Completion.full_logprobs` [response_len, V]), opt-in as vLLM's `logprobs=k` top logprobs are. It is the
    raw row, before top-k / top-p: the policy's distribution at that position, which a trainer scores over the
    whole vocabulary too; the processed row (-inf off the support, renormalised) follows from it and
    `Completion.support`, and its -inf entries would make top-K sets and total variation measure the sampler's
    truncation rather than the arithmetic. Engines that cannot give it (vLLM: top-K logprobs only) return None."""

    def __post_init__(self):
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise ValueError(f"top_k must be an integer >= 0 (0 = off), got {self.top_k!r}")
        if not isinstance(self.full_logprobs, bool):
            raise ValueError(f"full_logprobs must be True or False, got {self.full_logprobs!r}")

    @property
    def truncates(self) -> bool:
        """Whether top-k or top-p can drop tokens (the support is then narrower than the vocabulary)."""
        return self.top_k > 0 or self.top_p < 1.0


def for_spec(params: SamplingParams, spec) -> SamplingParams:
    """`params` with the engine spec's top_k / top_p (the condition keys) where the spec sets them."""
    changes = {k: getattr(spec, k) for k, off in (("top_k", 0), ("top_p", 1.0)) if getattr(spec, k, off) != off}
    return dataclasses.replace(params, **changes) if changes else params


def gumbel(seed: int, req: torch.Tensor, pos: torch.Tensor, width: int, stream: int = NOISE_STREAM_SAMPLING):
    """Standard Gumbel noise [len(req), width] in float64, keyed by (seed, stream, request, position)."""
    return torch.from_numpy(keyed_gumbel(seed, stream, key_ids(req), key_ids(pos), width))


class Draw(NamedTuple):
    """One sampling step over a batch of rows."""

    tokens: torch.Tensor
    """[B] the sampled token ids."""
    logprobs: torch.Tensor
    """[B] fp32 logprob of each under the distribution it was drawn from (processed)."""
    support: torch.Tensor | None
    """[B, V] bool: the top-k / top-p kept set, or None when neither truncates (the whole vocabulary)."""
    full: torch.Tensor
    """[B, V] fp32 (host) raw tempered log-distribution, before top-k / top-p (see SamplingParams.full_logprobs)."""


def sample(
    logits: torch.Tensor,
    params: SamplingParams,
    req: torch.Tensor,
    pos: torch.Tensor,
    kernels: KernelSet,
    noise: Noise = Noise(),
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Sample one token per row of logits[B, V]; returns (tokens[B], logprobs[B], support[B, V] bool or None).

    The support is the kept set of top-k / top-p (None when neither truncates: the whole vocabulary).
    """
    return tuple(draw(logits, params, req, pos, kernels, noise))[:3]


def draw(
    logits: torch.Tensor,
    params: SamplingParams,
    req: torch.Tensor,
    pos: torch.Tensor,
    kernels: KernelSet,
    noise: Noise = Noise(),
) -> Draw:
    """`sample`, also returning the raw tempered log-distribution of every row (`Draw.full`)."""
    logits = perturb_logits(logits, noise, params, req, pos, kernels)
    full, lp, keep = _logprobs(logits, params, kernels)
    if params.temperature == 0:
        tok = torch.argmax(lp, dim=-1)
    else:
        tok = torch.argmax(lp.double() + gumbel(params.seed, req, pos, lp.shape[-1]), dim=-1)
    return Draw(tok, lp.gather(-1, tok[:, None])[:, 0], keep, full)


def processed_logprobs(
    logits: torch.Tensor, params: SamplingParams, kernels: KernelSet
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(logprobs [B, V] of the distribution sampled from, its support [B, V] bool or None): the tempered
    log-softmax, or with top-k / top-p that of the logits outside the kept set set to -inf (vLLM's order).
    The logits may sit on a GPU (the engine spec's `device`): the log-softmax runs there, as an engine's does, and
    everything after it (support, keyed Gumbel noise) in host memory, the same code on every device."""
    return _logprobs(logits, params, kernels)[1:]


def _logprobs(logits: torch.Tensor, params: SamplingParams, kernels: KernelSet):
    """(raw tempered logprobs [B, V], processed logprobs [B, V], support or None), all in host memory."""
    raw = token_logprobs_all(logits, params.temperature, kernels).cpu()
    keep = sampling_support(raw, params, kernels)
    lp = raw
    if keep is not None:
        masked = logits.masked_fill(~keep.to(logits.device), float("-inf"))
        lp = token_logprobs_all(masked, params.temperature, kernels).cpu()
    return raw, lp, keep


def sampling_support(lp: torch.Tensor, params: SamplingParams, kernels: KernelSet) -> torch.Tensor | None:
    """[B, V] bool: the tokens top-k then top-p keep, from the full logprobs lp [B, V]; None when neither is on."""
    if not params.truncates:
        return None
    keep = torch.ones_like(lp, dtype=torch.bool)
    if 0 < params.top_k < lp.shape[-1]:
        # A stable sort: equal logprobs keep the lower token id first, so the set never depends on the CPU.
        order = torch.sort(lp, dim=-1, descending=True, stable=True).indices[:, params.top_k :]
        keep = keep.scatter(-1, order, False)
    if params.top_p < 1.0:
        lp_k = lp if bool(keep.all()) else token_logprobs_all(lp.masked_fill(~keep, float("-inf")), 1.0, kernels)
        keep = keep & torch.isfinite(_top_p(lp_k, params.top_p))
    return keep


def _top_p(lp: torch.Tensor, top_p: float) -> torch.Tensor:
    return torch.from_numpy(top_p_logprobs(lp.detach().contiguous().numpy(), float(top_p)))
