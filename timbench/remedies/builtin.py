"""The built-in remedies: importance weighting, masking, sequence rejection, routing replay, precision.

Formulas and defaults as restated in shared/reference/tim-literature.md ("Remedies and defaults"),
with rho_t = exp(clamp(log pi_old - log mu, +-20)) (verl's clamp) and k1/k2/k3 as in timbench.metrics.ratios. Sequence
quantities run over a sequence's masked-in tokens. Thresholds are inclusive on the kept side: a token or sequence
exactly at a bound is kept.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..kernels.pointwise import fexp
from ..metrics.ratios import k1, k2, k3, per_token, seq_log_ratio, seq_max, seq_mean
from .base import Remedy, RemedyBatch, RemedyResult, finish, log_rho, param


def _positive(**values):
    for k, v in values.items():
        if v is not None and not v > 0:
            raise ValueError(f"{k} must be > 0, got {v}")


@dataclass(frozen=True)
class CapParams:
    C: float = param(2.0, "cap on the IS weight")

    def __post_init__(self):
        _positive(C=self.C)


@dataclass(frozen=True)
class MaskedISParams:
    C: float = param(2.0, "upper bound: rho > C is masked")
    C_min: float | None = param(None, "optional lower bound: rho < C_min is masked (off by default)")

    def __post_init__(self):
        _positive(C=self.C, C_min=self.C_min)
        if self.C_min is not None and self.C_min >= self.C:
            raise ValueError(f"C_min={self.C_min} must be < C={self.C}")


@dataclass(frozen=True)
class BandParams:
    low: float = param(0.5, "lower bound of the kept band")
    high: float = param(5.0, "upper bound of the kept band")

    def __post_init__(self):
        _positive(low=self.low, high=self.high)
        if self.low >= self.high:
            raise ValueError(f"low={self.low} must be < high={self.high}")


@dataclass(frozen=True)
class GeoParams(BandParams):
    low: float = param(0.999, "lower bound on exp(mean_t log rho)")
    high: float = param(1.001, "upper bound on exp(mean_t log rho)")


@dataclass(frozen=True)
class ThresholdParams:
    threshold: float = param(0.01, "reject a sequence whose divergence exceeds this")

    def __post_init__(self):
        _positive(threshold=self.threshold)


@dataclass(frozen=True)
class TRMMaxParams(ThresholdParams):
    threshold: float = param(0.05, "reject when max_t k2 exceeds this")


@dataclass(frozen=True)
class TRMAvgParams(ThresholdParams):
    threshold: float = param(0.001, "reject when mean_t k3 exceeds this")


_REJECT_ON = ("rho", "ppo")
_DIVERGENCES = ("k3", "k1")


@dataclass(frozen=True)
class TISSeqRSParams:
    C: float = param(2.0, "cap on the token IS weight")
    threshold: float = param(0.001, "reject a sequence whose divergence exceeds this")
    divergence: str = param("k3", "sequence divergence: k3 = mean_t (rho - 1 - log rho) or k1 = |mean_t log rho|")
    ratio: str = param(
        "rho",
        "ratio the rejection reads: rho = pi_old / mu (the correction ratio, the paper's "
        "choice) or ppo = pi_theta / pi_old in each update pass (the paper's ablation)",
    )

    def __post_init__(self):
        _positive(C=self.C, threshold=self.threshold)
        if self.divergence not in _DIVERGENCES:
            raise ValueError(f"divergence {self.divergence!r} is invalid; valid: {', '.join(_DIVERGENCES)}")
        if self.ratio not in _REJECT_ON:
            raise ValueError(f"ratio {self.ratio!r} is invalid; valid: {', '.join(_REJECT_ON)}")


def _seq_rho(batch: RemedyBatch, lr: torch.Tensor) -> torch.Tensor:
    """[N] prod_t rho_t, taken in log space and clamped at +-20 as verl."""
    return fexp(seq_log_ratio(lr, batch.mask))


def _reject(batch: RemedyBatch, rejected_seq: torch.Tensor) -> RemedyResult:
    return finish(batch, keep=per_token(~rejected_seq, batch.mask))


class NoRemedy(Remedy):
    name = "none"
    doc = "No correction: weights 1, nothing masked (the loss sees the engine's samples as on-policy)."

    def __call__(self, batch):
        return finish(batch)


class TISToken(Remedy):
    name = "tis_token"
    doc = "Token-level truncated importance sampling (Yao et al. 2025): w_t = min(rho_t, C), C = 2 (verl's default)."
    Params = CapParams

    def __call__(self, batch):
        rho = fexp(log_rho(batch))
        return finish(batch, weights=rho.clamp(max=self.params.C), truncated=rho > self.params.C)


class TISSeq(Remedy):
    name = "tis_seq"
    doc = (
        "Sequence-level truncated importance sampling (Yao et al. 2025): w_i = min(prod_t rho_t, C) on every "
        "token of sequence i, C = 2."
    )
    Params = CapParams

    def __call__(self, batch):
        rho = per_token(_seq_rho(batch, log_rho(batch)), batch.mask)
        return finish(batch, weights=rho.clamp(max=self.params.C), truncated=rho > self.params.C)


class MISToken(Remedy):
    name = "mis_token"
    doc = (
        "Token-level masked importance sampling (Liu, Li et al. 2025, 'When Speed Kills Stability'): w_t = rho_t, "
        "and token t is masked when rho_t > C (C = 2) or, if C_min is set, rho_t < C_min (off by default)."
    )
    Params = MaskedISParams

    def __call__(self, batch):
        return _weight_in_band(batch, self.params.C_min, self.params.C)


class MISSeq(Remedy):
    name = "mis_seq"
    doc = (
        "Sequence-level masked importance sampling (Liu, Li et al. 2025; TRL's default 'sequence_mask'): "
        "w_i = prod_t rho_t, and the whole sequence is masked when w_i > C (C = 2) or, if C_min is set, "
        "w_i < C_min (off by default)."
    )
    Params = MaskedISParams

    def __call__(self, batch):
        rho = _seq_rho(batch, log_rho(batch))
        keep = _in_band(rho, self.params.C_min, self.params.C)
        return finish(batch, weights=per_token(rho, batch.mask), keep=per_token(keep, batch.mask))


def _in_band(x: torch.Tensor, low: float | None, high: float) -> torch.Tensor:
    keep = x <= high
    return keep if low is None else keep & (x >= low)


def _weight_in_band(batch: RemedyBatch, low: float | None, high: float) -> RemedyResult:
    # Token MIS and IcePop: weight rho_t, mask the tokens whose rho_t leaves [low, high].
    rho = fexp(log_rho(batch))
    return finish(batch, weights=rho, keep=_in_band(rho, low, high))


class IcePop(Remedy):
    name = "icepop"
    doc = (
        "IcePop (Ring-1T report): per-token M(rho_t) = rho_t if rho_t in [alpha, beta] else 0, "
        "alpha = 0.5, beta = 5; i.e. weight rho_t and mask the tokens outside the band (about 1-2 per mille)."
    )
    Params = BandParams

    def __call__(self, batch):
        return _weight_in_band(batch, self.params.low, self.params.high)


class GeoRS(Remedy):
    name = "geo_rs"
    doc = (
        "Geometric-mean rejection (verl's geometric rollout_rs preset; Liu, Li et al. 2025): reject sequence i "
        "when exp(mean_t log rho_t) is outside [0.999, 1.001], i.e. |mean_t delta_t| > ~1e-3."
    )
    Params = GeoParams

    def __call__(self, batch):
        g = fexp(seq_mean(log_rho(batch), batch.mask))
        return _reject(batch, ~_in_band(g, self.params.low, self.params.high))


class K3RS(Remedy):
    name = "k3_rs"
    doc = "K3 rejection: reject sequence i when mean_t k3_t > 0.01, k3_t = rho_t - 1 - log rho_t."
    Params = ThresholdParams

    def __call__(self, batch):
        return _reject(batch, seq_mean(k3(log_rho(batch)), batch.mask) > self.params.threshold)


class TRMMax(Remedy):
    name = "trm_max"
    doc = (
        "Trust Region Masking, max form (arXiv 2512.23075): reject sequence i when max_t k2_t > 0.05, "
        "k2_t = 0.5 (log rho_t)^2 (the sampled-token surrogate of the per-token divergence)."
    )
    Params = TRMMaxParams

    def __call__(self, batch):
        return _reject(batch, seq_max(k2(log_rho(batch)), batch.mask) > self.params.threshold)


class TRMAvg(K3RS):
    # The same rule as k3_rs (mean_t k3 above a threshold); TRM's mean form differs only in its default.
    name = "trm_avg"
    doc = (
        "Trust Region Masking, mean form (arXiv 2512.23075): reject sequence i when mean_t k3_t > 0.001, "
        "k3_t = rho_t - 1 - log rho_t."
    )
    Params = TRMAvgParams


class TISTokenSeqRS(Remedy):
    name = "tis_token+seq_rs"
    doc = (
        "The seed paper's best remedy (arXiv 2605.14220): token TIS w_t = min(rho_t, C), C = 2, plus rejection "
        "of sequence i when its divergence on the correction ratio exceeds 0.001. The paper rejects on a "
        "sequence divergence of rho (not of the PPO ratio) and finds K1 and K3 equally good; the default is "
        "K3 = mean_t (rho_t - 1 - log rho_t), divergence=k1 uses |mean_t log rho_t|. ratio=ppo moves the "
        "rejection onto the PPO ratio pi_theta / pi_old, re-evaluated in every update pass (the paper's ablation; "
        "token TIS still reads rho)."
    )
    Params = TISSeqRSParams

    def _accept(self, log_r: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """[N, T] keep-mask: sequences whose divergence of the ratio exp(log_r) is within the threshold."""
        div = seq_mean(k3(log_r), mask) if self.params.divergence == "k3" else seq_mean(k1(log_r), mask).abs()
        return per_token(div <= self.params.threshold, mask)

    def __call__(self, batch):
        lr = log_rho(batch)
        rho = fexp(lr)
        keep = self._accept(lr, batch.mask) if self.params.ratio == "rho" else None
        return finish(batch, weights=rho.clamp(max=self.params.C), truncated=rho > self.params.C, keep=keep)

    def update_keep(self, log_r, mask):
        # ratio=ppo: the same criterion on pi_theta / pi_old, re-evaluated in every update pass.
        return self._accept(log_r.double(), mask.bool()) if self.params.ratio == "ppo" else None


class RoutingReplayR2(Remedy):
    name = "routing_replay_r2"
    doc = (
        "Routing replay R2 (arXiv 2512.01374): the update passes reuse the binary top-k expert choice the "
        "trainer made in its own old-logprob recompute pass; gate weights still come from the live router, so "
        "it gets gradients. No-op on dense models."
    )
    replay = "old"

    def __call__(self, batch):
        return finish(batch)


class RoutingReplayR3(Remedy):
    name = "routing_replay_r3"
    doc = (
        "Rollout routing replay R3 (arXiv 2510.11370; 2512.01374): the trainer uses the engine's top-k expert "
        "choice in the recompute pass and in the update passes; gate weights still come from the trainer's "
        "router. No-op on dense models."
    )
    replay = "engine"

    def __call__(self, batch):
        return finish(batch)


class FP16(Remedy):
    name = "fp16"
    doc = (
        "FP16 precision (arXiv 2510.26788): run engine and trainer in fp16 (10 mantissa bits vs bf16's 7); "
        "reported ~24x lower train-inference KL. Both sides' dtype is overridden; the twin stays fp32."
    )
    engine_override = {"dtype": "fp16"}
    trainer_override = {"dtype": "fp16"}

    def __call__(self, batch):
        return finish(batch)


class UnifiedPrecision(Remedy):
    name = "unified_precision"
    doc = (
        "Unified precision (FP8-RL, arXiv 2601.18150, 'end-to-end FP8'; the 4-bit analogue for mxfp4/nvfp4/int4): "
        "the trainer runs the engine's own quantized forward (its dtype, logits_dtype, weight_quant and act_quant), "
        "with straight-through gradients to the full-precision master weights, so the recompute matches the "
        "rollout bitwise again under exact kernels. The KV cache format is engine-only and stays a mismatch. "
        "The twin stays fp32."
    )
    trainer_follows_engine = ("dtype", "logits_dtype", "weight_quant", "act_quant")

    def __call__(self, batch):
        return finish(batch)


BUILTINS: tuple[type[Remedy], ...] = (
    NoRemedy,
    TISToken,
    TISSeq,
    MISToken,
    MISSeq,
    IcePop,
    GeoRS,
    K3RS,
    TRMMax,
    TRMAvg,
    TISTokenSeqRS,
    RoutingReplayR2,
    RoutingReplayR3,
    FP16,
    UnifiedPrecision,
)
