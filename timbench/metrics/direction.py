"""Direction-aware mismatch metrics: where the update's mismatch sits by sign of advantage and delta, and how
the |delta| tail clusters into response segments (TRIAGE, arXiv 2610.07043).

TRIAGE splits each token's mismatch delta_t = log pi_old - log mu by its interaction with the policy-gradient
direction (the sign of the advantage A of its response): in native NVFP4 RL the (A < 0, delta < 0) updates
become imbalanced before a collapse (their precursor rose 1.02 -> 2.32), and the deep-tail tokens cluster in a
few 64-token response segments. timbench logs both every step so the collapse analysis can test them as early
warnings (`timbench early-warning`):

  tim/quadrant_mass/{pos,neg}_adv_{pos,neg}_delta  share of the batch's update-weighted mismatch
      sum_t |A_i| |delta_t| in each sign quadrant (the four sum to 1; all 0 at zero mismatch);
  tim/neg_adv_imbalance  mass(A < 0, delta < 0) / mass(A < 0, delta > 0): TRIAGE's precursor, 1 when balanced
      (and, by convention, when both are 0; capped at IMBALANCE_CAP when only the denominator is 0);
  tim/pos_adv_imbalance  the same ratio for A > 0 responses (the control: TRIAGE reports no imbalance there);
  tim/tail_seg_concentration  the share of the batch's |delta| tail (tokens with |delta| > 0 at or above the
      batch's 99th percentile of |delta|) that lies in the worst tenth of the 64-token segments (ranked by tail
      count): 1.0 means the tail sits in a few segments; 0 at zero mismatch (no tail).

Pure functions of the per-token tensors; every sum is fixed-order (timbench.kernels.reduce), so the logged bits
do not depend on the CPU or thread count.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..kernels.reduce import fsum

SEGMENT = 64
"""Segment length in tokens: TRIAGE's 64."""
TAIL_QUANTILE = 0.99
"""The |delta| tail is the top 1% of the batch's tokens (scale-free, so one rule serves every condition)."""
WORST_SEGMENTS = 0.1
"""The worst tenth of segments (at least one) is where the tail concentration looks."""
IMBALANCE_CAP = 1e6
"""The imbalance ratio when the balancing quadrant is empty but its partner is not (kept finite for JSON)."""

QUADRANTS = ("pos_adv_pos_delta", "pos_adv_neg_delta", "neg_adv_pos_delta", "neg_adv_neg_delta")


def _ratio(num: float, den: float) -> float:
    if den > 0:
        return num / den
    return 1.0 if num == 0 else IMBALANCE_CAP


def quadrant_metrics(delta: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """delta [N, T] (log pi_old - log mu), adv [N] response advantages, mask [N, T] bool -> the quadrant shares and
    the two imbalance ratios (module docstring)."""
    keep = mask.bool()
    a = adv.double()[:, None].expand_as(delta)
    d = torch.where(keep, delta.double(), torch.zeros((), dtype=torch.float64))  # NaN padding selected away
    w = (a.abs() * d.abs())[keep]
    a, d = a[keep], d[keep]
    parts = {
        "pos_adv_pos_delta": (a > 0) & (d > 0),
        "pos_adv_neg_delta": (a > 0) & (d < 0),
        "neg_adv_pos_delta": (a < 0) & (d > 0),
        "neg_adv_neg_delta": (a < 0) & (d < 0),
    }
    mass = {q: float(fsum(w[m])) if bool(m.any()) else 0.0 for q, m in parts.items()}
    total = sum(mass[q] for q in QUADRANTS)  # four numbers in a fixed order
    out = {f"tim/quadrant_mass/{q}": (mass[q] / total if total > 0 else 0.0) for q in QUADRANTS}
    out["tim/neg_adv_imbalance"] = _ratio(mass["neg_adv_neg_delta"], mass["neg_adv_pos_delta"])
    out["tim/pos_adv_imbalance"] = _ratio(mass["pos_adv_neg_delta"], mass["pos_adv_pos_delta"])
    return out


def tail_segment_concentration(
    delta: torch.Tensor,
    mask: torch.Tensor,
    segment: int = SEGMENT,
    quantile: float = TAIL_QUANTILE,
    worst: float = WORST_SEGMENTS,
) -> float:
    """Share of the |delta| tail inside the worst `worst` fraction of `segment`-token response segments."""
    if not (isinstance(segment, int) and segment >= 1):
        raise ValueError(f"segment must be an integer >= 1, got {segment!r}")
    if not (0 < quantile < 1 and 0 < worst <= 1):
        raise ValueError(f"quantile must be in (0, 1) and worst in (0, 1], got {quantile}, {worst}")
    keep = mask.bool()
    absd = torch.where(keep, delta.double().abs(), torch.zeros((), dtype=torch.float64))
    live = absd[keep]
    if not bool((live > 0).any()):
        return 0.0
    cut = float(torch.quantile(live, quantile))
    tail = keep & (absd >= cut) & (absd > 0)
    n, t = tail.shape
    pad = (-t) % segment
    seg_tail = F.pad(tail, (0, pad)).reshape(n, -1, segment).sum(-1).flatten()  # integer counts: exact
    seg_live = F.pad(keep, (0, pad)).reshape(n, -1, segment).any(-1).flatten()
    counts = seg_tail[seg_live]
    k = max(1, math.ceil(worst * len(counts)))
    # Sorting integer counts is exact; ties do not change the sum of the k largest.
    top = torch.sort(counts, descending=True, stable=True).values[:k]
    return int(top.sum()) / int(counts.sum())


def direction_metrics(
    old_logprobs: torch.Tensor, rollout_logprobs: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor
) -> dict[str, float]:
    """Every `tim/` direction metric of one step's batch (old_logprobs = pi_old, rollout_logprobs = mu)."""
    delta = old_logprobs.detach().double() - rollout_logprobs.detach().double()
    return quadrant_metrics(delta, advantages, mask) | {
        "tim/tail_seg_concentration": tail_segment_concentration(delta, mask)
    }
