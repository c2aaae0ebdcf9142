"""Mismatch metrics on hand-made logprobs with known answers."""

import math

import pytest
import torch

from timbench.metrics.mismatch import mismatch_metrics, routing_agreement

pytestmark = pytest.mark.unit  # builds no model (make test-unit)


def test_zero_mismatch_is_exactly_zero():
    lp = torch.log(torch.tensor([[0.5, 0.25, 0.1]]))
    m = mismatch_metrics(lp, lp.clone())
    assert m["rollout_corr/k3_kl"] == 0.0 and m["rollout_corr/kl"] == 0.0
    assert m["training/rollout_probs_diff_max"] == 0.0 and m["mismatch/frac_tokens_differ"] == 0.0
    assert m["rollout_corr/eff_sample_size"] == 1.0 and m["rollout_corr/chi2_token"] == 0.0


def test_known_values():
    # pi = 0.5 vs mu = 0.25 on one token, equal on the other; the third token is masked.
    lp_t = torch.log(torch.tensor([[0.5, 0.2, 0.9]]))
    lp_r = torch.log(torch.tensor([[0.25, 0.2, 0.1]]))
    mask = torch.tensor([[True, True, False]])
    m = mismatch_metrics(lp_t, lp_r, mask)
    rho = torch.tensor([2.0, 1.0])
    assert m["tokens"] == 2
    assert math.isclose(m["rollout_corr/kl"], -math.log(2) / 2, rel_tol=1e-6)
    assert math.isclose(m["rollout_corr/k3_kl"], float((rho - 1 - rho.log()).mean()), rel_tol=1e-6)
    assert math.isclose(m["rollout_corr/chi2_token"], float((rho**2).mean() - 1), rel_tol=1e-6)
    assert math.isclose(m["rollout_corr/chi2_seq"], 2.0**2 - 1, rel_tol=1e-6)
    assert math.isclose(m["training/rollout_probs_diff_max"], 0.25, rel_tol=1e-6)
    assert math.isclose(m["mismatch/max_abs_delta"], math.log(2), rel_tol=1e-6)
    assert m["mismatch/frac_tokens_differ"] == 0.5
    assert m["mismatch/extreme_frac_1.5"] == 0.5 and m["mismatch/extreme_frac_5"] == 0.0
    assert math.isclose(m["rollout_corr/eff_sample_size"], 1 / float(((rho / rho.mean()) ** 2).mean()), rel_tol=1e-6)
    # log_ppl_diff = mean lp_rollout - mean lp_train over the sequence's unmasked tokens.
    assert math.isclose(m["rollout_corr/log_ppl_diff"], -math.log(2) / 2, rel_tol=1e-6)


def test_routing_agreement_ignores_order_within_topk():
    a = torch.tensor([[[0, 1], [2, 3]], [[4, 5], [6, 7]]])
    b = torch.tensor([[[1, 0], [2, 3]], [[4, 6], [6, 7]]])
    assert routing_agreement(a, b) == 0.75


def _batch(seed=0):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(4, 6, generator=g, dtype=torch.float64) * 3
    roll = old + 0.3 * torch.randn(4, 6, generator=g, dtype=torch.float64)
    mask = torch.rand(4, 6, generator=g) > 0.3
    mask[:, 0] = True
    return old, roll, mask


def test_empty_mask_gives_the_zero_mismatch_value_of_every_metric():
    old, roll, _ = _batch()
    empty = mismatch_metrics(old, roll, torch.zeros_like(old, dtype=torch.bool))
    neutral = mismatch_metrics(old, old.clone())
    assert empty.pop("tokens") == 0 and neutral.pop("tokens") == old.numel()
    assert empty == neutral  # chi2_token was -1.0 here while every other metric was neutral
    assert empty["rollout_corr/chi2_token"] == 0.0 and empty["rollout_corr/eff_sample_size"] == 1.0


def test_nan_and_inf_in_padded_positions_never_leak():
    old, roll, mask = _batch(1)
    clean = mismatch_metrics(old, roll, mask)
    assert all(math.isfinite(v) for v in clean.values())
    for old_pad, roll_pad in [(math.nan, math.nan), (-math.inf, -math.inf), (0.0, -math.inf), (-math.inf, 3.0)]:
        o = torch.where(mask, old, torch.full_like(old, old_pad))
        r = torch.where(mask, roll, torch.full_like(roll, roll_pad))
        assert mismatch_metrics(o, r, mask) == clean, (old_pad, roll_pad)


def test_k3_kl_is_unclamped_as_verl_logs_it():
    # A token 25 nats apart: the weights' log-ratio is clamped at 20, k3_kl is not.
    old = torch.tensor([[-1.0, -30.0]], dtype=torch.float64)
    roll = torch.tensor([[-1.0, -5.0]], dtype=torch.float64)
    m = mismatch_metrics(old, roll, torch.ones_like(old, dtype=torch.bool))
    d = -25.0
    assert math.isclose(m["rollout_corr/k3_kl"], (math.exp(d) - 1 - d) / 2, rel_tol=1e-12)
