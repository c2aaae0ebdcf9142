"""The timbench model: Qwen3 / Qwen3-MoE definition, configs and presets, HF-layout checkpoints."""

from .checkpoint import load_checkpoint, load_model, save_checkpoint
from .config import PRESETS, ModelConfig, preset
from .qwen3 import Compute, Qwen3ForCausalLM

__all__ = [
    "PRESETS",
    "ModelConfig",
    "preset",
    "Compute",
    "Qwen3ForCausalLM",
    "load_checkpoint",
    "save_checkpoint",
    "load_model",
]
