"""Checkpoints in the Hugging Face layout: config.json, model.safetensors, tokenizer.json.

transformers' AutoModelForCausalLM and vLLM load these directories as they are.
Writes are atomic per file (temp file + rename), so a crash never leaves a
half-written checkpoint that looks valid.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from ..tokenizer import CharTokenizer
from ..util.atomic import atomic_path
from ..util.readfile import read_json
from ..util.shipped import available_checkpoints, shipped_checkpoint
from .config import PRESETS, ModelConfig, preset
from .qwen3 import Qwen3ForCausalLM


def _atomic(path: Path, write) -> None:
    with atomic_path(path) as tmp:
        write(tmp)


def save_checkpoint(model: Qwen3ForCausalLM, directory: str | os.PathLike, card: dict | None = None) -> Path:
    """Write an HF-layout checkpoint (and an optional `card.json`) to `directory`."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    cfg = model.config
    state = {k: v.detach().float().contiguous().clone() for k, v in model.state_dict().items()}
    if cfg.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    _atomic(d / "model.safetensors", lambda p: save_file(state, p, metadata={"format": "pt"}))
    _atomic(
        d / "config.json", lambda p: Path(p).write_text(json.dumps(cfg.to_hf_dict(), indent=2, sort_keys=True) + "\n")
    )
    gen = {"bos_token_id": cfg.bos_token_id, "eos_token_id": cfg.eos_token_id, "pad_token_id": cfg.pad_token_id}
    _atomic(d / "generation_config.json", lambda p: Path(p).write_text(json.dumps(gen, indent=2) + "\n"))
    CharTokenizer().save(d)
    if card is not None:
        _atomic(d / "card.json", lambda p: Path(p).write_text(json.dumps(card, indent=2, sort_keys=True) + "\n"))
    return d


def load_checkpoint(directory: str | os.PathLike) -> Qwen3ForCausalLM:
    """Load an HF-layout checkpoint; a missing, corrupt or truncated file, or any missing, unexpected
    or mis-shaped tensor, is a one-line error naming the file."""
    d = Path(directory)
    if not d.is_dir():
        raise FileNotFoundError(f"checkpoint directory {d} does not exist")
    cfg_path = d / "config.json"
    if not cfg_path.is_file():
        raise FileNotFoundError(f"{cfg_path}: no config.json in checkpoint directory {d}")
    hf = read_json(cfg_path)  # a ValueError naming the file if it does not parse
    if not isinstance(hf, dict):
        raise ValueError(f"{cfg_path}: expected a JSON object of model settings, got a {type(hf).__name__}")
    cfg = ModelConfig.from_hf_dict(hf, source=str(cfg_path))
    CharTokenizer.load(d)
    weights = d / "model.safetensors"
    if not weights.is_file():
        raise FileNotFoundError(f"{weights}: no model.safetensors in checkpoint directory {d}")
    try:
        state = load_file(str(weights))
    except SafetensorError as e:  # truncated or overwritten: the header no longer describes the file
        raise ValueError(
            f"{weights}: not a readable safetensors file ({e}); the file is truncated or corrupt, "
            "copy or write the checkpoint again"
        ) from None
    model = Qwen3ForCausalLM(cfg)
    expected = {k: v.shape for k, v in model.state_dict().items()}
    if cfg.tie_word_embeddings:
        expected.pop("lm_head.weight", None)
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    bad = sorted(k for k in set(expected) & set(state) if tuple(state[k].shape) != tuple(expected[k]))
    if missing or unexpected or bad:
        parts = []
        if missing:
            parts.append(f"missing {missing[:3]}")
        if unexpected:
            parts.append(f"unexpected {unexpected[:3]}")
        if bad:
            parts.append(f"shape of {bad[0]} is {tuple(state[bad[0]].shape)}, config needs {tuple(expected[bad[0]])}")
        raise ValueError(f"{weights} does not match {d / 'config.json'}: " + "; ".join(parts))
    with torch.no_grad():
        for k, p in model.state_dict().items():
            if k in state:
                p.copy_(state[k])
    return model


def load_model(name_or_path: str, seed: int = 0) -> Qwen3ForCausalLM:
    """A preset name gives a freshly initialised model (seeded); a shipped warm start's name
    (`add-4d-v1-tiny-dense`, see `timbench.util.shipped`) or any other path a checkpoint."""
    if Path(name_or_path).exists():
        return load_checkpoint(name_or_path)
    if name_or_path in available_checkpoints():
        return load_checkpoint(shipped_checkpoint(name_or_path))
    try:
        return Qwen3ForCausalLM(preset(name_or_path), seed=seed)
    except ValueError:
        raise ValueError(
            f"model {name_or_path!r} is neither a preset ({', '.join(PRESETS)}), a shipped "
            f"checkpoint ({', '.join(available_checkpoints())}) nor an existing checkpoint "
            "directory"
        ) from None
