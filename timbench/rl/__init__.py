"""RL on outcome rewards: advantage estimators, policy losses and their registry, and objective drift."""

from ..util.lazy import lazy_exports

_EXPORTS = {
    ".algorithms": [
        "AGGREGATIONS",
        "ALGORITHMS",
        "KL_ESTIMATORS",
        "Algorithm",
        "agg_loss",
        "drgrpo_advantage",
        "dynamic_sampling_mask",
        "get_algorithm",
        "grpo_advantage",
        "gspo_loss",
        "kl_penalty",
        "ppo_clip_loss",
        "reinforce_advantage",
        "reinforce_pp_advantage",
        "rloo_advantage",
    ],
    ".drift": ["objective_drift"],
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)  # torch loads on first use, not for `timbench --help`
__all__ = [n for names in _EXPORTS.values() for n in names]
