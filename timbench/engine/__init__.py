"""The rollout engine: requests in, sampled tokens with their logprobs (and MoE routing) out."""

from ..kernels.logprobs import token_logprobs_all
from .backends import BACKENDS, make_engine
from .engine import Engine
from .sampler import SamplingParams, sample
from .score import EngineScores, score_sequences
from .sequence import Completion, Request

__all__ = [
    "BACKENDS",
    "make_engine",
    "Engine",
    "SamplingParams",
    "Completion",
    "Request",
    "sample",
    "token_logprobs_all",
    "EngineScores",
    "score_sequences",
]
