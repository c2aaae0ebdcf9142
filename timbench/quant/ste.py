"""Straight-through fake quantization and an explicit per-owner cache of quantized weights.

`fake_quant(x, fn)`: the forward value is fn(x) (computed on x.detach().float(), returned in x's
dtype), the backward passes the upstream gradient to x unchanged. That is the "unified precision"
trainer: it runs the same quantized forward as the rollout engine, and the gradient reaches the
full-precision master weights straight through the rounding (STE). It is written as an
autograd.Function, not as `x + (q - x).detach()`, because that expression is not bitwise q
(x + (q - x) rounds), and zero mismatch between engine and trainer is checked bitwise. A bf16 x
gets fn's fp32 result rounded to bf16 (documented double rounding: the format grid times a scale
is not always a bf16 value).

`QuantCache`: the engine's weights change only at a weight sync, but the model quantizes on every
forward; the cache (an object its owner keeps, never a global) returns the stored result while the
parameter's storage, version counter (bumped by every in-place write: optimizer steps, copy_,
load_state_dict) and shape are unchanged. It holds a reference to the parameter, so an id cannot be
reused by another tensor while its entry exists. Use it where no gradient is needed (the engine).
One write it cannot see: `param.data.copy_(...)` (`.data` does not share the version counter;
`with torch.no_grad(): param.copy_(...)`, `state_dict()[k].copy_(...)` and `load_state_dict` do).
The owner should call `clear()` at every weight sync anyway (next to `invalidate_weights()`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from timbench.quant.schemes import quantize_weight

Tensor = torch.Tensor


class _StraightThrough(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, fn):
        return fn(x.detach().float()).to(x.dtype)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def fake_quant(x: Tensor, fn: Callable[[Tensor], Tensor]) -> Tensor:
    """fn(x) forward (in x's dtype), identity backward (straight-through estimator)."""
    if torch.is_grad_enabled() and x.requires_grad:
        return _StraightThrough.apply(x, fn)
    return fn(x.detach().float()).to(x.dtype)


class QuantCache:
    """Caches fn(param) per (param, scheme, dtype) until the parameter changes."""

    def __init__(self) -> None:
        self._entries: dict[tuple, tuple] = {}
        self.hits = 0
        self.misses = 0

    def get(
        self, param: Tensor, scheme: str, fn: Callable[[Tensor], Tensor], dtype: torch.dtype | None = None
    ) -> Tensor:
        """fn(param) as `dtype` (default param's), recomputed only when param changed."""
        dtype = param.dtype if dtype is None else dtype
        key = (id(param), scheme, dtype)
        stamp = (param._version, param.data_ptr(), tuple(param.shape), param.dtype)
        entry = self._entries.get(key)
        if entry is not None and entry[0] is param and entry[1] == stamp:
            self.hits += 1
            return entry[2]
        self.misses += 1
        # Made outside inference mode (an engine generates inside it) and kept as a frozen Parameter, so it
        # has a version counter and a kernel set's own per-weight layout cache (which keeps Parameters only,
        # never temporaries) holds its transposed copy until the next sync too.
        with torch.inference_mode(False), torch.no_grad():
            out = torch.nn.Parameter(fn(param.detach().float()).to(dtype), requires_grad=False)
        self._entries[key] = (param, stamp, out)
        return out

    def weight(self, param: Tensor, name: str, dtype: torch.dtype | None = None) -> Tensor:
        """quantize_weight(param, name) as `dtype`, cached (the engine's per-sync weights)."""
        return self.get(param, name, lambda w: quantize_weight(w, name), dtype)

    def clear(self) -> None:
        self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)
