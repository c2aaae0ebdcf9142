"""Trainer forward: per-token logprobs of given sequences in one padded batch, with autograd.

The trainer sees the same (prompt, response) pairs the engine produced, in
whatever order and grouping the optimiser wants; with the `exact` kernel set
its logprobs equal the engine's bitwise, whatever that grouping is.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..kernels.logprobs import token_logprobs_all
from ..kernels.pointwise import fexp
from ..kernels.reduce import fsum
from ..model import Compute, Qwen3ForCausalLM


@dataclass
class TrainerOutput:
    logprobs: torch.Tensor
    """[B, R] log-probability of each response token (0 where masked)."""
    mask: torch.Tensor
    """[B, R] bool, True on real response tokens."""
    entropy: torch.Tensor
    """[B, R] entropy of the tempered next-token distribution (no grad)."""
    routing: torch.Tensor | None
    """MoE: [B, T, layers, k] experts chosen over the padded batch, else None."""
    dist: torch.Tensor | None = None
    """[B, R, V] detached tempered log-distribution over the whole vocabulary at each response position
    (`full_dist=True`; garbage past a response's end, see `mask`), else None. Under sampling replay it is still
    the full one, not the support-renormalised `lp_all` the logprobs come from: like the engine's raw row."""


def pack(seqs: Sequence[tuple[Sequence[int], Sequence[int]]], pad_id: int):
    """Right-pad prompt+response rows; returns ids[B, T], prompt lengths, response lengths."""
    p_len = torch.tensor([len(p) for p, _ in seqs])
    r_len = torch.tensor([len(r) for _, r in seqs])
    width = int((p_len + r_len).max())
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    for i, (p, r) in enumerate(seqs):
        ids[i, : len(p) + len(r)] = torch.tensor(list(p) + list(r), dtype=torch.long)
    return ids, p_len, r_len


def sequence_logprobs(
    model: Qwen3ForCausalLM,
    compute: Compute,
    seqs,
    temperature: float = 1.0,
    replay: torch.Tensor | None = None,
    support: torch.Tensor | None = None,
    full_dist: bool = False,
) -> TrainerOutput:
    """Logprobs of each response token given its prompt and the response so far.

    `seqs` is a list of (prompt_ids, response_ids). Token j of a response sits at
    position len(prompt)+j and is scored by the logits at the position before it.
    `replay` [B, T, layers, k] fixes MoE experts (routing replay). `support` [B, >= R, V] bool restricts
    each response position's distribution to the tokens the engine's sampler could draw there (sampling
    replay): the other logits become -inf before the log-softmax, so the logprobs (and the entropy) are
    renormalised over that support and no gradient reaches the dropped logits. `full_dist` also returns the
    whole tempered distribution (`TrainerOutput.dist`, for timbench.metrics.dist).
    """
    ids, p_len, r_len = pack(seqs, model.config.pad_token_id)
    logits, routing = model(ids, compute, replay=replay)
    r_max = int(r_len.max())
    j = torch.arange(r_max)
    mask = j[None, :] < r_len[:, None]
    src = (p_len[:, None] - 1 + j[None, :]).clamp(max=ids.shape[1] - 1)  # position whose logits score token j
    tgt = torch.where(mask, ids.gather(1, (src + 1).clamp(max=ids.shape[1] - 1)), 0)
    rows = torch.arange(len(seqs))[:, None]
    scored = logits[rows, src]
    full = scored
    if support is not None:
        scored = scored.masked_fill(~support[:, :r_max], float("-inf"))
    lp_all = token_logprobs_all(scored, temperature, compute.kernels)
    dist = None
    if full_dist:  # the engine's row is the unrestricted one too (SamplingParams.full_logprobs)
        with torch.no_grad():
            dist = (lp_all if support is None else token_logprobs_all(full, temperature, compute.kernels)).detach()
    lp = lp_all.gather(-1, tgt[..., None])[..., 0]
    with torch.no_grad():
        ent = -fsum((fexp(lp_all) * lp_all).nan_to_num(), -1)  # fixed order: a logged metric
    zero = torch.zeros((), dtype=lp.dtype)
    return TrainerOutput(torch.where(mask, lp, zero), mask, torch.where(mask, ent, zero), routing, dist)
