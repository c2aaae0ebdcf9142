"""Rounding-aligned unified precision (TRACE, arXiv 2610.07767) as a built-in remedy.

`unified_precision` (FP8-RL, arXiv 2601.18150) makes the trainer run the engine's quantized forward and
re-quantizes its weights at every forward with round-to-nearest, straight-through (STE) to the fp32
master weights. In the synchronous recompute pass that already reproduces the rollout's codewords,
since the weights are the ones the engine got at the last sync (same weights, same exact rounding).
What differs is every trainer forward whose weights are not the rollout's: the update passes after the
first optimizer step of a step (mini_batches > 1 or epochs > 1) and a stale engine (staleness=K, where
even the recompute under `stale_old=current` scores other weights). There a weight that crossed a
rounding midpoint flips to the other codeword and pi_theta moves by a whole quantization step.

TRACE's rollout records its codewords and the training side rounds each weight toward the one the
rollout used: of the two grid neighbours of the trainer's value, the rollout's codeword
(`timbench.quant.aligned`). The gradient is the STE's: the codeword is a fixed choice and the upstream
gradient reaches the master weight unchanged. What is *not* aligned here: activations (act_quant) and the
KV cache still round to nearest, as under `unified_precision` (the engine does not record per-token
activation codewords), so with act_quant the alignment covers the weights only.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..quant.aligned import OUTSIDE, check_scheme
from .base import param
from .builtin import UnifiedPrecision


@dataclass(frozen=True)
class RoundingParams:
    outside: str = param(
        "clamp",
        "a rollout codeword that is no longer a grid neighbour of the trainer's value "
        "(the weight moved past a grid point): clamp = the neighbour nearest to it, "
        "nearest = the trainer's own round-to-nearest (TRACE's description leaves "
        "this case open)",
    )

    def __post_init__(self):
        if self.outside not in OUTSIDE:
            raise ValueError(f"outside {self.outside!r} is invalid; valid: {', '.join(OUTSIDE)}")


class RoundingAligned(UnifiedPrecision):
    name = "rounding_aligned"
    doc = (
        "Rounding-aligned unified precision (TRACE, arXiv 2610.07767): the trainer runs the engine's quantized "
        "forward as unified_precision does, but each quantized weight takes, of its two grid neighbours, the "
        "codeword the rollout's weights used instead of the nearest (straight-through gradient, codeword fixed "
        "by the rollout). Identical to unified_precision where the trainer's weights are the rollout's (the "
        "synchronous recompute; one mini-batch and one epoch); differs in later update passes and under "
        "staleness. Activations and the KV cache still round to nearest. timbench/remedies/rounding.py."
    )
    Params = RoundingParams
    rollout_rounding = True

    def check_engine(self, engine):
        if engine.weight_quant != "none":
            try:
                check_scheme(engine.weight_quant)
            except ValueError as e:
                raise ValueError(f"remedy {self.name}: {e}") from None


ROUNDING_REMEDIES = (RoundingAligned,)
