"""timbench.rl.algorithms against hand-computed values (worked out with plain arithmetic below)."""

import math

import pytest
import torch

from timbench.rl import (
    ALGORITHMS,
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

pytestmark = pytest.mark.unit  # builds no model (make test-unit)

D = torch.float64
REWARDS = torch.tensor([1.0, 0, 0, 0, 1, 1, 0, 0], dtype=D)  # two groups of G = 4


def t(x):
    return torch.tensor(x, dtype=D)


def close(a, b, tol=1e-9):
    assert torch.allclose(torch.as_tensor(a, dtype=D), torch.as_tensor(b, dtype=D), atol=tol, rtol=0), (a, b)


# ---------------------------------------------------------------- advantages


def test_grpo_unbiased_std_and_eps():
    # group 1: mean .25, deviations (.75, -.25 x3), sum sq .75, unbiased var .75/3 = .25, std .5
    # group 2: mean .5, deviations +-.5, sum sq 1, unbiased var 1/3
    s1, s2 = 0.5 + 1e-6, math.sqrt(1 / 3) + 1e-6
    close(
        grpo_advantage(REWARDS, 4),
        [0.75 / s1, -0.25 / s1, -0.25 / s1, -0.25 / s1, 0.5 / s2, 0.5 / s2, -0.5 / s2, -0.5 / s2],
    )


def test_grpo_constant_group_and_group_of_one():
    close(grpo_advantage(t([1.0, 1, 1, 0, 0, 0]), 3), [0.0] * 6)
    close(grpo_advantage(t([2.0, -1.0]), 1), [2 / (1 + 1e-6), -1 / (1 + 1e-6)])  # verl: mean 0, std 1
    assert grpo_advantage(torch.tensor([1, 0, 1, 0]), 2).dtype.is_floating_point  # integer rewards work


def test_drgrpo_rloo_reinforce():
    close(drgrpo_advantage(REWARDS, 4), [0.75, -0.25, -0.25, -0.25, 0.5, 0.5, -0.5, -0.5])
    # leave-one-out: group 1: 1 - 0, 0 - 1/3; group 2: 1 - 1/3, 0 - 2/3
    close(rloo_advantage(REWARDS, 4), [1, -1 / 3, -1 / 3, -1 / 3, 2 / 3, 2 / 3, -2 / 3, -2 / 3])
    close(rloo_advantage(t([3.0, 1.0]), 1), [3.0, 1.0])
    # batch mean of REWARDS is 3/8
    close(reinforce_advantage(REWARDS, 4), [1 - 3 / 8, -3 / 8, -3 / 8, -3 / 8, 5 / 8, 5 / 8, -3 / 8, -3 / 8])


def test_reinforce_pp_whitening():
    r = t([1.0, 0, 0, 0])
    # mean .25, unbiased var ((.75)^2 + 3 (.25)^2) / 3 = .25
    close(reinforce_pp_advantage(r), [x / math.sqrt(0.25 + 1e-8) for x in (0.75, -0.25, -0.25, -0.25)])
    # token-weighted as verl's masked_whiten, lengths (3, 1, 1, 1): mean 3/6 = .5,
    # var (3 * .25 + 3 * .25) / (6 - 1) = .3
    close(
        reinforce_pp_advantage(r, lengths=t([3.0, 1, 1, 1])),
        [x / math.sqrt(0.3 + 1e-8) for x in (0.5, -0.5, -0.5, -0.5)],
    )


def test_dynamic_sampling_mask():
    rewards = t([1.0, 1, 1, 0, 1, 0, 0, 0, 0])
    assert dynamic_sampling_mask(rewards, 3).tolist() == [False] * 3 + [True] * 3 + [False] * 3
    assert dynamic_sampling_mask(t([0.5, 0.25]), 2).tolist() == [True, True]


def test_advantage_shape_errors():
    with pytest.raises(ValueError, match="divisible"):
        grpo_advantage(REWARDS, 3)
    with pytest.raises(ValueError):
        drgrpo_advantage(REWARDS.view(2, 4), 4)


# ---------------------------------------------------------------- PPO clip loss


def _ppo_case():
    # row 0: A = +1, ratios 1.5 (above 1 + eps: clipped to 1.2), 0.9, 0.5 (A > 0: unclipped, pessimistic)
    # row 1: A = -1, ratios 0.5 (below 1 - eps: clipped to 0.8), 1.1, 1.5 (A < 0: unclipped)
    ratios = t([[1.5, 0.9, 0.5], [0.5, 1.1, 1.5]])
    return ratios.log(), torch.zeros(2, 3, dtype=D), t([1.0, -1.0]), torch.ones(2, 3, dtype=torch.bool)


def test_ppo_clip_both_sides():
    logp, old, adv, mask = _ppo_case()
    loss, m = ppo_clip_loss(logp, old, adv, mask)
    # per-token losses: [-1.2, -0.9, -0.5], [0.8, 1.1, 1.5]; token-mean
    close(loss, (-1.2 - 0.9 - 0.5 + 0.8 + 1.1 + 1.5) / 6)
    close(m["actor/pg_clipfrac"], 2 / 6)
    close(m["actor/pg_clipfrac_high"], 1 / 6)
    close(m["actor/pg_clipfrac_low"], 1 / 6)
    close(m["actor/ratio_mean"], (1.5 + 0.9 + 0.5 + 0.5 + 1.1 + 1.5) / 6)
    close(m["actor/ratio_max"], 1.5)
    close(m["actor/ratio_min"], 0.5)
    close(m["actor/ppo_kl"], -sum(math.log(x) for x in (1.5, 0.9, 0.5, 0.5, 1.1, 1.5)) / 6)
    close(m["actor/pg_loss"], float(loss))


def test_ppo_clip_higher_asymmetric():
    logp, old, adv, mask = _ppo_case()
    loss, m = ppo_clip_loss(logp, old, adv, mask, eps_low=0.2, eps_high=0.28)
    close(loss, (-1.28 - 0.9 - 0.5 + 0.8 + 1.1 + 1.5) / 6)
    loss, m = ppo_clip_loss(logp, old, adv, mask, eps_low=0.6, eps_high=0.6)  # nothing clipped
    close(loss, (-1.5 - 0.9 - 0.5 + 0.5 + 1.1 + 1.5) / 6)
    assert m["actor/pg_clipfrac"] == 0.0


def test_ppo_log_ratio_clamped_at_20():
    logp, old = t([[30.0, 0.0]]), t([[0.0, 0.0]])
    _, m = ppo_clip_loss(logp, old, t([-1.0]), torch.ones(1, 2))
    close(m["actor/ratio_max"], math.exp(20), tol=1e-3)


# ---------------------------------------------------------------- dual-clip (verl clip_ratio_c)


def _dual_case():
    # row 0: A = -1, ratios 10 (dual-clipped: max(10, 1.2) = 10 > 3 -> 3), 1.5 (kept), 0.5 (low clip: 0.8)
    # row 1: A = +1, ratios 10 (high clip: -1.2), 1.0, 0.5 (-0.5); row 2: A = -2, ratio 10 -> -A c = 6, 2.0 -> 4
    ratios = t([[10.0, 1.5, 0.5], [10.0, 1.0, 0.5], [10.0, 2.0, 1.0]])
    return (
        ratios.log().requires_grad_(),
        torch.zeros(3, 3, dtype=D),
        t([-1.0, 1.0, -2.0]),
        torch.ones(3, 3, dtype=torch.bool),
    )


def test_dual_clip_bounds_negative_advantage_at_minus_a_c():
    logp, old, adv, mask = _dual_case()
    loss, m = ppo_clip_loss(logp, old, adv, mask, clip_ratio_c=3.0)
    per_token = [3.0, 1.5, 0.8, -1.2, -1.0, -0.5, 6.0, 4.0, 2.0]
    close(loss, sum(per_token) / 9)
    close(m["actor/pg_clipfrac_lower"], 2 / 9)  # the two ratio-10 tokens of A < 0 rows
    close(m["actor/pg_clipfrac"], 2 / 9)  # PPO's own clip count is unchanged: the 0.5 of row 0, the 10 of row 1
    loss.backward()
    # a bounded token's loss is the constant -A c: no gradient; d(-A r)/d log r = -A r elsewhere (unclipped), / 9
    close(logp.grad, t([[0, 1.5, 0], [0, -1.0, -0.5], [0, 4.0, 2.0]]) / 9)
    # without dual-clip the ratio-10 tokens cost -A r = 10 and 20, with gradient -A r
    logp2 = logp.detach().clone().requires_grad_()
    off, m_off = ppo_clip_loss(logp2, old, adv, mask)
    close(off, (10 + 1.5 + 0.8 - 1.2 - 1.0 - 0.5 + 20 + 4 + 2) / 9)
    assert "actor/pg_clipfrac_lower" not in m_off  # logged only when dual-clip is on
    off.backward()
    close(logp2.grad[:, 0], t([10.0, 0, 20.0]) / 9)


def test_dual_clip_leaves_positive_advantages_and_small_ratios_bitwise_unchanged():
    g = torch.Generator().manual_seed(5)
    logp = (2 * torch.randn(6, 7, generator=g, dtype=D)).requires_grad_()  # ratios from ~e^-6 to ~e^6
    old, mask = torch.zeros(6, 7, dtype=D), torch.rand(6, 7, generator=g) < 0.8
    for adv in (t([1.0, 0.5, 2.0, 0.0, 3.0, 0.1]), t([-1.0, -0.5, -2.0, 0.0, -3.0, -0.1])):
        lp = logp if adv.min() >= 0 else (logp.detach().clamp(max=math.log(2.9))).requires_grad_()  # r < c
        grads = []
        for c in (None, 3.0):
            lp.grad = None
            loss, m = ppo_clip_loss(lp, old, adv, mask, clip_ratio_c=c, agg="seq-mean-token-mean")
            loss.backward()
            grads.append((loss.detach(), lp.grad.clone(), {k: m[k] for k in m if k != "actor/pg_clipfrac_lower"}))
        assert torch.equal(grads[0][0], grads[1][0]) and torch.equal(grads[0][1], grads[1][1])
        assert grads[0][2] == grads[1][2]


def test_dual_clip_off_is_the_old_loss_bitwise():
    # the loss before dual-clip existed, op for op: max(-A r, -A clip(r)) * w, token-mean
    g = torch.Generator().manual_seed(7)
    logp = (-3 * torch.rand(5, 6, generator=g, dtype=D)).requires_grad_()
    old = -3 * torch.rand(5, 6, generator=g, dtype=D)
    adv, w = torch.randn(5, generator=g, dtype=D), 1 + torch.rand(5, 6, generator=g, dtype=D)
    mask = torch.rand(5, 6, generator=g) < 0.7
    loss, _ = ppo_clip_loss(logp, old, adv, mask, weights=w)
    loss_none, _ = ppo_clip_loss(logp, old, adv, mask, weights=w, clip_ratio_c=None)
    r, a = torch.where(mask, logp - old, torch.zeros_like(logp)).exp(), adv[:, None]
    want = agg_loss(torch.maximum(-a * r, -a * r.clamp(0.8, 1.2)) * torch.where(mask, w, torch.zeros_like(w)), mask)
    assert torch.equal(loss, want) and torch.equal(loss_none, want)


def test_dual_clip_matches_verl_compute_policy_loss_vanilla():
    # verl core_algos.compute_policy_loss_vanilla's dual-clip lines, transcribed
    g = torch.Generator().manual_seed(11)
    logp, old = 3 * torch.randn(8, 5, generator=g, dtype=D), torch.zeros(8, 5, dtype=D)
    advantages = torch.randn(8, 1, generator=g, dtype=D).expand(8, 5)
    mask = torch.ones(8, 5, dtype=torch.bool)
    ratio = torch.exp(torch.clamp(logp - old, min=-20.0, max=20.0))
    pg_losses1 = -advantages * ratio
    pg_losses2 = -advantages * torch.clamp(ratio, 1 - 0.2, 1 + 0.28)
    clip_pg_losses1 = torch.maximum(pg_losses1, pg_losses2)
    pg_losses3 = -advantages * 3.0
    clip_pg_losses2 = torch.min(pg_losses3, clip_pg_losses1)
    lower = (torch.gt(clip_pg_losses1, pg_losses3) * (advantages < 0).to(D)).mean()  # verl: .float()
    pg_losses = torch.where(advantages < 0, clip_pg_losses2, clip_pg_losses1)
    loss, m = ppo_clip_loss(logp, old, advantages, mask, eps_high=0.28, clip_ratio_c=3.0)
    close(loss, pg_losses.mean(), tol=1e-12)
    close(m["actor/pg_clipfrac_lower"], lower)
    assert 0 < m["actor/pg_clipfrac_lower"] < 1  # the case exercises the bound


@pytest.mark.parametrize("c", [1.0, 0.5, 0.0, -3.0, math.inf, math.nan])
def test_dual_clip_out_of_range_is_a_one_line_error(c):
    logp, old, adv, mask = _dual_case()
    with pytest.raises(
        ValueError,
        match=r"clip_ratio_c: .* is out of range; valid: None \(dual-clip off\) or a "
        r"finite number > 1",
    ) as e:
        ppo_clip_loss(logp, old, adv, mask, clip_ratio_c=c)
    assert "\n" not in str(e.value)


def test_dual_clip_is_offered_by_the_ppo_clip_algorithms_only():
    assert all(a.dual_clip == (a.loss is ppo_clip_loss) for a in ALGORITHMS.values())
    assert get_algorithm("grpo").dual_clip and not get_algorithm("gspo").dual_clip


# aggregation case: ratio 1 so the per-token loss is -A; A = [[1, 2, 3, 9], [4, 9, 9, 9]],
# mask [[1, 1, 1, 0], [1, 0, 0, 0]] (the 9s are masked out), T = 4
AGG_EXPECTED = {
    "token-mean": -(1 + 2 + 3 + 4) / 4,
    "seq-mean-token-mean": -((1 + 2 + 3) / 3 + 4 / 1) / 2,
    "seq-mean-token-sum": -((1 + 2 + 3) + 4) / 2,
    "seq-mean-token-sum-norm": -((1 + 2 + 3) / 4 + 4 / 4) / 2,
}


def _agg_case():
    adv = t([[1.0, 2, 3, 9], [4, 9, 9, 9]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]], dtype=torch.bool)
    return torch.zeros(2, 4, dtype=D), torch.zeros(2, 4, dtype=D), adv, mask


