"""Batch- and position-invariant kernels: fixed-order numba forward and backward.

Forward values come from `numba_ops`, whose per-row arithmetic is fixed by
construction, so the engine (prefill, decode, any batch) and the trainer
(padded batch, any order) produce bitwise-identical outputs for the same row.
bf16/fp16 inputs are widened to fp32 exactly, reduced in fixed order in fp32,
and rounded once to the input dtype (bf16 both ways in C, `bf16.py`: torch's
bits in fewer passes). The backward (`numba_grad`) is fixed-order too, so the
trainer's gradients do not depend on the CPU or the thread count
(PyTorch's would: ATen, MKL and oneDNN choose SIMD paths per machine). It uses
only what the forward saved (no second forward), widens bf16/fp16 gradients to
fp32 the same way (matmul gradients accumulate in fp32 with explicit fused
multiply-adds, row reductions in float64), and rounds each input's gradient
once to that input's dtype:
grads of bf16 activations and bf16 weight casts are bf16, of fp32 ones fp32,
and `log_softmax`/router-softmax grads are fp32 (their inputs are fp32).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from ..spec.mma import MmaAccum
from . import bf16, exact64, native
from . import numba_grad as ng
from . import numba_ops as nb
from .mma_accum import blocked_matmul
from .split_kv import attend_split


class _Exact(torch.autograd.Function):
    """Forward and backward both by fixed-order kernels: `fwd(*xs) -> (out, saved)`, `bwd(saved, grad, needs)`.

    `saved` holds what the backward needs (numpy views or fp32 copies made by the
    forward), so no op is ever run a second time. The input tensors also go
    through `save_for_backward`, so an in-place change before backward is an error.
    """

    @staticmethod
    def forward(ctx, fwd, bwd, *xs):
        out, saved = fwd(*xs)
        ctx.bwd, ctx.saved = bwd, saved
        ctx.save_for_backward(*xs)
        return out

    @staticmethod
    def backward(ctx, grad):
        _ = ctx.saved_tensors  # raises if an input was modified in place since the forward
        grads = ctx.bwd(ctx.saved, grad, ctx.needs_input_grad[2:])
        ctx.saved = None
        return (None, None, *grads)


def _will_backward(*xs) -> bool:
    """Whether `_exact` will record these inputs for a backward: only then does a forward keep its
    intermediates (attention probabilities, rmsnorm's r, silu's sigmoid) instead of the backward recomputing them."""
    return torch.is_grad_enabled() and any(x.requires_grad for x in xs)


def _exact(fwd, bwd, *xs):
    if _will_backward(*xs):
        return _Exact.apply(fwd, bwd, *xs)
    return fwd(*xs)[0]


def _np32(t: torch.Tensor):
    # No-op steps are skipped, not just cheap: this runs ~50 times per decode step.
    if t.requires_grad:
        t = t.detach()
    if t.dtype != torch.float32:
        a = bf16.widened(t)  # bf16: a stored output's own widening, or one pass (torch's bits either way)
        if a is not None:
            return a
        t = t.float()
    if not t.is_contiguous():
        t = t.contiguous()
    return t.numpy()


def _back(a, dtype) -> torch.Tensor:
    # `a` is always the kernel's fresh output, so bf16.store may overwrite it with its rounded values.
    out = bf16.store(a) if dtype == torch.bfloat16 else None
    if out is not None:
        return out
    out = torch.from_numpy(a)
    return out if dtype == torch.float32 else out.to(dtype)


class ExactKernels:
    name = "exact"
    batch_invariant = True  # fixed reduction orders per row, whatever the batch (tests/test_kernels.py)

    def __init__(self):
        self._wt_cache: dict | None = None
        self.mma_accum = MmaAccum()
        """The linear's K accumulation order (`mma_accum=` spec key; set by `Compute` from the spec)."""

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
    def linear(self, x, w):
        if x.dtype == exact64.F64:  # float64 reference path (forward only); fp32 path below unchanged
            return exact64.linear(x, w)
        k, n, xs, xd, wd = x.shape[-1], w.shape[0], x.shape, x.dtype, w.dtype

        def fwd(x, w):
            x2 = _np32(x.reshape(-1, k))
            return _back(blocked_matmul(x2, self._wt(w), self.mma_accum), xd).reshape(*xs[:-1], n), x2

        def bwd(x2, grad, needs):
            g = _np32(grad.reshape(-1, n))
            # dX = dY W (sum over outputs ascending); dW = dY^T X (sum over rows ascending): the
            # forward's order with fused steps (native.matmul_fma / matmul_tn).
            dx = _back(native.matmul_fma(g, _np32(w)), xd).reshape(xs) if needs[0] else None
            dw = _back(native.matmul_tn(g, x2), wd) if needs[1] else None
            return dx, dw

        return _exact(fwd, bwd, x, w)

    def rmsnorm(self, x, w, eps):
        if x.dtype == exact64.F64:
            return exact64.rmsnorm(x, w, eps)
        d, xs, xd, wd, eps = x.shape[-1], x.shape, x.dtype, w.dtype, float(eps)
        keep = _will_backward(x, w)

        def fwd(x, w):
            x2, w2 = _np32(x.reshape(-1, d)), _np32(w)
            r = np.empty(x2.shape[0], dtype=np.float32) if keep else nb.NO_ROWS
            return _back(nb.rmsnorm(x2, w2, eps, r), xd).reshape(xs), (x2, w2, r)

        def bwd(saved, grad, needs):
            dx, dw = ng.rmsnorm_bwd(*saved, _np32(grad.reshape(-1, d)), needs[0], needs[1])
            return (_back(dx, xd).reshape(xs) if needs[0] else None), (_back(dw, wd) if needs[1] else None)

        return _exact(fwd, bwd, x, w)

    def silu_mul(self, gate, up):
        if gate.dtype == exact64.F64:
            return exact64.silu_mul(gate, up)
        n, gs, gd, ud = gate.shape[-1], gate.shape, gate.dtype, up.dtype
        keep = _will_backward(gate, up)

        def fwd(g, u):
            g2, u2 = _np32(g.reshape(-1, n)), _np32(u.reshape(-1, n))
            s = np.empty(g2.shape, dtype=np.float32) if keep else nb.NO_ELEMS
            return _back(nb.silu_mul(g2, u2, s), gd).reshape(gs), (g2, u2, s)

        def bwd(saved, grad, needs):
            dg, du = ng.silu_mul_bwd(*saved, _np32(grad.reshape(-1, n)))
            return _back(dg, gd).reshape(gs), _back(du, ud).reshape(gs)

        return _exact(fwd, bwd, gate, up)

    def causal_attention(self, q, k, v):
        if q.dtype == exact64.F64:
            return exact64.causal_attention(q, k, v)
        b, t, h, d = q.shape
        scale = 1.0 / math.sqrt(d)
        keep = _will_backward(q, k, v)

        def fwd(q, k, v):
            q2, k2, v2 = _np32(q), _np32(k), _np32(v)
            # Row b, time i is a query against keys 0..i of row b: the decode kernel's arithmetic
            # (`numba_ops.attend`), in C; the probabilities are kept when a backward will read them.
            out, probs = native.attend_causal(q2, k2, v2, scale, keep)
            return _back(out, q.dtype), (q2, k2, v2, probs)

        def bwd(saved, grad, needs):
            q2, k2, v2, probs = saved
            dq, dk, dv = native.attend_causal_bwd(q2, k2, v2, _np32(grad), probs, scale)
            return _back(dq, q.dtype), _back(dk, k.dtype), _back(dv, v.dtype)

        return _exact(fwd, bwd, q, k, v)

    def decode_attention(self, q, k_cache, v_cache, slots, lengths, splits=1):
        if q.dtype == exact64.F64:
            return exact64.decode_attention(q, k_cache, v_cache, slots, lengths, splits)
        args = (_np32(q), _np32(k_cache), _np32(v_cache), slots.numpy(), lengths.numpy(), 1.0 / math.sqrt(q.shape[-1]))
        out = nb.attend(*args, nb.NO_PROBS) if splits == 1 else attend_split(*args, splits)
        return _back(out, q.dtype)

    def log_softmax(self, x):
        if x.dtype == exact64.F64:
            return exact64.log_softmax(x)
        v, xs = x.shape[-1], x.shape

        def fwd(x):
            out = nb.log_softmax(_np32(x.reshape(-1, v)))
            return torch.from_numpy(out).reshape(xs), out

        def bwd(out, grad, needs):
            return (torch.from_numpy(ng.log_softmax_bwd(out, _np32(grad.reshape(-1, v)))).reshape(xs),)

        return _exact(fwd, bwd, x.float())

    def router_topk(self, logits, k, normalize, experts=None):
        def fwd(x):
            p = nb.softmax(_np32(x))
            return torch.from_numpy(p), p

        def bwd(p, grad, needs):
            return (torch.from_numpy(ng.softmax_bwd(p, _np32(grad))),)

        probs = exact64.router_probs(logits) if logits.dtype == exact64.F64 else _exact(fwd, bwd, logits.float())
        # Stable sort: ties go to the lower expert id, decided by values alone.
        if experts is None:
            experts = torch.sort(probs.detach(), dim=-1, descending=True, stable=True).indices[:, :k]
        weights = probs.gather(-1, experts)
        if normalize:
            total = weights[:, 0]
            for j in range(1, k):  # explicit left-to-right sum: no reduction kernel to vary
                total = total + weights[:, j]
            # One division per column, not a broadcast: the broadcast's backward would sum the
            # k column gradients with torch.sum; separate nodes are accumulated in graph order.
            weights = torch.stack([weights[:, j] / total for j in range(k)], dim=1)
        return weights, experts
