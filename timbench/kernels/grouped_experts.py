"""The MoE experts' MLPs for the exact kernels in one autograd call: tokens grouped by expert, grouped GEMMs.

The reference is the per-expert loop (`Qwen3ForCausalLM._experts_loop`): for each expert e in ascending order,
its (token, rank) pairs in `torch.nonzero` order, `flat[tok]`, gate/up linears, `silu_mul`, the down linear,
`scale_rows` by the gate weights and a scatter into per_rank [T, k, D]. Every value there is row-local, so a
stable sort of the (token, rank) pairs by expert puts each expert's rows in one segment in that same order, and
one grouped GEMM per projection (`native.matmul_grouped`: each segment times its own expert's weight) gives the
same bits. The backward keeps the loop's reductions and their orders:

- dW of an expert sums its segment's rows ascending (`native.matmul_tn_grouped`), as the loop's linear did;
- a row's dX is dX_up + dX_gate in the activation dtype (two terms: their order cannot matter);
- `flat`'s gradient: autograd ran the loop's experts' backwards last expert first (higher sequence numbers
  first), and each gather's backward is an `index_put_` accumulate into zeros. A token's gradient is therefore
  (0 + a_hi) + a_lo over its experts in descending id order, in the dtype; the router's own contribution is
  added after, by autograd, as before (its nodes are older than this one). One accumulate with the rows
  ordered by descending expert reproduces that, provided a token's k experts are distinct (checked by `applies`);
- the gate weights' gradient is each (token, rank)'s row dot (`numba_grad.rowdot`), accumulated into zeros.
"""

from __future__ import annotations

import numpy as np
import torch

from . import native
from . import numba_grad as ng
from . import numba_ops as nb
from .exact_kernels import _back, _np32


def _round(a: np.ndarray, dtype: torch.dtype) -> np.ndarray:
    """fp32 values rounded to `dtype` and widened back: what the next exact kernel reads of a `dtype` output."""
    return a if dtype == torch.float32 else torch.from_numpy(a).to(dtype).float().numpy()


class _Plan:
    """The grouping of one routing: the (token, rank) pairs sorted by expert, stably, and each expert's segment."""

    def __init__(self, experts: torch.Tensor, n_experts: int):
        k = experts.shape[1]
        flat = experts.reshape(-1).numpy()
        # Stable: within an expert, pair order (token, then rank), which is torch.nonzero's order in the loop.
        order = np.argsort(flat, kind="stable")
        self.order = torch.from_numpy(order)
        self.inv = torch.from_numpy(np.argsort(order))  # pair p's row in the sorted order
        self.tok, self.rank = self.order // k, self.order % k
        counts = np.bincount(flat, minlength=n_experts)
        self.active = [e for e in range(n_experts) if counts[e]]
        self.starts = [0, *np.cumsum(counts[self.active]).tolist()]
        # The rows by descending expert, each expert's rows in their order: the loop's backward accumulation order.
        spans = list(zip(self.starts[:-1], self.starts[1:], strict=True))[::-1]
        self.desc = torch.from_numpy(np.concatenate([np.arange(a, b) for a, b in spans]))


def _forward(plan: _Plan, flat, weights, gates, ups, downs, wt, keep: bool):
    dt = flat.dtype
    x = _np32(flat)[plan.tok.numpy()]
    g = _round(native.matmul_grouped(x, [wt(w) for w in gates], plan.starts, False), dt)
    u = _round(native.matmul_grouped(x, [wt(w) for w in ups], plan.starts, False), dt)
    s = np.empty(g.shape, dtype=np.float32) if keep else nb.NO_ELEMS
    h = _round(nb.silu_mul(g, u, s), dt)
    y = _back(native.matmul_grouped(h, [wt(w) for w in downs], plan.starts, False), dt)
    wsel = weights.reshape(-1).index_select(0, plan.order)
    # Every (token, rank) pair has one row: the scatter is a permutation (a copy, no accumulation).
    per_rank = (y * wsel[:, None]).index_select(0, plan.inv).view(flat.shape[0], weights.shape[1], flat.shape[1])
    return per_rank, (x, g, u, s, h, y, wsel)


