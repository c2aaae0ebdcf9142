"""RL on outcome rewards: advantage estimators, policy losses and their registry, and objective drift."""

from .algorithms import (
    AGGREGATIONS,
    ALGORITHMS,
    KL_ESTIMATORS,
    Algorithm,
    agg_loss,
    drgrpo_advantage,
    dynamic_sampling_mask,
    get_algorithm,
    grpo_advantage,
    gspo_loss,
    kl_penalty,
    ppo_clip_loss,
    reinforce_advantage,
    reinforce_pp_advantage,
    rloo_advantage,
)
from .drift import objective_drift

__all__ = [
    "AGGREGATIONS", "ALGORITHMS", "KL_ESTIMATORS", "Algorithm", "agg_loss", "drgrpo_advantage",
    "dynamic_sampling_mask", "get_algorithm", "grpo_advantage", "gspo_loss", "kl_penalty", "ppo_clip_loss",
    "reinforce_advantage", "reinforce_pp_advantage", "rloo_advantage", "objective_drift",
]