@pytest.mark.parametrize("agg", list(AGG_EXPECTED))
def test_each_aggregation(agg):
    logp, old, adv, mask = _agg_case()
    loss, _ = ppo_clip_loss(logp, old, adv, mask, agg=agg)
    close(loss, AGG_EXPECTED[agg])


def test_sum_norm_constant_and_masked_row_equals_dropped_row():
    logp, old, adv, mask = _agg_case()
    loss, _ = ppo_clip_loss(logp, old, adv, mask, agg="seq-mean-token-sum-norm", norm_const=10)
    close(loss, -((1 + 2 + 3) / 10 + 4 / 10) / 2)
    # a fully masked third row (a rejected sequence) changes no aggregation
    z = torch.zeros(1, 4, dtype=D)
    big = [torch.cat([x, z.to(x.dtype)]) for x in (logp, old, adv)] + [torch.cat([mask, z.bool()])]
    for agg, want in AGG_EXPECTED.items():
        close(ppo_clip_loss(*big, agg=agg)[0], want)
    with pytest.raises(ValueError, match="valid: token-mean"):
        agg_loss(adv, mask, "token-sum")


def test_weights_multiply_and_are_detached():
    logp, old, adv, mask = _agg_case()
    w = t([[2.0, 1, 1, 1], [0.5, 1, 1, 1]]).requires_grad_()
    loss, _ = ppo_clip_loss(logp.requires_grad_(), old, adv, mask, weights=w)
    close(loss, -(2 * 1 + 2 + 3 + 0.5 * 4) / 4)
    loss.backward()
    assert w.grad is None


