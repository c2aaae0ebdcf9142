"""Where a forward pass rounds to low precision: decoder-linear weights, their inputs, and KV-cache entries.

The model calls these three functions at the points a quantized serving stack rounds (vLLM's fp8 /
mxfp4 / modelopt_fp4 / compressed-tensors linears and its `kv_cache_dtype`): the weights of the decoder
linears, the inputs of those linears (dynamic, per token) and keys/values as they are stored. What is
*not* quantized follows vLLM's defaults for these checkpoints: the embedding, the norms, the MoE router
(gate) and the LM head stay in the spec's dtype (`logits_dtype` still picks the LM head's precision).

With a key off the function returns its input untouched, so the unquantized forward is the same
arithmetic as before the keys existed. Quantization is exact elementwise arithmetic on fp32
(`timbench.quant`): engine and trainer with the same keys agree bitwise, and quantized rows stay
batch-invariant (activation scales are per token). In a trainer forward with autograd the rounding is
straight-through (`fake_quant`): the gradient reaches the full-precision master weights unchanged,
which is how unified-precision training (FP8-RL, arXiv 2601.18150) updates a model it runs quantized.

Order of rounding: a weight is first cast to the compute dtype (as an engine stores it), widened to
fp32, quantized and dequantized there, and rounded back to the compute dtype.
"""

from __future__ import annotations

import torch

from ..quant import fake_quant, quantize_act, quantize_kv, quantize_weight
from ..quant.aligned import quantize_aligned


def weight(w: torch.Tensor, c) -> torch.Tensor:
    """The weight a quantized linear multiplies by, in `c.dtype` (cached per weight version where `c` keeps a cache).

    An engine's weights change only at a weight sync, so it passes `c.quant_cache` (a `QuantCache` it
    clears in `load_weights`) and quantizes each weight once per sync; a trainer's weights change every step.
    """
    dt = c.dtype
    if c.weight_quant == "none":
        return w.to(dt)
    name = c.weight_quant
    codes = None if c.rollout_codes is None else c.rollout_codes.get(w)
    if codes is not None:  # rounding-aligned (TRACE): toward the rollout's codewords, straight-through
        return fake_quant(w.to(dt), lambda t: quantize_aligned(t, name, codes, c.rollout_codes.outside))
    if c.quant_cache is None or w.requires_grad:
        return fake_quant(w.to(dt), lambda t: quantize_weight(t, name))
    return c.quant_cache.get(w, name, lambda t: quantize_weight(t.to(dt).float(), name), dt)


def act(x: torch.Tensor, c) -> torch.Tensor:
    """A quantized linear's input: per-token dynamic quantization (row-local, so batch-invariant)."""
    if c.act_quant == "none":
        return x
    name = c.act_quant
    return fake_quant(x, lambda t: quantize_act(t, name))


def kv(t: torch.Tensor, c) -> torch.Tensor:
    """Keys or values [..., Hkv, D] as the KV cache stores them (`kv_cache_dtype`; auto = unchanged)."""
    if c.kv_cache_dtype == "auto":
        return t
    name = c.kv_cache_dtype
    return fake_quant(t, lambda u: quantize_kv(u, name))
