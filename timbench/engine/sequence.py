"""Requests, their running state and their results: plain Python bookkeeping, no tensors math."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass(frozen=True)
class Request:
    """One generation request. `request_id` keys the sampling noise, so it must be unique per rollout batch."""

    prompt_ids: tuple[int, ...]
    max_new_tokens: int
    request_id: int


def check_request(r: Request, max_len: int) -> None:
    """The checks every engine backend applies to a request before it schedules anything."""
    if len(r.prompt_ids) == 0:
        raise ValueError(f"request {r.request_id}: empty prompt")
    if len(r.prompt_ids) >= max_len:
        raise ValueError(
            f"request {r.request_id}: prompt of {len(r.prompt_ids)} tokens leaves no room "
            f"in the context of {max_len} tokens"
        )
    if r.max_new_tokens < 1:
        raise ValueError(f"request {r.request_id}: max_new_tokens must be >= 1")


@dataclass
class Completion:
    """What the engine returns per request."""

    request_id: int
    prompt_ids: list[int]
    token_ids: list[int]
    """Sampled response tokens (EOS included when the sequence stopped on it)."""
    logprobs: torch.Tensor
    """fp32 log-probability of each sampled token under the distribution it was sampled from."""
    finish_reason: str
    """`stop` (EOS) or `length` (token limit or context end)."""
    routing: torch.Tensor | None = None
    """MoE: experts chosen [prompt_len + response_len - 1, layers, k] for each token the engine processed."""
    support: torch.Tensor | None = None
    """[response_len, V] bool: the tokens top-k / top-p kept at each sampled position (the sampling support);
    None when sampling did not truncate (the whole vocabulary) or the engine cannot say."""
    full_logprobs: torch.Tensor | None = None
    """[response_len, V] fp32: the raw tempered log-distribution at each sampled position (before top-k /
    top-p), when `SamplingParams.full_logprobs` asked for it and the engine can give it; else None."""


@dataclass
class Sequence:
    """A request in flight: its cache slot and what it has produced so far."""

    request: Request
    slot: int = -1
    fork: int = 0
    """Which of `Engine.generate_many`'s sampling parameter sets this sequence samples with."""
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    routes: list[torch.Tensor] = field(default_factory=list)
    support: list[torch.Tensor] = field(default_factory=list)
    full_logprobs: list[torch.Tensor] = field(default_factory=list)
    finish_reason: str | None = None

    @property
    def length(self) -> int:
        return len(self.request.prompt_ids) + len(self.tokens)

    @property
    def last_token(self) -> int:
        return self.tokens[-1]

    def to_completion(self) -> Completion:
        return Completion(
            request_id=self.request.request_id,
            prompt_ids=list(self.request.prompt_ids),
            token_ids=list(self.tokens),
            logprobs=torch.tensor(self.logprobs, dtype=torch.float32),
            finish_reason=self.finish_reason or "length",
            routing=torch.cat(self.routes)[: self.length - 1] if self.routes else None,
            support=torch.stack(self.support) if self.support else None,
            full_logprobs=torch.stack(self.full_logprobs) if self.full_logprobs else None,
        )