def test_gradient_sign():
    logp = torch.zeros(2, 2, dtype=D, requires_grad=True)
    adv, mask, old = t([1.0, -1.0]), torch.ones(2, 2), torch.zeros(2, 2, dtype=D)
    loss, _ = ppo_clip_loss(logp, old, adv, mask)
    loss.backward()
    # at r = 1, d(-A r)/d logp = -A, over 4 tokens
    close(logp.grad, [[-0.25, -0.25], [0.25, 0.25]])
    step = torch.tensor([[0.01, 0.0], [0.0, 0.0]], dtype=D)  # raise logp of a positive-advantage token
    assert ppo_clip_loss(logp.detach() + step, old, adv, mask)[0] < loss
    # a token clipped on the high side carries no gradient
    lp = t([[math.log(1.5)]]).requires_grad_()
    ppo_clip_loss(lp, torch.zeros(1, 1, dtype=D), t([1.0]), torch.ones(1, 1))[0].backward()
    assert lp.grad.item() == 0.0


# ---------------------------------------------------------------- GSPO


def _gspo_case():
    # row 0 mean log-ratio (0.3 - 0.1 + 0.1) / 3 = 0.1; row 1 (-0.2 + 0.0) / 2 = -0.1 (5.0 is masked out)
    logp = t([[0.3, -0.1, 0.1], [-0.2, 0.0, 5.0]]).requires_grad_()
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.bool)
    return logp, torch.zeros(2, 3, dtype=D), t([1.0, -1.0]), mask


