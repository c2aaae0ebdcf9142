"""RL algorithms on outcome rewards: advantage estimators, policy losses, loss aggregation, one registry.

Pure functions of tensors. Rewards are one scalar per sequence, `rewards[N]` with N = B * G and each
prompt's G samples contiguous. Advantages come back per sequence, [N]; the losses broadcast them over
tokens (a [N, T] advantage works as well). Logprob tensors (`logprobs` pi_theta, `old_logprobs` pi_old,
`ref_logprobs` pi_ref; names and the +-20 log-ratio clamp from timbench.metrics.ratios) are [N, T] with a response
`mask` that a remedy may have zeroed further; remedy `weights` (e.g. truncated IS weights) multiply the per-token
loss and are detached. Formulas and defaults follow verl `verl/trainer/ppo/core_algos.py`
(compute_grpo_outcome_advantage, compute_policy_loss_vanilla, compute_policy_loss_gspo, agg_loss,
kl_penalty); departures are named in the docstrings. Every sum and mean that reaches a loss, an advantage or a
metric is fixed-order (timbench.kernels.reduce), so gradients and logged values have the same bits on every CPU.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..kernels.pointwise import fexp, fsqrt
from ..kernels.reduce import fmean, fstd, fsum
from ..metrics.ratios import k1, k2, k3, log_ratio, masked_mean, masked_sum, select, seq_mean
from ..util.registry import Registry

_GSPO_CLAMP = 10.0  # verl's GSPO clamps the combined log-ratio at +10 only (timbench.metrics.ratios clamps at +-20)

Metrics = dict[str, float]


# ---------------------------------------------------------------- advantages (rewards[N] -> adv[N])


def _groups(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    if rewards.dim() != 1 or group_size < 1 or rewards.numel() % group_size:
        raise ValueError(
            f"rewards must be 1-D with a length divisible by group_size={group_size}; got shape {tuple(rewards.shape)}"
        )
    r = rewards.detach()
    return (r if r.is_floating_point() else r.to(torch.get_default_dtype())).reshape(-1, group_size)


def grpo_advantage(rewards: torch.Tensor, group_size: int, eps: float = 1e-6) -> torch.Tensor:
    """GRPO: A_i = (r_i - mean_g) / (std_g + eps), eps = 1e-6.

    std_g is unbiased (divides by G - 1, torch.std's default, here the fixed-order fstd), as verl's
    compute_grpo_outcome_advantage; a group of one gets mean 0 and std 1, also as verl (so A = r / (1 + eps)). All-equal
    groups give 0.
    """
    g = _groups(rewards, group_size)
    mean = fmean(g, 1, keepdim=True) if group_size > 1 else torch.zeros_like(g)
    std = fstd(g, 1, keepdim=True) if group_size > 1 else torch.ones_like(g)
    return ((g - mean) / (std + eps)).reshape(-1)


def drgrpo_advantage(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """Dr.GRPO (arXiv 2503.20783): A_i = r_i - mean_g, no std scaling (verl norm_adv_by_std_in_grpo=False)."""
    g = _groups(rewards, group_size)
    mean = fmean(g, 1, keepdim=True) if group_size > 1 else torch.zeros_like(g)
    return (g - mean).reshape(-1)


def rloo_advantage(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """RLOO (arXiv 2402.14740): A_i = r_i - mean_{j != i} r_j = G/(G-1) (r_i - mean_g); G = 1 gives r_i (verl)."""
    g = _groups(rewards, group_size)
    if group_size == 1:
        return g.reshape(-1).clone()
    return ((g - fmean(g, 1, keepdim=True)) * group_size / (group_size - 1)).reshape(-1)


def reinforce_advantage(rewards: torch.Tensor, group_size: int = 1) -> torch.Tensor:
    """Plain REINFORCE with a batch-mean baseline: A_i = r_i - mean_batch(r).

    group_size is only checked (a uniform signature); the baseline ignores groups.
    """
    r = _groups(rewards, group_size).reshape(-1)
    return r - fmean(r)


def reinforce_pp_advantage(
    rewards: torch.Tensor, group_size: int = 1, lengths: torch.Tensor | None = None
) -> torch.Tensor:
    """REINFORCE++ (arXiv 2501.03262) on outcome rewards: batch whitening A_i = (r_i - m) / sqrt(v + 1e-8).

    verl's compute_reinforce_plus_plus_outcome_advantage (gamma = 1) broadcasts r_i to every token and
    masked-whitens the [N, T] tensor, so m and v are token-weighted: m = sum L_i r_i / sum L_i,
    v = sum L_i (r_i - m)^2 / (sum L_i - 1) (Bessel-corrected). Pass `lengths` L[N] (response token
    counts) to reproduce that exactly; the default weights every sequence once.
    """
    r = _groups(rewards, group_size).reshape(-1)
    w = torch.ones_like(r) if lengths is None else lengths.detach().to(r.dtype)
    n = fsum(w)
    m = fsum(w * r) / n.clamp(min=1e-12)
    v = fsum(w * (r - m) ** 2) / (n - 1).clamp(min=1)
    return (r - m) * (1 / fsqrt(v + 1e-8))  # ATen's rsqrt, 1 / sqrt, with the IEEE sqrt


def dynamic_sampling_mask(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """DAPO dynamic sampling (arXiv 2503.14476): bool[N], False for every sequence of a group whose
    rewards are all equal (zero advantage, no gradient), True otherwise."""
    g = _groups(rewards, group_size)
    keep = g.amax(1) != g.amin(1)
    return keep.repeat_interleave(group_size)


# ---------------------------------------------------------------- loss aggregation


def _over_seqs(seq_vals: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    # Sequences the mask empties entirely (rejected by a remedy, dropped by dynamic sampling) leave the
    # sequence mean just as masked tokens leave token-mean: zeroing a mask row == removing that row.
    return masked_mean(seq_vals, m.any(-1))


AGGREGATIONS: Registry[Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor]] = Registry(
    "loss aggregation",
    {
        "token-mean": lambda L, m, c: masked_mean(L, m),
        "seq-mean-token-sum": lambda L, m, c: _over_seqs(masked_sum(L, m, -1), m),
        "seq-mean-token-mean": lambda L, m, c: _over_seqs(seq_mean(L, m), m),
        "seq-mean-token-sum-norm": lambda L, m, c: _over_seqs(masked_sum(L, m, -1) / c, m),
    },
)


def agg_loss(
    loss_mat: torch.Tensor, mask: torch.Tensor, agg: str = "token-mean", norm_const: float | None = None
) -> torch.Tensor:
    """Aggregate a per-token loss [N, T] to a scalar (verl agg_loss names).

    token-mean:              sum_{i,t} m L / sum_{i,t} m                 (DAPO / verl default)
    seq-mean-token-mean:     mean_i [ sum_t m L / sum_t m ]               (original GRPO)
    seq-mean-token-sum:      mean_i [ sum_t m L ]
    seq-mean-token-sum-norm: mean_i [ sum_t m L / norm_const ]            (Dr.GRPO; norm_const default T)
    The sequence means run over sequences with at least one unmasked token. Departure: for
    seq-mean-token-sum-norm verl divides sum_{i,t} by T without the 1/N (a batch-size-dependent scale);
    this follows the Dr.GRPO paper and TRL's dr_grpo, which divide by N * max_len.
    """
    fn = AGGREGATIONS.lookup(agg)
    return fn(loss_mat, mask.bool(), float(norm_const if norm_const is not None else mask.shape[-1]))


# ---------------------------------------------------------------- policy losses


def _per_token(adv: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    adv = adv.detach().to(like.dtype)
    return adv[:, None] if adv.dim() == 1 else adv


def check_clip_ratio_c(clip_ratio_c: float | None) -> None:
    """None (dual-clip off) or a finite number > 1 (verl asserts clip_ratio_c > 1.0); else a one-line ValueError."""
    if clip_ratio_c is not None and not 1 < clip_ratio_c < math.inf:
        raise ValueError(
            f"clip_ratio_c: {clip_ratio_c!r} is out of range; valid: None (dual-clip off) or a finite "
            "number > 1 (verl's default 3.0)"
        )


def _dual_clip(loss_mat, adv, clip_ratio_c):
    """verl's dual-clip (arXiv 1912.09729): for A < 0, min(-A c, L), so a ratio >> 1 costs at most -A c (no gradient
    past it); A >= 0 tokens keep L. Returns the loss and the mask of the tokens it bounded (pg_clipfrac_lower)."""
    loss3 = -adv * clip_ratio_c
    neg = adv < 0
    return torch.where(neg, torch.minimum(loss3, loss_mat), loss_mat), (loss_mat > loss3) & neg


def _surrogate(ratio, adv, mask, eps_low, eps_high, agg, weights, norm_const, log_r, clip_ratio_c=None):
    """max(-A r, -A clip(r, 1 - eps_low, 1 + eps_high)), dual-clipped when clip_ratio_c is set, times remedy
    weights, aggregated; plus metrics."""
    loss1 = -adv * ratio
    loss2 = -adv * ratio.clamp(1 - eps_low, 1 + eps_high)
    loss_mat = torch.maximum(loss1, loss2)
    lower = None
    if clip_ratio_c is not None:  # off: the exact ops (and bits) of the loss before dual-clip existed
        loss_mat, lower = _dual_clip(loss_mat, adv, clip_ratio_c)
    if weights is not None:
        loss_mat = loss_mat * select(weights.detach().to(loss_mat.dtype), mask.bool())
    loss = agg_loss(loss_mat, mask, agg, norm_const)
    with torch.no_grad():
        m = mask.bool()
        clipped = (loss2 > loss1).to(ratio.dtype)
        r = ratio[m]
        metrics = {
            "actor/pg_loss": float(loss),
            "actor/pg_clipfrac": float(masked_mean(clipped, m)),
            "actor/pg_clipfrac_high": float(masked_mean(clipped * (adv > 0), m)),  # r > 1 + eps_high, A > 0
            "actor/pg_clipfrac_low": float(masked_mean(clipped * (adv < 0), m)),  # r < 1 - eps_low, A < 0
            "actor/ppo_kl": float(masked_mean(k1(log_r), m)),  # mean(old_logprobs - logprobs)
            "actor/ratio_mean": float(fmean(r)) if r.numel() else 1.0,
            "actor/ratio_max": float(r.max()) if r.numel() else 1.0,
            "actor/ratio_min": float(r.min()) if r.numel() else 1.0,
        }
        if lower is not None:  # logged only when dual-clip is on, so runs without it log what they always did
            metrics["actor/pg_clipfrac_lower"] = float(masked_mean(lower.to(ratio.dtype), m))
    return loss, metrics


def ppo_clip_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    adv: torch.Tensor,
    mask: torch.Tensor,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    agg: str = "token-mean",
    weights: torch.Tensor | None = None,
    norm_const: float | None = None,
    clip_ratio_c: float | None = None,
) -> tuple[torch.Tensor, Metrics]:
    """PPO clipped surrogate (verl compute_policy_loss_vanilla; its dual-clip only when clip_ratio_c is set).

    r_t = exp(log_ratio(logprobs, old_logprobs)) (clamped at +-20);
    L_t = max(-A r_t, -A clip(r_t, 1 - eps_low, 1 + eps_high)); with dual-clip c (verl clip_ratio_c, > 1)
    L_t = min(-A c, L_t) where A < 0 (verl pg_losses3 / clip_pg_losses2); then L_t *= w_t; loss = agg(L, mask).
    Defaults eps 0.2 / 0.2, token-mean, no dual-clip (verl's default is c = 3.0; timbench's is off, so every run
    without it computes what it always did); DAPO clip-higher uses eps_high 0.28. `weights` [N, T] are
    detached remedy multipliers (verl multiplies pg_losses by rollout_is_weights the same way).
    Metrics: actor/pg_clipfrac (+ _high / _low by side), actor/ppo_kl = mean(old_logprobs - logprobs),
    actor/ratio_{mean,max,min}, actor/pg_loss; with dual-clip also actor/pg_clipfrac_lower (verl: tokens with
    A < 0 whose clipped loss exceeds -A c); all over the (remedy-zeroed) mask.
    """
    check_clip_ratio_c(clip_ratio_c)
    log_r = select(log_ratio(logprobs, old_logprobs), mask.bool())  # padding (even NaN) never reaches a gradient
    return _surrogate(
        fexp(log_r),
        _per_token(adv, logprobs),
        mask,
        eps_low,
        eps_high,
        agg,
        weights,
        norm_const,
        log_r.detach(),
        clip_ratio_c,
    )


def gspo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    adv: torch.Tensor,
    mask: torch.Tensor,
    eps_low: float = 3e-4,
    eps_high: float = 4e-4,
    agg: str = "seq-mean-token-mean",
    weights: torch.Tensor | None = None,
    norm_const: float | None = None,
) -> tuple[torch.Tensor, Metrics]:
    """GSPO (arXiv 2507.18071), token-level form as verl compute_policy_loss_gspo.

    s_i = exp(mean_t (logprobs - old_logprobs)) over the sequence's unmasked tokens;
    s_{i,t} = sg[s_i] * pi_theta(y_t) / sg[pi_theta(y_t)], i.e. log s_{i,t} = sg[log s_i] + logprobs - sg[logprobs],
    clamped at +10 (verl). Forward value s_{i,t} = s_i; the gradient is s_i * grad logp_t. Then the
    same clipped surrogate as PPO with eps 3e-4 / 4e-4 and seq-mean-token-mean aggregation.
    Ratio metrics are token-weighted over the per-token copies of s_i.
    """
    m = mask.bool()
    logprobs, old_logprobs = select(logprobs, m), select(old_logprobs, m)  # padding (even NaN) never reaches a gradient
    log_s = seq_mean(logprobs - old_logprobs, m)  # unclamped inside the sequence mean, as verl
    log_sit = (logprobs - logprobs.detach() + log_s.detach()[:, None]).clamp(max=_GSPO_CLAMP)
    return _surrogate(
        fexp(log_sit),
        _per_token(adv, logprobs),
        mask,
        eps_low,
        eps_high,
        agg,
        weights,
        norm_const,
        log_ratio(logprobs.detach(), old_logprobs.detach()),
    )


# ---------------------------------------------------------------- KL to a reference policy (off by default)


def _k3(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    return k3(log_ratio(ref_logprobs, logprobs)).clamp(-10, 10)  # verl bounds low_var_kl at +-10


# Each estimator is ratios' k1 / k2 / k3 of log r = ref_logprobs - logprobs (r = pi_ref / pi_theta).
KL_ESTIMATORS: Registry[Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = Registry(
    "KL estimator",
    {
        "k1": lambda lp, ref: k1(ref - lp),
        "abs": lambda lp, ref: k1(ref - lp).abs(),
        "k2": lambda lp, ref: k2(ref - lp),
        "k3": _k3,
    },
    aliases={"kl": "k1", "mse": "k2", "low_var_kl": "k3"},  # verl's names
)


def kl_penalty(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, kind: str = "low_var_kl") -> torch.Tensor:
    """Per-token KL(pi_theta || pi_ref) estimate (Schulman 2020; verl kl_penalty), [N, T]; aggregate with agg_loss.

    k1 = logprobs - ref_logprobs; abs = |k1|; k2 (mse) = 0.5 k1^2;
    k3 (low_var_kl) = exp(ref_logprobs - logprobs) - (ref_logprobs - logprobs) - 1, log-ratio clamped +-20,
    result +-10.
    """
    return KL_ESTIMATORS.lookup(kind)(logprobs, ref_logprobs)


# ---------------------------------------------------------------- registry


@dataclass(frozen=True)
class Algorithm:
    """One RL algorithm: advantage(rewards, group_size) -> adv[N]; loss(logprobs, old_logprobs, adv, mask,
    **loss_kwargs)."""

    name: str
    advantage: Callable[..., torch.Tensor]
    loss: Callable[..., tuple[torch.Tensor, Metrics]]
    eps_low: float = 0.2
    eps_high: float = 0.2
    agg: str = "token-mean"
    dynamic_sampling: bool = False  # drop groups with all-equal rewards (dynamic_sampling_mask)
    doc: str = ""

    @property
    def dual_clip(self) -> bool:
        """Whether the loss takes verl's dual-clip (RunConfig.clip_ratio_c): the PPO-clip losses do, GSPO not."""
        return self.loss is ppo_clip_loss

    @property
    def loss_kwargs(self) -> dict:
        return {"eps_low": self.eps_low, "eps_high": self.eps_high, "agg": self.agg}


