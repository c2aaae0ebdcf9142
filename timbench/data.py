"""The task -> engine boundary: text to token ids and back, in one place.

A prompt is `<bos>` followed by its characters; a response is its characters
followed by `<eos>` (the engine stops on EOS and includes it in the completion).
Everything that turns a `Problem` into a `Request`, or a completion into text
for the task's verifier, goes through here, so warm start, evaluation and RL
see the same encoding.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

from .engine import Request
from .model import ModelConfig
from .tokenizer import CharTokenizer

TOKENIZER = CharTokenizer()
BOS_ID, EOS_ID = TOKENIZER.bos_id, TOKENIZER.eos_id

# Headroom over the longest measured solution, so a model that is slightly
# verbose is cut as 'length' rather than near the end of a correct answer.
MAX_NEW_TOKENS_FACTOR = 1.5
_MEASURE_N = 512


def encode_prompt(prompt: str) -> tuple[int, ...]:
    """(BOS, *chars)."""
    return (BOS_ID, *TOKENIZER.encode(prompt))


def encode_response(text: str) -> list[int]:
    """chars + [EOS]: the supervised target of a solution."""
    return TOKENIZER.encode(text) + [EOS_ID]


def decode_response(ids: Sequence[int]) -> str:
    """Response text for the verifier: stops at the first EOS and drops any special token."""
    ids = list(ids)
    if EOS_ID in ids:
        ids = ids[: ids.index(EOS_ID)]
    return TOKENIZER.decode(ids, skip_special=True)


_LENGTHS: dict[str, tuple[int, int]] = {}


def _task_lengths(task) -> tuple[int, int]:
    """(longest prompt, longest response incl. EOS) in tokens, over a fixed sample."""
    if task.name not in _LENGTHS:
        rng = random.Random(f"{task.name}:lengths")
        probs = [task.sample(rng) for _ in range(_MEASURE_N)]
        _LENGTHS[task.name] = (
            max(len(encode_prompt(p.prompt)) for p in probs),
            max(len(encode_response(p.solution)) for p in probs),
        )
    return _LENGTHS[task.name]


def max_new_tokens(task, context: int | None = None) -> int:
    """Token budget for a task's responses: ceil(1.5 x longest solution incl. EOS)
    over a fixed sample of 512 problems, capped so the longest prompt still fits
    in `context` (the model's max_position_embeddings, 256 by default)."""
    ctx = context or ModelConfig().max_position_embeddings
    max_prompt, max_resp = _task_lengths(task)
    budget = math.ceil(max_resp * MAX_NEW_TOKENS_FACTOR)
    return max(1, min(budget, ctx - max_prompt))


def requests_for(problems, request_ids: Sequence[int], max_new_tokens: int) -> list[Request]:
    """One engine Request per problem; `request_ids` must be unique (they key the sampling noise)."""
    problems = list(problems)
    request_ids = [int(i) for i in request_ids]
    if len(request_ids) != len(problems):
        raise ValueError(f"{len(problems)} problems but {len(request_ids)} request ids")
    if len(set(request_ids)) != len(request_ids):
        raise ValueError("request ids must be unique")
    return [Request(encode_prompt(p.prompt), int(max_new_tokens), rid) for p, rid in zip(problems, request_ids)]