def test_gspo_sequence_ratio_and_gradient():
    logp, old, adv, mask = _gspo_case()
    s0, s1 = math.exp(0.1), math.exp(-0.1)
    loss, m = gspo_loss(logp, old, adv, mask, eps_low=0.2, eps_high=0.2)  # wide: no clipping
    close(loss, (-s0 + s1) / 2)  # seq-mean-token-mean of -A s_i
    close(m["actor/ratio_max"], s0)
    close(m["actor/ratio_min"], s1)
    loss.backward()
    # d s_{i,t} / d logp_t = s_i; weight 1/2 per sequence, 1/|y_i| per token
    close(logp.grad, [[-s0 / 6] * 3, [s1 / 4, s1 / 4, 0.0]])


def test_gspo_default_clip():
    logp, old, adv, mask = _gspo_case()
    loss, m = gspo_loss(logp, old, adv, mask)  # eps 3e-4 / 4e-4: both sequences clipped
    close(loss, (-(1 + 4e-4) + (1 - 3e-4)) / 2)
    close(m["actor/pg_clipfrac"], 1.0)
    loss.backward()
    assert logp.grad.abs().max() == 0.0


# ---------------------------------------------------------------- KL penalty


def test_kl_penalty_estimators():
    lp, ref = t([math.log(0.5)]), t([math.log(0.25)])
    close(kl_penalty(lp, ref, "k1"), [math.log(2)])
    close(kl_penalty(lp, ref, "kl"), [math.log(2)])
    close(kl_penalty(lp, ref, "abs"), [math.log(2)])
    close(kl_penalty(lp, ref, "mse"), [0.5 * math.log(2) ** 2])
    close(kl_penalty(lp, ref), [0.5 + math.log(2) - 1])  # k3: exp(-ln 2) - (-ln 2) - 1
    with pytest.raises(ValueError, match="low_var_kl"):
        kl_penalty(lp, ref, "k9")


