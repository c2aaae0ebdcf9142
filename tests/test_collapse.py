"""Collapse detector on synthetic reward / grad / KL curves: each clause of the documented rule."""

import math

import pytest

from timbench.report.collapse import CollapseRule, detect_collapse, moving_average, rule_from_dict

pytestmark = pytest.mark.unit  # builds no model (make test-unit)


def rows(rewards, grads=None, k3=None, loss=None):
    out = []
    for i, r in enumerate(rewards):
        row = {
            "step": i,
            "critic/rewards/mean": r,
            "actor/grad_norm": 1.0 if grads is None else grads[i],
            "actor/loss": 0.01 if loss is None else loss[i],
            "rollout_corr/k3_kl": 0.0 if k3 is None else k3[i],
        }
        out.append(row)
    return out


EVALS = [
    {"step": 0, "accuracy_t1": 0.3, "accuracy_greedy": 0.6},
    {"step": 10, "accuracy_t1": 0.5},
    {"step": 40, "accuracy_t1": 0.45, "accuracy_greedy": 0.8},
]


def test_stable_run_does_not_collapse():
    r = detect_collapse(rows([0.3 + 0.01 * i for i in range(40)]), EVALS, {"status": "finished"})
    assert r["collapsed"] is False and r["collapse_step"] is None and r["collapse_reason"] is None
    assert r["peak_accuracy_t1"] == 0.5 and r["final_accuracy_t1"] == 0.45
    assert r["final_reward"] == pytest.approx(sum(0.3 + 0.01 * i for i in range(35, 40)) / 5)
    assert r["kl_warning_step"] is None and r["kl_lead_steps"] is None


def test_collapse_is_dated_where_the_smoothed_reward_crosses_half_its_peak():
    rewards = [0.6] * 20 + [0.0] * 20
    r = detect_collapse(rows(rewards), EVALS)
    # smoothed (width 5) at step 22 = 0.6*2/5 = 0.24 < 0.3 = (1 - 0.5) * 0.6; step 21 is 0.36.
    assert r["collapsed"] and r["collapse_reason"] == "reward_drop" and r["collapse_step"] == 22
    assert r["peak_reward"] == pytest.approx(0.6) and r["final_reward"] == 0.0
    # alpha is honoured: a 0.9 drop is needed, crossed later (smoothed < 0.06 needs all five at 0 -> step 24)
    assert detect_collapse(rows(rewards), rule=CollapseRule(alpha=0.95))["collapse_step"] == 24


def test_dip_that_recovers_within_the_window_is_not_a_collapse():
    rewards = [0.6] * 20 + [0.0] * 6 + [0.7] * 20
    assert detect_collapse(rows(rewards))["collapsed"] is False
    # the same dip held longer than the window is one
    held = [0.6] * 20 + [0.0] * 16 + [0.7] * 20
    assert detect_collapse(rows(held))["collapse_step"] == 22


def test_drop_persisting_to_the_end_counts_once_it_lasted_half_the_window():
    # crossing at step 12; steps 12..17 are 6 >= ceil(10 / 2) steps below the level
    assert detect_collapse(rows([0.6] * 10 + [0.0] * 8))["collapse_step"] == 12
    # steps 12..13 only: an undecided tail, not called
    assert detect_collapse(rows([0.6] * 10 + [0.0] * 4))["collapsed"] is False


def test_nothing_to_lose_below_min_peak():
    assert detect_collapse(rows([0.04] * 10 + [0.0] * 20))["collapsed"] is False
    assert detect_collapse(rows([0.04] * 10 + [0.0] * 20), rule=CollapseRule(min_peak=0.01))["collapsed"]


def test_noisy_but_stable_reward_is_not_a_collapse():
    # alternating 0.2 / 0.8 (single-step dips to 0.2 < 0.4 = half of 0.8) is smoothed away
    rewards = [0.2 if i % 2 else 0.8 for i in range(60)]
    assert detect_collapse(rows(rewards))["collapsed"] is False
    # without smoothing, each dip recovers the next step, so still no collapse
    assert detect_collapse(rows(rewards), rule=CollapseRule(smooth=1))["collapsed"] is False


