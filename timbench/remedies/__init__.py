"""Mismatch remedies: a registry of built-ins and a plug-in API (`load_remedy`).

    from timbench.remedies import Remedy, RemedyBatch, fexp, finish, fsum, log_rho, param
    remedy = load_remedy("tis_token", {"C": 3.0})
    result = remedy(RemedyBatch(old_logprobs, rollout_logprobs, advantages, mask, group_size))

A plug-in's maths must be the same bytes on any CPU and thread count (docs/internals/determinism.md): use `fexp`
(not torch.exp) and `fsum`/`fmean`/`fstd`/`masked_sum`/`masked_mean` (not torch.sum/mean/std), as the
built-ins do. Names load on first use (timbench.util.lazy), so `timbench --help` does not import torch.
"""

from ..util.lazy import lazy_exports

_EXPORTS = {
    # The plug-in API's formula helpers: timbench.metrics.ratios' quantities and fixed-order masked reductions.
    "..metrics.ratios": [
        "k1",
        "k2",
        "k3",
        "masked_mean",
        "masked_sum",
        "per_token",
        "seq_log_ratio",
        "seq_max",
        "seq_mean",
        "seq_sum",
    ],
    # CPU-independent pointwise exp and fixed-order reductions (the determinism contract's kernels).
    "..kernels.pointwise": ["fexp"],
    "..kernels.reduce": ["fmean", "fstd", "fsum"],
    ".base": [
        "METRIC_NAMES",
        "NoParams",
        "Remedy",
        "RemedyBatch",
        "RemedyResult",
        "RemedyShapeError",
        "check_bool_mask",
        "check_result",
        "finish",
        "log_rho",
        "param",
    ],
    ".registry": ["ENTRY_POINT_GROUP", "REMEDIES", "describe", "list_remedies", "load_remedy", "resolve"],
    ".replay": ["per_sequence", "replay_tensor"],
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = [n for names in _EXPORTS.values() for n in names]
