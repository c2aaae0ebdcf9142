"""TRL GRPO's vLLM importance sampling by its own names: `trl:token_truncate`, `trl:token_mask`,
`trl:sequence_truncate`, `trl:sequence_mask` (TRL's `vllm_importance_sampling_mode`, default sequence_mask).

As TRL's GRPOTrainer computes it (trl/trainer/grpo_trainer.py; shared/reference/tim-literature.md): the
per-token difference d_t = (log pi_old - log mu) on masked-in tokens, UNCLAMPED (TRL has no +-20 bound:
timbench.metrics.ratios.delta); sequence modes sum it, r_i = exp(sum_t d_t) on every token of sequence i; token modes
use r_t = exp(d_t). `*_truncate`: w = clamp(r, min=clip_min, max=C); `*_mask`: w = r, set to 0 where r > C
(or r < clip_min when set). A zeroed token stays in the loss with weight 0, as in TRL (it still counts in
the loss's token normalizer), so it is reported as `rollout_corr/rollout_is_oob_ratio`, not as rejection.
C = `vllm_importance_sampling_cap` = 3.0 (TRL's default; newer TRL calls it vllm_importance_sampling_clip_max),
`vllm_importance_sampling_clip_min` = None (off).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..kernels.pointwise import fexp
from ..metrics import ratios
from .base import Remedy, finish, param

TRL_MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")


@dataclass(frozen=True)
class TRLParams:
    vllm_importance_sampling_cap: float = param(3.0, "C: truncate clips the ratio at C, mask zeroes ratios above C")
    vllm_importance_sampling_clip_min: float | None = param(None, "optional lower clip (truncate) / lower mask bound")

    def __post_init__(self):
        cap, low = self.vllm_importance_sampling_cap, self.vllm_importance_sampling_clip_min
        if not cap > 0:
            raise ValueError(f"vllm_importance_sampling_cap must be > 0, got {cap}")
        if low is not None and not 0 <= low < cap:
            raise ValueError(f"vllm_importance_sampling_clip_min={low} must be in [0, cap={cap})")


class TRLImportanceSampling(Remedy):
    """Base of the four trl:<mode> remedies; `level` and `masking` are set per mode."""

    Params = TRLParams
    level = "sequence"
    masking = True

    def __call__(self, batch):
        p, mask = self.params, batch.mask
        d = ratios.delta(batch.old_logprobs, batch.rollout_logprobs, mask)
        log_r = ratios.per_token(ratios.seq_sum(d, mask), mask) if self.level == "sequence" else d
        r = torch.where(mask, fexp(log_r), torch.ones((), dtype=torch.float64))  # exp(large) is inf, as TRL's
        cap, low = p.vllm_importance_sampling_cap, p.vllm_importance_sampling_clip_min
        low_t = -math.inf if low is None else low
        out = (r > cap) | (r < low_t)
        if self.masking:
            w = torch.where(out, torch.zeros((), dtype=torch.float64), r)
        else:
            w = r.clamp(min=low, max=cap) if low is not None else r.clamp(max=cap)
        oob = float(out[mask].double().sum()) / int(mask.sum()) if bool(mask.any()) else 0.0
        return finish(batch, weights=w, truncated=r > cap, extra={"rollout_corr/rollout_is_oob_ratio": oob})


def _doc(mode: str) -> str:
    level, _, how = mode.partition("_")
    what = "w = clamp(r, clip_min, C)" if how == "truncate" else "w = r, zeroed where r > C (or < clip_min)"
    r = (
        "r_i = exp(sum_t (log pi_old - log mu)) per sequence"
        if level == "sequence"
        else "r_t = exp(log pi_old - log mu)"
    )
    return f"TRL GRPO vllm_importance_sampling_mode={mode}: {r} (unclamped), {what}; C = 3.0."


TRL_REMEDIES: dict[str, type[Remedy]] = {
    f"trl:{mode}": type(
        f"TRL_{mode}",
        (TRLImportanceSampling,),
        {
            "name": f"trl:{mode}",
            "doc": _doc(mode),
            "level": mode.partition("_")[0],
            "masking": mode.endswith("_mask"),
            "__module__": __name__,
        },
    )
    for mode in TRL_MODES
}
"""`trl:<vllm_importance_sampling_mode>` -> its remedy class."""