def _backward(plan: _Plan, saved, grad, gates, ups, downs, needs):
    x, g, u, s, h, y, wsel = saved
    dt, st, n = y.dtype, plan.starts, len(plan.active)
    gy = grad.view(-1, grad.shape[2]).index_select(0, plan.order)
    dy = _np32(gy * wsel[:, None])
    dh = _round(native.matmul_grouped(dy, [_np32(w) for w in downs], st, True), dt)
    dg, du = ng.silu_mul_bwd(g, u, s, dh)
    dg, du = _round(dg, dt), _round(du, dt)
    dws = [None] * (3 * n)
    if any(needs[2:]):
        wd = gates[0].dtype
        for j, (a, b) in enumerate(((dg, x), (du, x), (dy, h))):
            dws[j * n : (j + 1) * n] = [_back(d, wd) for d in native.matmul_tn_grouped(a, b, st)]
    dflat = dweights = None
    if needs[0]:
        dx = _back(native.matmul_grouped(du, [_np32(w) for w in ups], st, True), dt) + _back(
            native.matmul_grouped(dg, [_np32(w) for w in gates], st, True), dt
        )
        dflat = torch.zeros(grad.shape[0], grad.shape[2], dtype=dt)
        dflat.index_put_((plan.tok[plan.desc],), dx[plan.desc], accumulate=True)
    if needs[1]:
        dwsel = _back(ng.rowdot(_np32(gy), _np32(y)), wsel.dtype)
        dweights = torch.zeros(grad.shape[:2], dtype=wsel.dtype)
        dweights.index_put_((plan.tok, plan.rank), dwsel, accumulate=True)
    return dflat, dweights, *dws


class _GroupedExperts(torch.autograd.Function):
    @staticmethod
    def forward(ctx, plan, wt, flat, weights, *ws):
        n = len(plan.active)
        gates, ups, downs = ws[:n], ws[n : 2 * n], ws[2 * n :]
        per_rank, saved = _forward(plan, flat, weights, gates, ups, downs, wt, True)
        ctx.plan, ctx.saved = plan, saved
        ctx.save_for_backward(flat, weights, *ws)
        return per_rank

    @staticmethod
    def backward(ctx, grad):
        _, _, *ws = ctx.saved_tensors  # raises if an input was modified in place since the forward
        n = len(ctx.plan.active)
        grads = _backward(
            ctx.plan, ctx.saved, grad.contiguous(), ws[:n], ws[n : 2 * n], ws[2 * n :], ctx.needs_input_grad[2:]
        )
        ctx.saved = None
        return (None, None, *grads)


def applies(flat: torch.Tensor, experts: torch.Tensor) -> bool:
    """Whether the grouped call gives the loop's bits here: fp32 or bf16 activations (the dtypes its tests compare;
    float64 is the reference path's), and k distinct experts per token (a repeat would change the accumulation)."""
    if flat.dtype not in (torch.float32, torch.bfloat16):
        return False
    k = experts.shape[1]
    return not any(bool((experts[:, i] == experts[:, j]).any()) for i in range(k) for j in range(i + 1, k))


def expert_mlps(kernels, flat, weights, experts, n_experts: int, weight_of) -> torch.Tensor:
    """per_rank [T, k, D]: token t's rank-r expert's MLP output times weights[t, r], as the per-expert loop.

    `weight_of(e, name)` gives expert e's projection weight (`gate_proj`, `up_proj`, `down_proj`) in the
    compute dtype, as the loop would multiply by; it is asked only for experts that have tokens.
    """
    plan = _Plan(experts, n_experts)
    ws = [weight_of(e, name) for name in ("gate_proj", "up_proj", "down_proj") for e in plan.active]
    n = len(plan.active)
    if torch.is_grad_enabled() and any(t.requires_grad for t in (flat, weights, *ws)):
        return _GroupedExperts.apply(plan, kernels._wt, flat, weights, *ws)
    return _forward(plan, flat, weights, ws[:n], ws[n : 2 * n], ws[2 * n :], kernels._wt, False)[0]


__all__ = ["applies", "expert_mlps"]
