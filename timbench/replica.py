"""A replica trainer pass: the noise floor of the trainer's own recompute, and how stable a remedy's selection is.

"Re-feeding is not replaying" (arXiv 2606.15621): before reading a mismatch
estimate or a thresholded token selection as signal, measure what a second
trainer pass over the same batch, with the same weights, gives. Its
difference from the first pass is the replica noise floor; the overlap of the
tokens a thresholded remedy (IcePop, MIS, TRM, the rejection-sampling
presets) rejects under each pass is the selection's stability (the paper:
Jaccard 0.34-0.90 against a 0.63-0.96 replica ceiling). With batch-invariant
kernels every pass is identical, so the floor is 0.0 and the overlap 1.0
exactly. A replica that changes the micro-batch composition is the re-feed
of verl #6280 (on-policy log_prob != old_log_prob when the log-prob
micro-batch size differs from the actor's).

The replica is pure scoring: it never reaches the update. `REPLICAS` is the
one registry of the `replica` run-config key.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from .metrics.mismatch import mismatch_metrics
from .metrics.schema import K3_KL, MAX_ABS_DELTA, MEAN_ABS_DELTA

PREFIX = "replica/"
FLOOR_KEYS = (K3_KL, MAX_ABS_DELTA, MEAN_ABS_DELTA)
"""The mismatch metrics (timbench.metrics.mismatch) whose value between two trainer passes is logged as the floor."""


@dataclass(frozen=True)
class Replica:
    """One way to run the second trainer pass: how many sequences each of its forward calls holds."""

    name: str
    doc: str
    chunk: Callable[[int, int], int]
    """(rows per forward call of the real pass, rows in the batch) -> rows per forward call of the replica."""


REPLICAS: dict[str, Replica | None] = {
    "none": None,
    **{
        r.name: r
        for r in (
            Replica(
                "identical",
                "the same chunking as the real pass: the paper's identical second exact pass",
                lambda chunk, n: chunk,
            ),
            Replica(
                "microbatch1",
                "one sequence per forward call: a log-prob micro-batch unlike the actor's (verl #6280)",
                lambda chunk, n: 1,
            ),
            Replica("fullbatch", "the whole batch in one forward call", lambda chunk, n: n),
        )
    },
}
"""`replica` config values: `none` (off, the default) or a Replica."""


def check_replica(value) -> str:
    """`value` itself when it names a replica, else a one-line ValueError listing the valid names."""
    if not isinstance(value, str) or value not in REPLICAS:
        raise ValueError(
            f"config key 'replica': {value!r} is invalid; valid: {', '.join(REPLICAS)} (timbench.replica.REPLICAS)"
        )
    return value


def jaccard(a: torch.Tensor, b: torch.Tensor) -> float:
    """|a & b| / |a | b| of two same-shaped bool token sets; 1.0 when both are empty (two empty selections agree)."""
    if a.shape != b.shape:
        raise ValueError(f"jaccard: set shapes {tuple(a.shape)} and {tuple(b.shape)} differ")
    a, b = a.bool(), b.bool()
    union = int((a | b).sum())  # integer counts: exact in any order
    return 1.0 if union == 0 else int((a & b).sum()) / union


def replica_metrics(
    first: torch.Tensor,
    second: torch.Tensor,
    response_mask: torch.Tensor,
    loss_mask: torch.Tensor,
    keep_first: torch.Tensor,
    keep_second: torch.Tensor,
    weights_first: torch.Tensor | None,
    weights_second: torch.Tensor | None,
) -> dict[str, float]:
    """The `replica/*` row of one step.

    first, second: [N, T] the trainer's logprobs of the sampled tokens from the real and the replica pass;
    response_mask: the tokens the floor runs over (the response, as the mismatch metrics' own);
    loss_mask: the tokens in the loss before the remedy; keep_*/weights_*: the remedy's keep-mask and
    weights (None = all 1) on (first, mu) and on (second, mu). The rejected set of a pass is
    loss_mask & ~keep; the floor is `timbench.metrics.mismatch.mismatch_metrics(first, second)`.
    """
    floor = mismatch_metrics(first, second, response_mask)
    loss_mask = loss_mask.bool()
    both = loss_mask & keep_first & keep_second
    ones = torch.ones_like(first, dtype=torch.float64)
    w1 = (ones if weights_first is None else weights_first.double())[both]
    w2 = (ones if weights_second is None else weights_second.double())[both]
    return {
        **{PREFIX + k.split("/", 1)[1]: floor[k] for k in FLOOR_KEYS},
        PREFIX + "mask_jaccard": jaccard(loss_mask & ~keep_first, loss_mask & ~keep_second),
        PREFIX + "kept_jaccard": jaccard(loss_mask & keep_first, loss_mask & keep_second),
        PREFIX + "weight_max_abs_delta": float((w1 - w2).abs().max()) if w1.numel() else 0.0,
    }
