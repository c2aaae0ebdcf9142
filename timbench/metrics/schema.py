"""Metric schema: every key a run logs (metrics.jsonl, eval.jsonl) and every summary column, named once.

The loop, the remedies and the reports import these names instead of repeating
string literals, and `check_key` turns an unknown name into a one-line error (a
typo is an error, not an empty column); tests/test_schema.py also scans the loop
and report modules for metric-like literals that are not here. Names follow verl
where verl has one (`rollout_corr/*`, `actor/*`, `training/*`).
"""

from __future__ import annotations

import re

STEP = "step"
K3_KL = "rollout_corr/k3_kl"
MEAN_ABS_DELTA = "mismatch/mean_abs_delta"
P99_ABS_DELTA = "mismatch/p99_abs_delta"
MAX_ABS_DELTA = "mismatch/max_abs_delta"
ABS_DELTA_HIST = "mismatch/abs_delta_hist"
PROBS_DIFF_MAX = "training/rollout_probs_diff_max"
PROBS_DIFF_MEAN = "training/rollout_probs_diff_mean"
REWARD_MEAN = "critic/rewards/mean"
GRAD_NORM = "actor/grad_norm"
ACCURACY_T1 = "accuracy_t1"
ACCURACY_GREEDY = "accuracy_greedy"
QUANTIZED_ACCURACY_GREEDY = "quantized/accuracy_greedy"
TIM_BITWISE_EQUAL_FRAC = "tim/bitwise_equal_frac"
TIM_TV_MEAN = "tim/tv_mean"
TIM_TV_MAX = "tim/tv_max"
TIM_TOP1_AGREEMENT = "tim/top1_agreement"

# Summary columns the reports read by name (a step key under one of SUMMARY_PREFIXES, below).
MEAN_MEAN_ABS_DELTA = "mean/" + MEAN_ABS_DELTA
MEAN_K3_KL = "mean/" + K3_KL
MAX_PROBS_DIFF_MAX = "max/" + PROBS_DIFF_MAX
FINAL_REWARD_MEAN = "final/" + REWARD_MEAN

METRIC_NAMES = {
    "remedy/token_masked_frac": "rollout_corr/rollout_rs_masked_fraction",
    "remedy/seq_masked_frac": "rollout_corr/rollout_rs_seq_masked_fraction",
    "remedy/token_truncated_frac": "rollout_corr/rollout_is_ratio_fraction_high",
    "remedy/is_weight_mean": "rollout_corr/rollout_is_mean",
    "remedy/is_weight_min": "rollout_corr/rollout_is_min",
    "remedy/is_weight_max": "rollout_corr/rollout_is_max",
}
"""What every remedy logs: generic name -> the verl name actually logged."""

