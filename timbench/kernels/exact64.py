"""The `exact` kernel set on float64 tensors: a forward-only fixed-order reference (`dtype=fp64`).

`ExactKernels` hands an op to the function of the same name here when its input
is float64, and keeps its fp32 path (bf16/fp16 widened to fp32) unchanged
otherwise, so no fp32 bit depends on this module. The reference is forward
only: `timbench diagnose` scores tokens with it under `torch.no_grad`, and a
gradient through it would need float64 backward kernels nobody uses.
"""

from __future__ import annotations

import math

import torch

from . import numba_ops64 as nb64

F64 = torch.float64


def _np(t: torch.Tensor):
    if torch.is_grad_enabled() and t.requires_grad:
        raise RuntimeError("the float64 exact kernels are forward-only (a reference): run them under torch.no_grad()")
    return t.detach().to(F64).contiguous().numpy()


def linear(x, w):
    k, n = x.shape[-1], w.shape[0]
    return torch.from_numpy(nb64.matmul(_np(x.reshape(-1, k)), _np(w.t()))).reshape(*x.shape[:-1], n)


def rmsnorm(x, w, eps):
    d = x.shape[-1]
    return torch.from_numpy(nb64.rmsnorm(_np(x.reshape(-1, d)), _np(w), float(eps))).reshape(x.shape)


def silu_mul(gate, up):
    n = gate.shape[-1]
    return torch.from_numpy(nb64.silu_mul(_np(gate.reshape(-1, n)), _np(up.reshape(-1, n)))).reshape(gate.shape)


def causal_attention(q, k, v):
    b, t, h, d = q.shape
    # Row b, time i is a query against keys 0..i of "slot" b, as the fp32 kernel does.
    slots = torch.arange(b).repeat_interleave(t).numpy()
    nkeys = torch.arange(1, t + 1).repeat(b).numpy()
    out = nb64.attend(_np(q).reshape(b * t, h, d), _np(k), _np(v), slots, nkeys, 1.0 / math.sqrt(d))
    return torch.from_numpy(out).reshape(b, t, h, d)


def decode_attention(q, k_cache, v_cache, slots, lengths, splits=1):
    if splits != 1:
        raise ValueError("the float64 reference has no split-KV decode (attn_splits must be 1 with dtype=fp64)")
    if k_cache.dtype != F64:
        raise ValueError(
            "dtype=fp64 decode needs a float64 KV cache (the engine's is fp32): "
            "use fp64 on the trainer side, as the reference"
        )
    return torch.from_numpy(
        nb64.attend(_np(q), _np(k_cache), _np(v_cache), slots.numpy(), lengths.numpy(), 1.0 / math.sqrt(q.shape[-1]))
    )


def log_softmax(x):
    v = x.shape[-1]
    return torch.from_numpy(nb64.log_softmax(_np(x.reshape(-1, v)))).reshape(x.shape)


def router_probs(logits):
    return torch.from_numpy(nb64.softmax(_np(logits)))
