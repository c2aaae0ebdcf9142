"""The trainer side: forward logprobs with autograd, and the policy update loop built on it."""

from .forward import TrainerOutput, pack, sequence_logprobs
from .update import MiniBatch, NonFiniteError, update_policy

__all__ = ["MiniBatch", "NonFiniteError", "TrainerOutput", "pack", "sequence_logprobs", "update_policy"]