STEP_KEYS: dict[str, str] = {
    STEP: "RL step (1-based)",
    "actor/entropy": "mean token entropy of the policy",
    GRAD_NORM: "gradient norm before clipping",
    "actor/loss": "total actor loss",
    "actor/pg_loss": "policy-gradient loss",
    "actor/ppo_kl": "PPO approx KL",
    "actor/pg_clipfrac": "fraction of tokens clipped",
    "actor/pg_clipfrac_high": "clipped above 1 + eps",
    "actor/pg_clipfrac_low": "clipped below 1 - eps",
    "actor/kl_loss": "KL-to-reference loss",
    "actor/pg_clipfrac_lower": "A < 0 tokens bounded at -A c by dual-clip (only with clip_ratio_c)",
    "actor/ppo_rs_seq_masked_fraction": "sequences masked by the algorithm's own rejection",
    "actor/ratio_mean": "PPO ratio mean",
    "actor/ratio_min": "PPO ratio min",
    "actor/ratio_max": "PPO ratio max",
    "batch/kept_frac": "fraction of the batch's tokens in the loss",
    REWARD_MEAN: "mean reward of the step's rollouts",
    "critic/rewards/std": "reward std",
    "drift/c_rollout_mean": "C(r_rollout), arXiv 2605.14220 Eq. 5",
    "drift/c_train_mean": "C(r_train)",
    "drift/diff_mean": "C(r_train) - C(r_rollout)",
    "drift/diff_abs_mean": "|C(r_train) - C(r_rollout)|",
    "drift/diff_pos_adv_mean": "drift on positive-advantage tokens",
    "drift/diff_neg_adv_mean": "drift on negative-advantage tokens",
    "drift/frac_pos_adv": "fraction of positive-advantage tokens",
    ABS_DELTA_HIST: "histogram of |log pi - log mu| (timbench.metrics.mismatch.ABS_DELTA_BINS)",
    "mismatch/extreme_frac_1.5": "fraction of tokens with rho outside [1/1.5, 1.5]",
    "mismatch/extreme_frac_2": "outside [1/2, 2]",
    "mismatch/extreme_frac_5": "outside [1/5, 5]",
    "mismatch/frac_tokens_differ": "fraction of tokens whose logprobs differ at all",
    MAX_ABS_DELTA: "max |delta|",
    MEAN_ABS_DELTA: "mean |delta|",
    P99_ABS_DELTA: "99th percentile |delta|",
    "mismatch/routing_agreement": "MoE top-k agreement engine vs trainer",
    "response_length/max": "longest response",
    "response_length/mean": "mean response length",
    "rollout_corr/chi2_seq": "sequence chi-square",
    "rollout_corr/chi2_token": "token chi-square",
    "rollout_corr/eff_sample_size": "effective sample size of rho",
    K3_KL: "k3 KL estimate engine vs trainer",
    "rollout_corr/kl": "k1 KL estimate",
    "rollout_corr/log_ppl_abs_diff": "|log ppl difference|",
    "rollout_corr/log_ppl_diff": "log ppl difference",
    "rollout_corr/ppl_ratio": "perplexity ratio",
    **{v: f"remedy metric ({k})" for k, v in METRIC_NAMES.items()},
    PROBS_DIFF_MAX: "max |pi - mu| over tokens (verl)",
    PROBS_DIFF_MEAN: "mean |pi - mu| (verl)",
    "staleness/lag": "updates between the behavior policy and the current one (staleness=K)",
    "staleness/mismatch_k3": "k3 of the mismatch factor pi_old^behav / mu (arXiv 2512.01374)",
    "staleness/staleness_k3": "k3 of the staleness factor pi_current / pi_old^behav",
    "staleness/total_k3": "k3 of the product pi_current / mu",
    "staleness/mismatch_log_ratio_mean": "mean log(pi_old^behav / mu)",
    "staleness/staleness_log_ratio_mean": "mean log(pi_current / pi_old^behav)",
    # replica=<kind> (timbench.replica, arXiv 2606.15621): a second trainer pass of the same batch
    "replica/k3_kl": "k3 KL between the real and the replica trainer pass (the noise floor)",
    "replica/max_abs_delta": "max |delta| between the two trainer passes",
    "replica/mean_abs_delta": "mean of it",
    "replica/mask_jaccard": "Jaccard overlap of the tokens the remedy rejects on each pass (1 when both empty)",
    "replica/kept_jaccard": "Jaccard overlap of the tokens the remedy keeps on each pass",
    "replica/weight_max_abs_delta": "max |w - w'| of the remedy's weights on tokens both passes keep",
    # direction-aware metrics (timbench.metrics.direction, TRIAGE arXiv 2610.07043)
    **{
        f"tim/quadrant_mass/{q}": f"share of sum |A| |delta| with {q.replace('_', ' ')}"
        for q in ("pos_adv_pos_delta", "pos_adv_neg_delta", "neg_adv_pos_delta", "neg_adv_neg_delta")
    },
    "tim/neg_adv_imbalance": "mass(A < 0, delta < 0) / mass(A < 0, delta > 0): TRIAGE's precursor (1 = balanced)",
    "tim/pos_adv_imbalance": "mass(A > 0, delta < 0) / mass(A > 0, delta > 0) (the control)",
    "tim/tail_seg_concentration": "share of the top-1% |delta| tail inside the worst tenth of 64-token segments",
    TIM_BITWISE_EQUAL_FRAC: "positions whose whole next-token distribution the trainer matches bitwise "
    "(timbench.metrics.dist, arXiv 2610.05458; timbench engine only)",
    TIM_TV_MEAN: "mean total variation 0.5 * sum_v |pi_v - mu_v| of the full distributions per position",
    TIM_TV_MAX: "max total variation over the step's response positions",
    TIM_TOP1_AGREEMENT: "positions where trainer and engine argmax agree (greedy token agreement; ties to lower id)",
}
"""Every key of a metrics.jsonl row -> one line of what it is."""