def test_non_finite_loss_or_grad_row_and_failed_summary():
    grads = [1.0] * 10 + [math.nan] + [1.0] * 9
    r = detect_collapse(rows([0.5] * 20, grads=grads))
    assert (r["collapsed"], r["collapse_step"], r["collapse_reason"]) == (True, 10, "non_finite")
    loss = [0.01] * 5 + [math.inf] + [0.01] * 14
    assert detect_collapse(rows([0.5] * 20, loss=loss))["collapse_step"] == 5
    failed = {
        "status": "failed",
        "steps_done": 7,
        "error": "step 7: non-finite loss=nan or grad_norm=inf (lane main); metrics up to step 6 are kept",
    }
    r = detect_collapse(rows([0.5] * 7), EVALS[:2], failed)
    assert (r["collapse_step"], r["collapse_reason"], r["final_accuracy_t1"]) == (7, "non_finite", 0.5)
    # a failure for another reason is not a collapse
    other = {"status": "failed", "steps_done": 7, "error": "disk full"}
    assert detect_collapse(rows([0.5] * 7), summary=other)["collapsed"] is False


def test_earlier_reward_drop_wins_over_later_nan():
    grads = [1.0] * 35 + [math.nan] * 5
    r = detect_collapse(rows([0.6] * 20 + [0.0] * 20, grads=grads))
    assert (r["collapse_step"], r["collapse_reason"]) == (22, "reward_drop")


def test_grad_spike_confirmed_by_reward_collapse_dates_it_early():
    grads = [1.0] * 16 + [50.0] + [1.0] * 23
    r = detect_collapse(rows([0.6] * 20 + [0.0] * 20, grads=grads))
    assert (r["collapse_step"], r["grad_spike_step"], r["collapse_reason"]) == (16, 16, "reward_drop")
    # a lone spike whose reward holds is not a collapse
    lone = detect_collapse(rows([0.6] * 40, grads=grads))
    assert lone["collapsed"] is False and lone["grad_spike_step"] is None
    # a spike more than `window` steps before the drop does not date it
    early = [1.0] * 5 + [50.0] + [1.0] * 34
    r = detect_collapse(rows([0.6] * 20 + [0.0] * 20, grads=early))
    assert (r["collapse_step"], r["grad_spike_step"]) == (22, None)


def test_late_kl_warning_gives_negative_lead():
    k3 = [1e-5] * 30 + [5e-3] * 10
    r = detect_collapse(rows([0.6] * 20 + [0.0] * 20, k3=k3))
    assert r["kl_warning_step"] == 30 and r["kl_lead_steps"] == 22 - 30
    early = detect_collapse(rows([0.6] * 20 + [0.0] * 20, k3=[2e-3] * 40))
    assert early["kl_warning_step"] == 0 and early["kl_lead_steps"] == 22


def test_malformed_input_and_rule_overrides_are_one_line_errors():
    with pytest.raises(ValueError, match="critic/rewards/mean"):
        detect_collapse([{"step": 0, "actor/grad_norm": 1.0}])
    with pytest.raises(ValueError, match="out of order"):
        detect_collapse(rows([0.5, 0.5])[::-1])
    with pytest.raises(ValueError, match="not finite"):
        detect_collapse(rows([0.5, math.nan]))
    with pytest.raises(ValueError, match="unknown key 'alpah'; valid: alpha, window"):
        rule_from_dict({"alpah": 0.3})
    with pytest.raises(ValueError, match="0 < alpha < 1"):
        rule_from_dict({"alpha": 1.5})
    with pytest.raises(ValueError, match="window must be int"):
        rule_from_dict({"window": 2.5})
    assert rule_from_dict({"window": 3, "kl_warn": 1e-4}) == CollapseRule(window=3, kl_warn=1e-4)
    assert rule_from_dict(None) == CollapseRule()


def test_moving_average_is_trailing():
    assert moving_average([1.0, 3.0, 5.0, 7.0], 2) == [1.0, 2.0, 4.0, 6.0]


def test_eval_accuracy_drop_is_a_collapse_even_when_training_reward_never_peaked():
    # Heavy sampler noise: the training reward is ~0 from step 0, the clean eval accuracy falls.
    rows = [{"step": s, "critic/rewards/mean": 0.02, "actor/grad_norm": 0.3} for s in range(40)]
    evals = [{"step": s, "accuracy_t1": a} for s, a in [(0, 0.31), (10, 0.14), (20, 0.117), (30, 0.031), (40, 0.06)]]
    r = detect_collapse(rows, evals)
    assert (r["collapsed"], r["collapse_step"], r["collapse_reason"]) == (True, 10, "accuracy_drop")
    recovered = evals[:3] + [{"step": 30, "accuracy_t1": 0.3}, {"step": 40, "accuracy_t1": 0.32}]
    assert not detect_collapse(rows, recovered)["collapsed"]
    # a drop 5 steps before the end (< window) is undecided, not a collapse
    late = [{"step": s, "accuracy_t1": a} for s, a in [(0, 0.31), (10, 0.3), (20, 0.3), (30, 0.031), (35, 0.1)]]
    assert not detect_collapse(rows, late)["collapsed"]
