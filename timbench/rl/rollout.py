"""One step's experience: sample B prompts x G responses with the engine, score them, pad them.

Request ids are a pure function of (step, prompt, sample), and the sampling
noise is keyed by (seed, request id, position): a run and its zero-mismatch
twin draw the same random numbers, so any difference between their batches is
caused by the mismatch alone.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..data import decode_response, max_new_tokens, requests_for
from ..engine import Engine, SamplingParams


@dataclass
class Experience:
    problems: list
    seqs: list[tuple[tuple[int, ...], list[int]]]
    """(prompt_ids, response_ids) per response, groups of G contiguous."""
    rewards: torch.Tensor
    """[N] outcome rewards."""
    rollout_logprobs: torch.Tensor
    """[N, R] engine logprobs mu of the sampled tokens (0 where masked)."""
    mask: torch.Tensor
    """[N, R] bool response-token mask."""
    routing: list
    """Per response, the engine's MoE routing (or None)."""
    support: torch.Tensor | None = None
    """[N, R, V] bool, the tokens the sampler could draw at each response position (top-k / top-p support;
    True past a response's end), or None when sampling kept the whole vocabulary."""
    rollout_dist: torch.Tensor | None = None
    """[N, R, V] float32: the engine's raw tempered log-distribution at each response position (before top-k /
    top-p; 0 past a response's end), or None when the engine cannot give it (vLLM: top-K logprobs only)."""


def pad_right(rows: list[torch.Tensor], width: int) -> tuple[torch.Tensor, torch.Tensor]:
    out = torch.zeros(len(rows), width, dtype=torch.float32)
    mask = torch.zeros(len(rows), width, dtype=torch.bool)
    for i, r in enumerate(rows):
        out[i, : len(r)] = r
        mask[i, : len(r)] = True
    return out, mask


def collect(
    engine: Engine, task, problems, group_size: int, step: int, seed: int, temperature: float, budget: int | None = None
) -> Experience:
    n = len(problems) * group_size
    limit = budget or max_new_tokens(task, engine.max_len)
    reqs = requests_for([p for p in problems for _ in range(group_size)], range(step * n, (step + 1) * n), limit)
    comps = engine.generate(reqs, SamplingParams(temperature=temperature, seed=seed, full_logprobs=True))
    rewards = torch.tensor(
        [task.reward(decode_response(c.token_ids), problems[i // group_size]) for i, c in enumerate(comps)],
        dtype=torch.float32,
    )
    lp, mask = pad_right([c.logprobs for c in comps], max(len(c.token_ids) for c in comps))
    return Experience(
        list(problems),
        [(c.prompt_ids, c.token_ids) for c in comps],
        rewards,
        lp,
        mask,
        [c.routing for c in comps],
        pad_support([c.support for c in comps], lp.shape[1]),
        pad_dist([c.full_logprobs for c in comps], lp.shape[1]),
    )


def pad_support(rows: list[torch.Tensor | None], width: int) -> torch.Tensor | None:
    """[N, width, V] bool from per-response [len, V] supports (True past each end), or None when none has one."""
    return None if all(r is None for r in rows) else _pad_rows(rows, width, True, torch.bool)


def pad_dist(rows: list[torch.Tensor | None], width: int) -> torch.Tensor | None:
    """[N, width, V] float32 from per-response [len, V] log-distributions (0 past each end); None unless all have
    one."""
    return None if any(r is None for r in rows) else _pad_rows(rows, width, 0.0, torch.float32)


def _pad_rows(rows: list[torch.Tensor | None], width: int, fill, dtype: torch.dtype) -> torch.Tensor:
    """Per-response [len, V] rows right-padded with `fill` into [N, width, V] (a None row is all `fill`)."""
    vocab = next(r for r in rows if r is not None).shape[-1]
    out = torch.full((len(rows), width, vocab), fill, dtype=dtype)
    for i, r in enumerate(rows):
        if r is not None:
            out[i, : len(r)] = r
    return out
