"""Direction-aware correction: a TRIAGE-style segment gate (arXiv 2610.07043) as a built-in remedy.

TRIAGE (native NVFP4 RL) observes that the mismatch delta_t = log pi_old - log mu
does its damage through the updates with A < 0 and delta < 0, which become
imbalanced before a collapse, and that the deep-tail tokens cluster in a few
response segments. Its remedy, restated from the paper's description (the
exact constants are not in `../shared/reference/tim-literature.md`; the ones
below are ours, each tied to a quantity timbench already uses):

  * responses are cut into segments of L tokens (L = 64, TRIAGE's length);
  * each segment s of a response with A < 0 gets a gate from its mean shift
    m_s = mean delta_t and its deep-tail fraction f_s = share of tokens with
    |delta_t| > tau:   g_s = clamp(1 - f_s / f_max, 0, 1) * exp(-max(0, -m_s) / s0)
    (tau = log 2: rho outside [1/2, 2], TIS's cap and `mismatch/extreme_frac_2`;
    f_max = 0.5: a segment half in the deep tail is shut; s0 = 0.1: a segment mean
    shift of -0.1 nats, ~10x a bf16 engine's mean |delta| on tiny-dense (0.011,
    results/align/align_mma.md), scales the gate by 1/e);
  * the gate multiplies only the delta < 0 tokens of A < 0 responses, and each
    such response's weights are rescaled to keep its update mass (sum of weights
    = its token count), so gating redistributes, never silently shrinks, the
    negative-advantage push;
  * A > 0 tokens get a bounded pseudo-Huber repair w_t = 1 / sqrt(1 + (delta_t / c)^2),
    c = log 2 (the influence function of the pseudo-Huber loss: ~1 for small
    mismatch, ~c / |delta| for severe; always in (0, 1]).

All reductions are fixed-order (`timbench.kernels.reduce`) and the square root is
the IEEE one (`fsqrt`), so the weights are the same bits on every CPU.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..kernels.pointwise import fexp, fsqrt
from ..kernels.reduce import fsum, masked_sum
from .base import Remedy, RemedyBatch, finish, log_rho, param


@dataclass(frozen=True)
class TriageParams:
    segment: int = param(64, "segment length L in tokens (TRIAGE's 64)")
    tail: float = param(math.log(2.0), "deep-tail threshold tau on |delta| (log 2: rho outside [1/2, 2])")
    f_max: float = param(0.5, "deep-tail fraction at which a segment's gate closes")
    shift_scale: float = param(0.1, "s0: a segment mean shift of -s0 nats scales its gate by 1/e")
    huber_c: float = param(math.log(2.0), "c of the pseudo-Huber repair on A > 0 tokens")

    def __post_init__(self):
        if not (isinstance(self.segment, int) and self.segment >= 1):
            raise ValueError(f"segment must be an integer >= 1, got {self.segment!r}")
        for k in ("tail", "f_max", "shift_scale", "huber_c"):
            if not getattr(self, k) > 0:
                raise ValueError(f"{k} must be > 0, got {getattr(self, k)}")


def segment_gates(delta: torch.Tensor, mask: torch.Tensor, p: TriageParams) -> torch.Tensor:
    """[N, T] the gate g_s of the segment each token is in (float64; 1.0 where a segment has no token)."""
    n, t = delta.shape
    pad = (-t) % p.segment
    d = F.pad(delta, (0, pad)).reshape(n, -1, p.segment)
    m = F.pad(mask, (0, pad)).reshape(n, -1, p.segment)
    count = fsum(m.double(), -1).clamp(min=1)
    shift = masked_sum(d, m, -1) / count
    frac = fsum((m & (d.abs() > p.tail)).double(), -1) / count
    gate = (1 - frac / p.f_max).clamp(0, 1) * fexp(-(-shift).clamp(min=0) / p.shift_scale)
    return gate[:, :, None].expand(-1, -1, p.segment).reshape(n, -1)[:, :t]


def triage_weights(delta: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor, p: TriageParams):
    """(weights [N, T] float64, lowered [N, T] bool: the delta < 0 tokens of A < 0 responses whose gate < 1,
    gated [N, T] bool: all the delta < 0 tokens of A < 0 responses)."""
    neg = (adv < 0)[:, None] & mask
    gated = neg & (delta < 0)
    gates = segment_gates(delta, mask, p)
    w = torch.where(gated, gates, torch.ones_like(delta))
    # Keep each A < 0 response's update mass: sum of its weights = its token count (unless all gated to 0).
    total, count = masked_sum(w, mask, -1), fsum(mask.double(), -1)
    scale = torch.where((adv < 0) & (total > 0), count / total.clamp(min=1e-300), torch.ones_like(total))
    w = w * scale[:, None]
    pos = (adv > 0)[:, None] & mask
    huber = 1 / fsqrt(1 + (delta / p.huber_c) ** 2)
    return torch.where(pos, huber, w), gated & (gates < 1), gated


class TriageGate(Remedy):
    name = "triage_gate"
    doc = (
        "TRIAGE-style direction-aware gate (arXiv 2610.07043): 64-token segments; on A < 0 responses the "
        "delta < 0 tokens are scaled by their segment's gate clamp(1 - f/0.5, 0, 1) * exp(-max(0, -mean delta)"
        " / 0.1) (f: share of |delta| > log 2) with the response's update mass renormalised; A > 0 tokens get "
        "the pseudo-Huber weight 1/sqrt(1 + (delta / log 2)^2). Constants: timbench/remedies/direction.py."
    )
    Params = TriageParams

    def __call__(self, batch: RemedyBatch):
        delta = log_rho(batch)
        # Only the shared metrics: at zero mismatch the run must be byte-identical to `none` (tested).
        w, _, _ = triage_weights(delta, batch.advantages.double(), batch.mask, self.params)
        return finish(batch, weights=w)


DIRECTION_REMEDIES: tuple[type[Remedy], ...] = (TriageGate,)