ALGORITHMS: Registry[Algorithm] = Registry(
    "algorithm",
    {
        a.name: a
        for a in [
            Algorithm(
                "grpo",
                grpo_advantage,
                ppo_clip_loss,
                doc="GRPO (arXiv 2402.03300): group-normalised advantage, PPO clip 0.2; token-mean as verl's "
                "default (the paper's seq-mean-token-mean is one agg= away)",
            ),
            Algorithm(
                "dapo",
                grpo_advantage,
                ppo_clip_loss,
                eps_high=0.28,
                dynamic_sampling=True,
                doc="DAPO (arXiv 2503.14476): clip-higher 0.2/0.28, token-level loss, dynamic sampling",
            ),
            Algorithm(
                "drgrpo",
                drgrpo_advantage,
                ppo_clip_loss,
                agg="seq-mean-token-sum-norm",
                doc="Dr.GRPO (arXiv 2503.20783): no std in the advantage, constant length normaliser",
            ),
            Algorithm(
                "rloo", rloo_advantage, ppo_clip_loss, doc="RLOO (arXiv 2402.14740): leave-one-out group baseline"
            ),
            Algorithm(
                "reinforce",
                reinforce_advantage,
                ppo_clip_loss,
                doc="REINFORCE with a batch-mean baseline; with one update per batch r = 1 and the "
                "clipped loss's gradient is -A grad logp",
            ),
            Algorithm(
                "reinforce_pp",
                reinforce_pp_advantage,
                ppo_clip_loss,
                doc="REINFORCE++ (arXiv 2501.03262): batch-whitened outcome reward, PPO clip 0.2",
            ),
            Algorithm(
                "gspo",
                grpo_advantage,
                gspo_loss,
                eps_low=3e-4,
                eps_high=4e-4,
                agg="seq-mean-token-mean",
                doc="GSPO (arXiv 2507.18071): sequence-level geometric-mean ratio, clip 3e-4/4e-4",
            ),
        ]
    },
)


def get_algorithm(name: str) -> Algorithm:
    """The registered Algorithm called `name`; ValueError listing the valid names otherwise."""
    return ALGORITHMS.lookup(name)
