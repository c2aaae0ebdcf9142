"""Fixed-order AdamW and gradient-norm clipping: an update whose bits no CPU or thread count can change.

`torch.optim.AdamW` on CPU runs ATen's vectorised `lerp_`, `addcmul_` and
`addcdiv_`, whose SIMD bodies fuse mul+add (FMA) while their scalar tails do
not, and whose SIMD width (and so which elements land in a tail) depends on the
CPU; `clip_grad_norm_` sums squares with a CPU-dependent order. Here the AdamW
update is a numba elementwise loop without fastmath (no FMA contraction, each
element the same IEEE fp32 operations in the same order on every machine), and
the global norm is a float64 left-to-right sum (`timbench.kernels.reduce`) and an
IEEE square root (`fsqrt`: torch.sqrt runs MKL's vendor-dispatched VML).

The update formula and hyper-parameters are torch's AdamW (decoupled weight
decay, bias correction, its defaults), in torch's operation order:
    p = p * (1 - lr*wd);  m = m + (1-b1) * (g - m)   (lerp; the other lerp branch when 1-b1 >= 0.5)
    v = v*b2 + ((1-b2)*g)*g;  p = p + (-lr/bc1 * m) / (sqrt(v)/sqrt(bc2) + eps)
with bc = 1 - beta**step in float64. Only beta**step differs in how it is
computed: by repeated squaring (IEEE products) rather than libm `pow`, whose
glibc build is chosen per CPU (ifunc). The state (`step`, `exp_avg`,
`exp_avg_sq`) has torch's layout, so `state_dict` saves and loads the same way.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np
import torch
from numba import njit, prange

from ..kernels.pointwise import fsqrt
from ..kernels.reduce import fsum


@njit(parallel=True, cache=True, fastmath=False, error_model="numpy", nogil=True)
def _adamw(p, g, m, v, decay, w1, lerp_low, b2, w2, step_size, bc2_sqrt, eps):
    """One AdamW step in place on flat fp32 arrays; all constants fp32 (as ATen casts its scalars)."""
    one = np.float32(1.0)
    for i in prange(p.shape[0]):
        gi = g[i]
        pi = p[i] * decay
        mi = m[i]
        if lerp_low:  # ATen lerp: weight < 0.5 -> self + w * (end - self), else end - (end - self) * (1 - w)
            mi = mi + w1 * (gi - mi)
        else:
            mi = gi - (gi - mi) * (one - w1)
        vi = v[i] * b2
        vi = vi + (w2 * gi) * gi
        denom = np.float32(math.sqrt(vi)) / bc2_sqrt + eps
        p[i] = pi + (step_size * mi) / denom
        m[i] = mi
        v[i] = vi


def _pow(x: float, n: int) -> float:
    """x ** n for an integer n >= 0 by repeated squaring: IEEE double products only."""
    out, base = 1.0, x
    while n:
        if n & 1:
            out *= base
        base *= base
        n >>= 1
    return out


def _flat(t: torch.Tensor) -> np.ndarray:
    return t.detach().view(-1).numpy()


class AdamW(torch.optim.Optimizer):
    """torch.optim.AdamW (amsgrad=False, maximize=False) computed in fixed order; fp32 parameters only."""

    def __init__(
        self,
        params: Iterable,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
    ):
        if not lr >= 0:
            raise ValueError(f"invalid lr {lr}; must be >= 0")
        if not eps >= 0:
            raise ValueError(f"invalid eps {eps}; must be >= 0")
        if len(betas) != 2 or not all(0 <= b < 1 for b in betas):
            raise ValueError(f"invalid betas {betas}; need two values in [0, 1)")
        if not weight_decay >= 0:
            raise ValueError(f"invalid weight_decay {weight_decay}; must be >= 0")
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        f32 = np.float32
        for group in self.param_groups:
            lr, (b1, b2), eps, wd = float(group["lr"]), group["betas"], group["eps"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.dtype != torch.float32 or p.grad.is_sparse or not p.is_contiguous():
                    raise ValueError(f"fixed-order AdamW needs dense contiguous float32 parameters; got {p.dtype}")
                state = self.state[p]
                if not state:
                    state["step"] = torch.tensor(0.0, dtype=torch.float32)
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.contiguous_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.contiguous_format)
                state["step"] += 1
                step = int(state["step"].item())
                bc1 = 1 - _pow(b1, step)
                bc2 = 1 - _pow(b2, step)
                grad = p.grad.detach().to(torch.float32).contiguous()
                _adamw(
                    _flat(p),
                    _flat(grad),
                    _flat(state["exp_avg"]),
                    _flat(state["exp_avg_sq"]),
                    f32(1 - lr * wd),
                    f32(1 - b1),
                    (1 - b1) < 0.5,
                    f32(b2),
                    f32(1 - b2),
                    f32(-(lr / bc1)),
                    f32(math.sqrt(bc2)),
                    f32(eps),
                )
                # Written through numpy: tell autograd and weight caches the tensors changed.
                for t in (p, state["exp_avg"], state["exp_avg_sq"]):
                    torch.autograd.graph.increment_version(t)
        return loss


def clip_grad_norm(params: Iterable[torch.Tensor], max_norm: float) -> torch.Tensor:
    """torch.nn.utils.clip_grad_norm_ (L2, error_if_nonfinite=False) with a fixed-order norm.

    total_norm = sqrt(sum of all squared gradient entries), summed in float64 left to right over
    the parameters in order (fp32 squares are exact in float64), rounded to fp32; then, as torch,
    every gradient is multiplied by min(max_norm / (total_norm + 1e-6), 1) in fp32 (by exactly 1.0 when
    max_norm is inf: no clipping). Returns total_norm.
    """
    if not (isinstance(max_norm, (int, float)) and max_norm > 0):
        raise ValueError(f"grad_clip must be a number > 0 (inf = no clipping), got {max_norm!r}")
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return torch.tensor(0.0)
    with torch.no_grad():
        sq = torch.cat([g.detach().reshape(-1).to(torch.float64) for g in grads])
        total = fsqrt(fsum(sq * sq)).to(torch.float32)  # torch.sqrt is MKL VML: not IEEE, CPU-dependent
        coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
        for g in grads:
            g.mul_(coef.to(g.dtype))
    return total


__all__ = ["AdamW", "clip_grad_norm"]