# ---------------------------------------------------------------- registry


def test_registry_entries():
    assert {"grpo", "dapo", "drgrpo", "reinforce", "reinforce_pp", "gspo"} <= set(ALGORITHMS)
    dapo = get_algorithm("dapo")
    assert (dapo.eps_low, dapo.eps_high, dapo.agg, dapo.dynamic_sampling) == (0.2, 0.28, "token-mean", True)
    gspo = get_algorithm("gspo")
    assert gspo.loss is gspo_loss and (gspo.eps_low, gspo.eps_high) == (3e-4, 4e-4)
    assert get_algorithm("drgrpo").agg == "seq-mean-token-sum-norm"
    assert get_algorithm("drgrpo").advantage is drgrpo_advantage
    assert all(a.doc for a in ALGORITHMS.values())


def test_registry_error_lists_names():
    with pytest.raises(ValueError) as e:
        get_algorithm("ppo2")
    msg = str(e.value)
    assert "\n" not in msg and "ppo2" in msg and all(n in msg for n in ALGORITHMS)


@pytest.mark.parametrize("name", list(ALGORITHMS))
def test_every_algorithm_runs(name):
    algo = get_algorithm(name)
    g = torch.Generator().manual_seed(0)
    adv = algo.advantage(REWARDS, 4)
    assert adv.shape == (8,)
    logp = (-torch.rand(8, 5, generator=g, dtype=D)).requires_grad_()
    old = logp.detach() + 0.01 * torch.randn(8, 5, generator=g, dtype=D)
    loss, m = algo.loss(logp, old, adv, torch.ones(8, 5), **algo.loss_kwargs)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(logp.grad).all() and "actor/ppo_kl" in m


@pytest.mark.parametrize("loss_fn", [ppo_clip_loss, gspo_loss])
@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_nan_and_inf_padding_reach_neither_loss_nor_gradient(loss_fn, agg):
    g = torch.Generator().manual_seed(3)
    clean_lp = -torch.rand(3, 5, generator=g, dtype=D)
    old = clean_lp + 0.1 * torch.randn(3, 5, generator=g, dtype=D)
    adv, weights = t([1.0, -0.5, 2.0]), 1 + torch.rand(3, 5, generator=g, dtype=D)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]], dtype=torch.bool)
    pad = lambda x, v: torch.where(mask, x, torch.full_like(x, v))  # noqa: E731

    def run(lp, old_lp, w):
        lp = lp.clone().requires_grad_()
        loss, metrics = loss_fn(lp, old_lp, adv, mask, agg=agg, weights=w, eps_low=0.05, eps_high=0.05)
        loss.backward()
        return loss.detach(), metrics, lp.grad

    want = run(clean_lp, old, weights)
    assert torch.isfinite(want[2]).all() and bool((want[2][mask] != 0).any())
    for v in (math.nan, -math.inf, math.inf):
        got = run(pad(clean_lp, v), pad(old, -math.inf), pad(weights, math.nan))
        assert got[0] == want[0] and got[1] == want[1], v
        assert torch.equal(got[2][mask], want[2][mask]) and not got[2][~mask].any(), v
