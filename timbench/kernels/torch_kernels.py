"""Plain PyTorch kernels (BLAS matmul, torch.softmax, SDPA), the way HF eager code computes.

On CPU these are not batch-invariant: MKL picks a different blocking for a
different number of rows, and vectorised elementwise loops finish their tails
with scalar code, so the same row can round differently in another batch. That
is the "kernel mismatch" condition; against the `exact` set it is a real,
unsimulated source of TIM.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .split_kv import split_decode_attention_torch


def _wide(x):
    """fp32 for the fp32-accumulated ops; float64 stays float64 (the dtype=fp64 reference)."""
    return x if x.dtype == torch.float64 else x.float()


class TorchKernels:
    name = "torch"
    batch_invariant = False  # MKL/SDPA pick their blocking by shape, so a row's bits depend on its batch

    def cache_weights(self, enabled: bool = True) -> None:  # nothing to cache: PyTorch reads weights as they are
        pass

    def invalidate_weights(self) -> None:
        pass

    def linear(self, x, w):
        return F.linear(x, w.to(x.dtype))

    def rmsnorm(self, x, w, eps):
        dtype = x.dtype
        h = _wide(x)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
        return w.to(dtype) * h.to(dtype)

    def silu_mul(self, gate, up):
        return F.silu(gate) * up

    def causal_attention(self, q, k, v):
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True, enable_gqa=q.shape[2] != k.shape[2]
        )
        return out.transpose(1, 2)

    def decode_attention(self, q, k_cache, v_cache, slots, lengths, splits=1):
        if q.dtype == torch.float64 and k_cache.dtype != torch.float64:  # would silently read fp32-rounded keys
            raise ValueError(
                "dtype=fp64 decode needs a float64 KV cache (the engine's is fp32): "
                "use fp64 on the trainer side, as the reference"
            )
        if splits > 1:
            return split_decode_attention_torch(q, k_cache, v_cache, slots, lengths, splits)
        t_max = int(lengths.max())
        k = k_cache[slots, :t_max].to(q.dtype).transpose(1, 2)  # cache is fp32; values are exact in q.dtype
        v = v_cache[slots, :t_max].to(q.dtype).transpose(1, 2)
        mask = torch.arange(t_max, device=lengths.device)[None, :] < lengths[:, None]
        out = F.scaled_dot_product_attention(
            q[:, :, None, :], k, v, attn_mask=mask[:, None, None, :], enable_gqa=q.shape[1] != k.shape[1]
        )
        return out[:, :, 0, :]

    def log_softmax(self, x):
        return torch.log_softmax(_wide(x), dim=-1)

    def router_topk(self, logits, k, normalize, experts=None):
        probs = torch.softmax(_wide(logits), dim=-1)
        if experts is None:
            weights, experts = torch.topk(probs, k, dim=-1)
        else:
            weights = probs.gather(-1, experts)
        if normalize:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return weights, experts
