"""The gate's checkpoints: the shipped warm starts, and production-shape models built at run time.

The tiny warm starts (head_dim 32, a 99-token vocabulary) never reach the kernel paths an engine runs in
production: head_dim 128 attention, a 151,936-wide LM head, a 128-expert top-8 MoE layer. A production
shape keeps a real model's geometry, truncated to one decoder layer, random-initialised from a fixed seed
at run time (nothing downloaded or shipped), so those paths run. Its weights are random, so what it checks
is the engine's arithmetic (determinism, batch invariance, prefill vs decode, alignment, weight sync), not
what it generates; with near-uniform logits over 151,936 tokens the sampling probe has nothing to count.
"""

from __future__ import annotations

from pathlib import Path

from ..model import ModelConfig, Qwen3ForCausalLM, load_checkpoint
from ..util.shipped import available_checkpoints, default_checkpoint

QWEN3_VOCAB = 151_936
"""Qwen3's vocabulary size (every Qwen3 and Qwen3-MoE config.json on the Hugging Face hub)."""

SHAPES: dict[str, ModelConfig] = {
    # Qwen3-0.6B's config.json: hidden 1024, MLP 3072, 16 query / 8 KV heads of 128, tied embeddings,
    # rope_theta 1e6; 1 of its 28 layers.
    "qwen3-0.6b-1layer": ModelConfig(
        vocab_size=QWEN3_VOCAB,
        hidden_size=1024,
        intermediate_size=3072,
        num_hidden_layers=1,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
        max_position_embeddings=512,
        rope_theta=1_000_000.0,
        tie_word_embeddings=True,
    ),
    # Qwen3-30B-A3B's attention and MoE layer: hidden 2048, 32 query / 4 KV heads of 128, 128 experts of
    # width 768, top-8, normalised top-k; 1 of its 48 layers. Its untied 151,936-token embedding and head
    # (2 x 311M parameters) are left out: the dense shape covers the wide head, and this one stays within
    # a CPU's memory with the four copies weight_sync holds (model, trainer, synced and fresh engine).
    "qwen3-30b-a3b-1layer": ModelConfig(
        model_type="qwen3_moe",
        hidden_size=2048,
        num_hidden_layers=1,
        num_attention_heads=32,
        num_key_value_heads=4,
        head_dim=128,
        max_position_embeddings=512,
        rope_theta=1_000_000.0,
        num_experts=128,
        num_experts_per_tok=8,
        moe_intermediate_size=768,
        norm_topk_prob=True,
    ),
}
"""Production shapes by name (usable in a suite's `models:` beside the shipped warm starts)."""

SEED = 0
"""Initialisation seed of every production shape."""


def valid_models() -> list[str]:
    shipped = [n.removeprefix("add-4d-v1-") for n in available_checkpoints() if n.startswith("add-4d-v1-")]
    return shipped + list(SHAPES)


def load_model(name: str):
    """A suite's model by name: a production shape built here, else the shipped add-4d-v1 warm start."""
    if name in SHAPES:
        return Qwen3ForCausalLM(SHAPES[name], seed=SEED)
    return load_checkpoint(default_checkpoint("add-4d-v1", name))


def save_hf(name: str, directory) -> Path:
    """A production shape as a Hugging Face directory a server loads as it is (`vllm ... --model DIR`, and the
    gate's `--trainer hf=DIR`): its random-initialised weights, and timbench's character tokenizer widened to the
    shape's vocabulary. The ids past the characters decode to `<|tN|>` and no text tokenizes to them (the BPE has
    no merges), so the gate's tokenizer check covers every id the model can sample, on both sides."""
    import json

    from ..model.checkpoint import save_checkpoint
    from ..util.atomic import atomic_write

    if name not in SHAPES:
        raise ValueError(f"unknown production shape {name!r}; valid: {', '.join(SHAPES)}")
    d = save_checkpoint(load_model(name), directory)
    tok = json.loads((d / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    vocab.update({f"<|t{i}|>": i for i in range(len(vocab), SHAPES[name].vocab_size)})
    atomic_write(d / "tokenizer.json", json.dumps(tok, ensure_ascii=False) + "\n")
    return d
