"""Ratio maths between the policies' logprobs of the sampled tokens: one name per quantity, defined once.

Metrics (timbench.metrics.mismatch), losses (timbench.rl.algorithms), objective drift (timbench.rl.drift) and
remedies (timbench.remedies) all take their log-ratios, divergences and masked reductions from here.
Names follow verl (`verl/trainer/ppo/core_algos.py`, `rollout_corr_helper.py`), in the plural form
timbench's tensors already use:

    logprobs          [N, T] log pi_theta(y_t), the policy being updated (verl `log_prob`)
    old_logprobs      [N, T] log pi_old(y_t), the trainer's recompute before the update (verl
                      `old_log_prob`); in bypass mode the loss's old_logprobs are the rollout_logprobs
    rollout_logprobs  [N, T] log mu(y_t), the engine's logprobs the tokens were sampled with
                      (verl `rollout_log_probs`)
    ref_logprobs      [N, T] log pi_ref(y_t), the frozen reference of the KL penalty (verl `ref_log_prob`)
    mask              [N, T] bool, the response tokens that count (verl `response_mask`)
    delta             old_logprobs - rollout_logprobs, unclamped; abs_delta = |delta|, whose maximum is
                      logged as mismatch/max_abs_delta (align tables call it max_abs_diff)
    log_ratio(a, b)   clamp(a - b, -20, +20): every log-ratio is clamped before exp (verl SAFETY_BOUND)
    log_rho, rho      log_ratio(old_logprobs, rollout_logprobs) and exp of it: the rollout correction
                      ratio pi_old / mu that remedies weight or reject on (verl `rollout_is_weights`
                      before truncation); 0 (rho = 1) outside the mask
    k1, k2, k3        per-token divergence estimates of a log-ratio log r, r = p / q, estimating
                      KL(q || p) (Schulman 2020; verl rollout_rs `token_k1..k3`):
                      k1 = -log r, k2 = 0.5 (log r)^2, k3 = r - 1 - log r (>= 0)
    seq_sum / seq_mean / seq_max   masked reductions over a sequence's tokens (dim -1), the
                      `seq_sum_k*`, `seq_mean_k*`, `seq_max_k*` forms of verl's rollout_rs criteria
    seq_log_ratio     log prod_t r_t = seq_sum(log r), clamped at +-20 (verl clamps the raw sum)

Every reduction here is fixed-order (timbench.kernels.reduce: float64 left-to-right sums, the same bits
on every CPU and thread count) and masked by selection, so NaN or -inf in padded positions never
leaks into a result; an empty mask gives 0 rather than NaN.
"""

from __future__ import annotations

import math

import torch

from ..kernels.pointwise import fexp
from ..kernels.reduce import masked_mean, masked_sum  # fixed-order: the same bits on every CPU and thread count

LOG_RATIO_BOUND = 20.0
"""|log r| is clamped here before exponentiating (verl's SAFETY_BOUND): exp(20) ~ 4.9e8 stays finite in fp32."""


def log_ratio(num: torch.Tensor, den: torch.Tensor) -> torch.Tensor:
    """clamp(num - den, -20, +20): log(p / q) for logprobs num = log p, den = log q."""
    return (num - den).clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)


def select(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """x where the bool mask is True, else 0: selected, not multiplied, so NaN / -inf outside the mask never
    reach a value or a gradient (0 * NaN is NaN, and so is 0 * the gradient of exp at NaN)."""
    return torch.where(mask, x, torch.zeros((), dtype=x.dtype))


def log_rho(old_logprobs: torch.Tensor, rollout_logprobs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[N, T] float64, detached: log rho = log_ratio(old_logprobs, rollout_logprobs), 0 outside the mask."""
    return select(log_ratio(old_logprobs.detach().double(), rollout_logprobs.detach().double()), mask)


def delta(old_logprobs: torch.Tensor, rollout_logprobs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[N, T] float64, detached: old_logprobs - rollout_logprobs, unclamped, 0 outside the mask. Sequence-level
    ratios sum these raw differences and clamp the sum (verl `rollout_is=sequence`: seq_log_ratio(delta(...)));
    TRL's vLLM importance sampling exponentiates them without any clamp."""
    return select(old_logprobs.detach().double() - rollout_logprobs.detach().double(), mask)


def k1(log_r: torch.Tensor) -> torch.Tensor:
    """k1 = -log r (unbiased, can be negative)."""
    return -log_r


def k2(log_r: torch.Tensor) -> torch.Tensor:
    """k2 = 0.5 (log r)^2 (>= 0)."""
    return 0.5 * log_r.square()


def k3(log_r: torch.Tensor) -> torch.Tensor:
    """k3 = r - 1 - log r (>= 0, unbiased for KL(q || p) under q)."""
    return fexp(log_r) - 1 - log_r


def seq_sum(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[N] sum_t x over each sequence's masked-in tokens."""
    return masked_sum(x, mask, -1)


def seq_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[N] mean_t x over each sequence's masked-in tokens (0 for an empty row)."""
    return masked_mean(x, mask, -1)


def seq_max(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[N] max_t x over each sequence's masked-in tokens (-inf for an empty row)."""
    return torch.where(mask, x, torch.full_like(x, -math.inf)).amax(-1)


def seq_log_ratio(log_r: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[N] log prod_t r_t = sum_t log r_t over masked-in tokens, clamped at +-20 as verl."""
    return seq_sum(log_r, mask).clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)


def per_token(seq_values: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Broadcast a per-sequence [N] tensor over tokens [N, T]."""
    return seq_values[:, None].expand_as(like)


__all__ = [
    "LOG_RATIO_BOUND",
    "delta",
    "k1",
    "k2",
    "k3",
    "log_ratio",
    "log_rho",
    "masked_mean",
    "masked_sum",
    "per_token",
    "select",
    "seq_log_ratio",
    "seq_max",
    "seq_mean",
    "seq_sum",
]
