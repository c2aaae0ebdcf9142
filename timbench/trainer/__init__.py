"""The trainer side: forward logprobs with autograd (the RL update loop builds on this)."""

from .forward import TrainerOutput, pack, sequence_logprobs

__all__ = ["TrainerOutput", "pack", "sequence_logprobs"]