REMEDY_EXTRA_KEYS: dict[str, str] = {
    "rollout_corr/rollout_is_ratio_fraction_low": "fraction of IS ratios below the lower bound (verl)",
    "rollout_corr/rollout_is_oob_ratio": "fraction of IS ratios out of bounds (verl, TRL)",
    "rollout_corr/rollout_is_batch_norm_factor": "batch normalisation factor of the IS weights (verl)",
}
"""Keys only some remedies log (the verl and TRL adapters), beyond the METRIC_NAMES every remedy logs."""
STEP_KEYS.update(REMEDY_EXTRA_KEYS)

STEP_KEY_FAMILIES: dict[str, str] = {
    r"mismatch/extreme_frac_[0-9.]+": "fraction of tokens with rho outside [1/tau, tau] (any tau)",
    r"rollout_corr/rollout_rs_[a-z0-9_]+_(seq_)?masked_fraction": "verl rejection sampling, one per criterion",
    r"tim/top[0-9]+_consistency": "mean overlap |top-K(pi) & top-K(mu)| / K of the full distributions "
    "(timbench.metrics.dist.TOP_K: 5)",
}
"""Keys logged under a parameter (regular expressions of the whole key)."""
_FAMILY = re.compile("|".join(f"(?:{p})" for p in STEP_KEY_FAMILIES))

EVAL_KEYS: dict[str, str] = {
    STEP: "RL step of the evaluation (0 = before training)",
    ACCURACY_T1: "accuracy sampling at temperature 1",
    ACCURACY_GREEDY: "accuracy of greedy decoding",
    QUANTIZED_ACCURACY_GREEDY: "greedy accuracy of the quantized policy alone (quant conditions)",
}
"""Every key of an eval.jsonl row."""

TWIN = "twin/"
"""Prefix of the twin lane's keys in a metrics.jsonl row (a run with a twin: `twin/accuracy_t1`, ...)."""
TWIN_KEYS = {
    "twin/frac_tokens_differ": "fraction of sampled tokens where the twin lane's rollout differs",
    "twin/param_distance": "parameter distance between the main and the twin lane",
}

SUMMARY_PREFIXES = ("cum/", "final/", "mean/", "max/", "collapse/")
"""Aggregates of step keys in summary.json / summary.csv (`mean/rollout_corr/k3_kl`, ...)."""

REMEDY_EXTRA_PREFIX = "remedy_extra/"
"""Summary column prefix of a plug-in's own metrics (keys not in this schema), each the mean over steps:
`remedy_extra/<key>` (timbench.report.summary); any key under it is known, since the plug-in names it."""

SUMMARY_KEYS = (
    "algorithm",
    "engine",
    "error",
    "first_divergence_step",
    "mode",
    "seed",
    "status",
    "steps_done",
    "task",
    "task_version",
    "trainer",
    "final_accuracy_t1",
    "final_accuracy_greedy",
    "initial_accuracy_t1",
    "peak_accuracy_t1",
    "relative_accuracy_t1",
    "final_quantized_accuracy_greedy",
)
"""Plain (unprefixed) keys of a run's summary.json and a grid's summary.csv besides the cell id columns."""


class SchemaError(KeyError):
    """A metric name that is not in the schema."""

    def __str__(self) -> str:
        return str(self.args[0])


def is_known(key: str) -> bool:
    """Whether `key` is a step, eval or summary name (summary: a step key under one of SUMMARY_PREFIXES)."""
    if _is_step_key(key) or key in EVAL_KEYS or key in SUMMARY_KEYS:
        return True
    if key.startswith(REMEDY_EXTRA_PREFIX) and len(key) > len(REMEDY_EXTRA_PREFIX):
        return True
    return any(key.startswith(p) and (_is_step_key(key[len(p) :]) or p == "collapse/") for p in SUMMARY_PREFIXES)


def _is_step_key(key: str) -> bool:
    if key in TWIN_KEYS or (key.startswith(TWIN) and (key[len(TWIN) :] in EVAL_KEYS or _is_step_key(key[len(TWIN) :]))):
        return True
    return key in STEP_KEYS or _FAMILY.fullmatch(key) is not None


def check_key(key: str, where: str = "metric") -> str:
    """`key` itself, or a one-line SchemaError naming it and where the valid names are."""
    if not is_known(key):
        raise SchemaError(
            f"{where}: unknown metric {key!r}; valid: the names in timbench.metrics.schema "
            f"(STEP_KEYS, EVAL_KEYS, SUMMARY_KEYS, or {'|'.join(SUMMARY_PREFIXES)} + a step key)"
        )
    return key
