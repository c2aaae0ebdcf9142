"""Batch- and position-invariant kernels: fixed-order numba forward, PyTorch backward.

Forward values come from `numba_ops`, whose per-row arithmetic is fixed by
construction, so the engine (prefill, decode, any batch) and the trainer
(padded batch, any order) produce bitwise-identical outputs for the same row.
bf16/fp16 inputs are widened to fp32 exactly, reduced in fixed order in fp32,
and rounded once to the input dtype. Gradients need no invariance: the backward
pass recomputes the op with ordinary PyTorch and differentiates that.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from . import numba_ops as nb
from .split_kv import attend_split
from .torch_kernels import TorchKernels

_REF = TorchKernels()


class _FixedOrder(torch.autograd.Function):
    """Forward by a fixed-order kernel, backward through a PyTorch reference of the same op."""

    @staticmethod
    def forward(ctx, fwd, ref, *xs):
        ctx.ref = ref
        ctx.save_for_backward(*xs)
        return fwd(*xs)

    @staticmethod
    def backward(ctx, grad):
        xs = [x.detach().requires_grad_(need) for x, need in zip(ctx.saved_tensors, ctx.needs_input_grad[2:])]
        wanted = [x for x in xs if x.requires_grad]
        with torch.enable_grad():
            out = ctx.ref(*xs)
        grads = iter(torch.autograd.grad(out, wanted, grad, allow_unused=True))
        return (None, None, *[next(grads) if x.requires_grad else None for x in xs])


def _fixed_order(fwd, ref, *xs):
    if torch.is_grad_enabled() and any(x.requires_grad for x in xs):
        return _FixedOrder.apply(fwd, ref, *xs)
    return fwd(*xs)


def _np32(t: torch.Tensor):
    # No-op steps are skipped, not just cheap: this runs ~50 times per decode step.
    if t.requires_grad:
        t = t.detach()
    if t.dtype != torch.float32:
        t = t.float()
    if not t.is_contiguous():
        t = t.contiguous()
    return t.numpy()


def _back(a, dtype) -> torch.Tensor:
    out = torch.from_numpy(a)
    return out if dtype == torch.float32 else out.to(dtype)


def _linear_ref(x, w):
    return F.linear(x, w.to(x.dtype))


class ExactKernels:
    name = "exact"

    def __init__(self):
        self._wt_cache: dict | None = None

    # --- transposed-weight cache (the engine's; the trainer's weights change every step) -------
    def cache_weights(self, enabled: bool = True) -> None:
        """Keep each weight Parameter's fp32 transpose between calls until `invalidate_weights`.

        Only the values' layout is cached (an exact copy), so results are unchanged.
        A hit also needs the same tensor object at the same version counter, so
        an in-place update that skips `invalidate_weights` still misses.
        """
        self._wt_cache = {} if enabled else None

    def invalidate_weights(self) -> None:
        if self._wt_cache is not None:
            self._wt_cache.clear()

    def _wt(self, w: torch.Tensor):
        cache = self._wt_cache
        if cache is None or not isinstance(w, torch.nn.Parameter):  # temporaries (e.g. casts) never cached
            return _np32(w.t())
        hit = cache.get(id(w))
        if hit is not None and hit[0] is w and hit[1] == w._version:
            return hit[2]
        wt = _np32(w.t())
        cache[id(w)] = (w, w._version, wt)
        return wt

    # --- operations ----------------------------------------------------------------------------
    def _linear(self, x, w):
        k = x.shape[-1]
        out = nb.matmul(_np32(x.reshape(-1, k)), self._wt(w))
        return _back(out, x.dtype).reshape(*x.shape[:-1], w.shape[0])

    def linear(self, x, w):
        return _fixed_order(self._linear, _linear_ref, x, w)

    def rmsnorm(self, x, w, eps):
        def fwd(x, w):
            out = nb.rmsnorm(_np32(x.reshape(-1, x.shape[-1])), _np32(w), float(eps))
            return _back(out, x.dtype).reshape(x.shape)
        return _fixed_order(fwd, lambda x, w: _REF.rmsnorm(x, w, eps), x, w)

    def silu_mul(self, gate, up):
        def fwd(g, u):
            n = g.shape[-1]
            return _back(nb.silu_mul(_np32(g.reshape(-1, n)), _np32(u.reshape(-1, n))), g.dtype).reshape(g.shape)
        return _fixed_order(fwd, _REF.silu_mul, gate, up)

    def causal_attention(self, q, k, v):
        b, t, h, d = q.shape
        # Row b, time i is a query against keys 0..i of "slot" b: the decode kernel's own loop.
        slots = torch.arange(b).repeat_interleave(t).numpy()
        nkeys = torch.arange(1, t + 1).repeat(b).numpy()

        def fwd(q, k, v):
            out = nb.attend(_np32(q.reshape(b * t, h, d)), _np32(k), _np32(v), slots, nkeys, 1.0 / math.sqrt(d))
            return _back(out, q.dtype).reshape(b, t, h, d)
        return _fixed_order(fwd, _REF.causal_attention, q, k, v)

    def decode_attention(self, q, k_cache, v_cache, slots, lengths, splits=1):
        args = (_np32(q), _np32(k_cache), _np32(v_cache), slots.numpy(), lengths.numpy(), 1.0 / math.sqrt(q.shape[-1]))
        out = nb.attend(*args) if splits == 1 else attend_split(*args, splits)
        return _back(out, q.dtype)

    def log_softmax(self, x):
        def fwd(x):
            return torch.from_numpy(nb.log_softmax(_np32(x.reshape(-1, x.shape[-1])))).reshape(x.shape)
        return _fixed_order(fwd, _REF.log_softmax, x.float())

    def router_topk(self, logits, k, normalize, experts=None):
        def fwd(x):
            return torch.from_numpy(nb.softmax(_np32(x)))
        probs = _fixed_order(fwd, lambda x: torch.softmax(x, dim=-1), logits.float())
        # Stable sort: ties go to the lower expert id, decided by values alone.
        if experts is None:
            experts = torch.sort(probs.detach(), dim=-1, descending=True, stable=True).indices[:, :k]
        weights = probs.gather(-1, experts)
        if normalize:
            total = weights[:, 0]
            for j in range(1, k):  # explicit left-to-right sum: no reduction kernel to vary
                total = total + weights[:, j]
            weights = weights / total[:, None]
        return weights, experts
