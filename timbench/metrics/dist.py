"""Distribution-level mismatch metrics: the trainer's and the engine's whole next-token distributions compared.

The per-token metrics (timbench.metrics.mismatch) see one number per position, the
sampled token's logprob. The cross-vendor study (arXiv 2610.05458, NVIDIA vs
AMD) found that bitwise equality barely moves while the distributions move most
of the way, so no single metric suffices, and reports five families: bitwise
equality, logit difference, top-K consistency, token agreement, task accuracy.
timbench's engine returns each position's full tempered log-distribution
(`SamplingParams.full_logprobs`) and the trainer's recompute pass scores the
same positions over the whole vocabulary, so four of them are cheap here:

    tim/bitwise_equal_frac   positions whose whole row is bitwise equal (bitwise equality)
    tim/tv_mean, tim/tv_max  total variation 0.5 * sum_v |p_v - q_v| per position, mean and max
    tim/top1_agreement       argmax equal: the token greedy decoding would emit (token agreement)
    tim/top{K}_consistency   mean |top-K(p) & top-K(q)| / K (top-K consistency)

Logit difference is not here: both sides hand over log-probabilities, which
are logits shifted by a per-row constant, so |lp difference| is not the
paper's logit error and is not relabelled as one. Task accuracy is eval.jsonl.

Ties (bitwise-equal logprobs) rank the lower token id first, as a stable sort
does and as the sampler's top-k does (timbench.engine.sampler), so the sets and
the argmax never depend on the CPU. Masked-out positions are selected away
before any arithmetic (NaN / -inf padding cannot leak), every float reduction
is fixed-order (kernels.reduce), and an empty mask gives the zero-mismatch
values (TV 0, agreements and fractions 1), as timbench.metrics.mismatch does.
"""

from __future__ import annotations

import torch

from ..kernels.numba_ops import top_k_ids
from ..kernels.pointwise import fexp
from ..kernels.reduce import fmean, fsum
from .schema import TIM_BITWISE_EQUAL_FRAC as BITWISE_EQUAL_FRAC
from .schema import TIM_TOP1_AGREEMENT as TOP1_AGREEMENT
from .schema import TIM_TV_MAX as TV_MAX
from .schema import TIM_TV_MEAN as TV_MEAN

TOP_K = 5
"""K of the logged top-K consistency. The paper's K is not in shared/reference; 5 is the most top logprobs the
OpenAI Completions API returns per token (`logprobs` <= 5), which vLLM's OpenAI server mirrors: the top-K an
RL framework reading an engine's logprobs usually has. With the default vocabulary (V = 99) it is ~5% of it."""


def topk_key(k: int) -> str:
    """The metric name of top-K consistency for this K (`tim/top5_consistency`)."""
    return f"tim/top{k}_consistency"


def distribution_metrics(
    trainer_lp_all: torch.Tensor, engine_lp_all: torch.Tensor, mask: torch.Tensor | None = None, k: int = TOP_K
) -> dict[str, float]:
    """Compare the trainer's (p) and the engine's (q) log-distributions [..., V] at the positions in `mask` [...].

    Both are log-probabilities over the same vocabulary (any float dtype; -inf is a zero probability).
    Returns the `tim/*` metrics of the module docstring.
    """
    p_lp, q_lp, rows = _rows(trainer_lp_all, engine_lp_all, mask, k)
    n = p_lp.shape[0]
    if n == 0:  # nothing compared: the zero-mismatch values, not NaN
        return {BITWISE_EQUAL_FRAC: 1.0, TV_MEAN: 0.0, TV_MAX: 0.0, TOP1_AGREEMENT: 1.0, topk_key(k): 1.0}
    # Bitwise: float64 widening is exact, so equal bits there are equal bits (and sign of zero) in any dtype.
    equal = (p_lp.view(torch.int64) == q_lp.view(torch.int64)).all(-1)
    tv = 0.5 * fsum((fexp(p_lp) - fexp(q_lp)).abs(), -1)
    p_top, q_top = _top(p_lp, k), _top(q_lp, k)
    in_p = torch.zeros(rows, dtype=torch.bool).scatter(-1, p_top, True)
    in_q = torch.zeros(rows, dtype=torch.bool).scatter(-1, q_top, True)
    overlap = fsum((in_p & in_q).double(), -1)  # integer counts: exact
    return {
        BITWISE_EQUAL_FRAC: float(fmean(equal.double())),
        TV_MEAN: float(fmean(tv)),
        TV_MAX: float(tv.max()),
        TOP1_AGREEMENT: float(fmean((p_top[:, 0] == q_top[:, 0]).double())),
        topk_key(k): float(fsum(overlap)) / (n * k),  # an exact integer over n * k: one rounding
    }


def _rows(trainer_lp_all, engine_lp_all, mask, k):
    """The compared positions as float64 [M, V] each, and their shape; one-line errors for bad shapes or K."""
    if trainer_lp_all.shape != engine_lp_all.shape or trainer_lp_all.dim() < 1:
        raise ValueError(
            f"distribution_metrics: trainer and engine distributions must have one shape [..., V], "
            f"got {tuple(trainer_lp_all.shape)} and {tuple(engine_lp_all.shape)}"
        )
    vocab = trainer_lp_all.shape[-1]
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= vocab:
        raise ValueError(
            f"distribution_metrics: k (the top-K set size) must be an integer in [1, V={vocab}], got {k!r}"
        )
    lead = trainer_lp_all.shape[:-1]
    mask = torch.ones(lead, dtype=torch.bool) if mask is None else mask
    if mask.shape != lead:
        raise ValueError(
            f"distribution_metrics: mask must have the distributions' leading shape {tuple(lead)}, "
            f"got {tuple(mask.shape)}"
        )
    mask = mask.bool()
    p = trainer_lp_all.detach()[mask].double()
    q = engine_lp_all.detach()[mask].double()
    return p, q, p.shape


def _top(lp: torch.Tensor, k: int) -> torch.Tensor:
    """[M, k] token ids of the k largest logprobs per row, ties to the lower id: a stable descending sort's first k
    (torch.sort's order, NaN first), found without sorting the whole row (this ran two full sorts per RL step)."""
    return torch.from_numpy(top_k_ids(lp.contiguous().numpy(), k))
