"""Mismatch remedies: a registry of built-ins and a plug-in API (`load_remedy`).

    from timbench.remedies import Remedy, RemedyBatch, finish, log_rho, param
    remedy = load_remedy("tis_token", {"C": 3.0})
    result = remedy(RemedyBatch(old_logprobs, rollout_logprobs, advantages, mask, group_size))
"""

# The plug-in API's formula helpers: timbench.ratios' quantities and fixed-order masked reductions.
from ..ratios import k1, k2, k3, masked_mean, masked_sum, per_token, seq_log_ratio, seq_max, seq_mean, seq_sum
from .base import (METRIC_NAMES, NoParams, Remedy, RemedyBatch, RemedyResult, RemedyShapeError, check_bool_mask,
                   check_result, finish, log_rho, param)
from .registry import ENTRY_POINT_GROUP, REMEDIES, describe, list_remedies, load_remedy, resolve
from .replay import per_sequence, replay_tensor

__all__ = ["ENTRY_POINT_GROUP", "METRIC_NAMES", "NoParams", "REMEDIES", "Remedy", "RemedyBatch", "RemedyResult",
           "RemedyShapeError", "check_bool_mask", "check_result", "describe", "finish", "k1", "k2", "k3", "list_remedies", "load_remedy",
           "log_rho", "masked_mean", "masked_sum", "param", "per_sequence", "per_token", "replay_tensor", "resolve",
           "seq_log_ratio", "seq_max", "seq_mean", "seq_sum"]
