"""verl and TRL vocabularies: every preset and mode against weights and masks computed by hand (plain Python
from verl's / TRL's documented formulas), the +-20 clamp rules, the mode hook and the one-line errors."""

import json
import math

import pytest
import torch

from timbench.cli import main
from timbench.remedies import RemedyBatch, load_remedy
from timbench.remedies.registry import VOCABULARY
from timbench.remedies.trl import TRL_MODES
from timbench.remedies.verl import VERL_PRESETS

# log pi_old - log mu per token; the last token of row 3 and all of row 6 are masked out.
DELTA = [
    [0.0, 0.0, 0.0],  # r0 no mismatch
    [math.log(3), 0.0, -0.1],  # r1 one rho = 3
    [-0.8, 0.05, 0.02],  # r2 a low token (rho 0.45)
    [25.0, -10.0, 99.0],  # r3 |delta| > 20: per-token clamp gives 20 - 10 = 10, the raw sum 15
    [5e-4, -5e-4, 1e-3],  # r4 tiny mismatch
    [15.0, 8.0, 0.1],  # r5 raw sum 23.1 > 20: the sequence ratio is clamped at e^20 (verl), not by TRL
    [9.0, 9.0, 9.0],  # r6 empty row
]
MASK = [[True] * 3] * 3 + [[True, True, False]] + [[True] * 3] * 2 + [[False] * 3]
N = len(DELTA)
TOKENS = [(i, t) for i in range(N) for t in range(3) if MASK[i][t]]


def batch(delta=DELTA):
    roll = torch.full((N, 3), -2.0, dtype=torch.float64)
    return RemedyBatch(roll + torch.tensor(delta, dtype=torch.float64), roll, torch.zeros(N), torch.tensor(MASK), 2)


def d(i, t):  # the raw difference as the tensors hold it
    b = batch()
    return float(b.old_logprobs[i, t]) - float(b.rollout_logprobs[i, t])


def lr(i, t):  # verl's log_ratio_safe
    return max(-20.0, min(20.0, d(i, t)))


def toks(i):
    return [t for t in range(3) if MASK[i][t]]


def seq(i, fn, agg, x=lr):
    vals = [fn(x(i, t)) for t in toks(i)]
    return {"sum": math.fsum(vals), "mean": math.fsum(vals) / len(vals), "max": max(vals)}[agg]


K1, K2, K3 = (lambda x: -x), (lambda x: 0.5 * x * x), (lambda x: math.exp(x) - 1 - x)
ident = lambda x: x


def check(r, weight=None, keep=None):
    keep = keep or (lambda i, t: True)
    assert not r.mask[~torch.tensor(MASK)].any()
    for i, t in TOKENS:
        assert bool(r.mask[i, t]) == keep(i, t), (i, t)
        if weight is None:
            assert r.weights is None
        else:
            assert float(r.weights[i, t]) == pytest.approx(weight(i, t), rel=1e-12, abs=1e-300), (i, t)


def test_decoupled_token_is_is_token_tis():
    r = load_remedy("verl:decoupled_token_is")(batch())
    check(r, weight=lambda i, t: min(math.exp(lr(i, t)), 2.0))
    m = torch.tensor(MASK)  # the same mapping, the same bits (outside the mask verl's weights are 0, timbench's 1)
    assert torch.equal(r.weights[m], load_remedy("tis_token")(batch()).weights[m])


def test_sequence_is_clamps_the_raw_sum_not_a_sum_of_clamped_tokens():
    r = load_remedy("verl", {"rollout_is": "sequence", "rollout_is_threshold": 1e12})(batch())
    w = lambda i, t: math.exp(max(-20.0, min(20.0, seq(i, ident, "sum", x=d))))
    check(r, weight=w)
    assert float(r.weights[3, 0]) == pytest.approx(math.exp(15.0))  # per-token clamping would give e^10
    assert float(r.weights[5, 0]) == pytest.approx(math.exp(20.0))  # the sum 23.1 is clamped once
    capped = load_remedy("verl:decoupled_seq_is")(batch())
    check(capped, weight=lambda i, t: min(w(i, t), 2.0))


def test_icepop_threshold_zeroes_weights_outside_the_band_without_masking():
    r = load_remedy("verl:decoupled_token_icepop")(batch())
    rho = lambda i, t: math.exp(lr(i, t))
    check(r, weight=lambda i, t: rho(i, t) if 0.5 <= rho(i, t) <= 5.0 else 0.0)
    oob = sum(1 for i, t in TOKENS if not 0.5 <= rho(i, t) <= 5.0)
    assert r.metrics["rollout_corr/rollout_is_oob_ratio"] == pytest.approx(oob / len(TOKENS))
    assert r.metrics["rollout_corr/rollout_rs_masked_fraction"] == 0.0


def test_geo_rs_uses_verl_k1_bounds():
    # verl: keep when log(0.999) <= mean_t k1 = -mean_t log r <= log(1.001)
    g = lambda i: seq(i, K1, "mean")
    r = load_remedy("verl:decoupled_geo_rs")(batch())
    check(r, keep=lambda i, t: math.log(0.999) <= g(i) <= math.log(1.001))
    assert [bool(r.mask[i].any()) for i in range(6)] == [True, False, False, False, True, False]


def test_seq_is_rs_weights_on_the_raw_sum_and_rejects_on_the_clamped_k1_sum():
    r = load_remedy("verl:decoupled_seq_is_rs")(batch())
    w = lambda i, t: min(math.exp(max(-20.0, min(20.0, seq(i, ident, "sum", x=d)))), 2.0)
    check(r, weight=w, keep=lambda i, t: math.log(0.5) <= seq(i, K1, "sum") <= math.log(2.0))
    assert r.metrics["rollout_corr/rollout_rs_seq_sum_k1_masked_fraction"] == pytest.approx(
        sum(len(toks(i)) for i in (1, 2, 3, 5)) / len(TOKENS)
    )


@pytest.mark.parametrize("preset, builtin", [("decoupled_k3_rs", "k3_rs")])
def test_k3_rs_matches_the_builtin_and_the_hand_value(preset, builtin):
    r = load_remedy(f"verl:{preset}")(batch())
    check(r, keep=lambda i, t: seq(i, K3, "mean") <= 0.01)
    assert torch.equal(r.mask, load_remedy(builtin)(batch()).mask)


@pytest.mark.parametrize(
    "rs, threshold, keep",
    [
        ("token_k1", "0.6_1.6", lambda i, t: math.log(0.6) <= K1(lr(i, t)) <= math.log(1.6)),
        ("token_k1", "2.0", lambda i, t: math.log(0.5) <= K1(lr(i, t)) <= math.log(2.0)),  # lone U means 1/U_U
        ("token_k2", "0.02", lambda i, t: K2(lr(i, t)) <= 0.02),
        ("token_k3", "0.05", lambda i, t: K3(lr(i, t)) <= 0.05),
        ("seq_sum_k2", "0.5", lambda i, t: seq(i, K2, "sum") <= 0.5),
        ("seq_sum_k3", "0.5", lambda i, t: seq(i, K3, "sum") <= 0.5),
        ("seq_mean_k2", "0.05", lambda i, t: seq(i, K2, "mean") <= 0.05),
        ("seq_max_k2", "0.3", lambda i, t: seq(i, K2, "max") <= 0.3),
        ("seq_max_k3", "0.3", lambda i, t: seq(i, K3, "max") <= 0.3),
        (
            "token_k1,seq_max_k2",
            "0.6_1.6,2.5",
            lambda i, t: math.log(0.6) <= K1(lr(i, t)) <= math.log(1.6) and seq(i, K2, "max") <= 2.5,
        ),
        ("seq_mean_k3,token_k2", "0.01", lambda i, t: seq(i, K3, "mean") <= 0.01 and K2(lr(i, t)) <= 0.01),
    ],
)
def test_every_rs_criterion_and_chains(rs, threshold, keep):
    r = load_remedy("verl", {"rollout_is": None, "rollout_rs": rs, "rollout_rs_threshold": threshold})(batch())
    check(r, keep=keep)
    for crit in rs.split(","):
        assert f"rollout_corr/rollout_rs_{crit}_masked_fraction" in r.metrics


def test_batch_normalize_divides_by_the_batch_mean():
    r = load_remedy("verl", {"rollout_is": "token", "rollout_is_batch_normalize": True})(batch())
    raw = {(i, t): min(math.exp(lr(i, t)), 2.0) for i, t in TOKENS}
    mean = math.fsum(raw.values()) / len(raw)
    check(r, weight=lambda i, t: raw[(i, t)] / mean)
    assert r.metrics["rollout_corr/rollout_is_batch_norm_factor"] == pytest.approx(mean)
    s = load_remedy("verl", {"rollout_is": "sequence", "rollout_is_batch_normalize": True})(batch())
    rows = [i for i in range(N) if toks(i)]
    seq_w = {i: min(math.exp(max(-20.0, min(20.0, seq(i, ident, "sum", x=d)))), 2.0) for i in rows}
    check(s, weight=lambda i, t: seq_w[i] / (math.fsum(seq_w.values()) / len(rows)))


@pytest.mark.parametrize("mode", TRL_MODES)
@pytest.mark.parametrize("args", [{}, {"vllm_importance_sampling_cap": 1e11, "vllm_importance_sampling_clip_min": 0.5}])
def test_trl_modes(mode, args):
    cap = args.get("vllm_importance_sampling_cap", 3.0)
    low = args.get("vllm_importance_sampling_clip_min")
    level, _, how = mode.partition("_")
    # TRL: no +-20 clamp anywhere; sequence modes exponentiate the raw sum
    ratio = (
        (lambda i, t: math.exp(seq(i, ident, "sum", x=d))) if level == "sequence" else (lambda i, t: math.exp(d(i, t)))
    )
    if how == "truncate":
        w = lambda i, t: min(max(ratio(i, t), low if low is not None else -math.inf), cap)
    else:
        w = lambda i, t: 0.0 if ratio(i, t) > cap or (low is not None and ratio(i, t) < low) else ratio(i, t)
    r = load_remedy(f"trl:{mode}", args)(batch())
    check(r, weight=w)  # weights only: TRL zeroes, it never drops a token from the loss
    if level == "sequence" and args:
        assert float(r.weights[5, 0]) == pytest.approx(math.exp(23.1))  # beyond verl's e^20


def test_trl_default_cap_is_3():
    r = load_remedy("trl:sequence_mask")(batch())
    assert float(r.weights[1, 0]) == pytest.approx(3 * math.exp(-0.1))  # 2.71 <= 3 is kept
    assert load_remedy("trl:sequence_mask").params.vllm_importance_sampling_cap == 3.0


@pytest.mark.parametrize("name", sorted(VOCABULARY))
def test_zero_mismatch_is_a_no_op_for_every_preset_and_mode(name):
    b = batch([[0.0] * 3] * N)
    r = load_remedy(name)(b)
    assert torch.equal(r.mask, b.mask)
    assert r.weights is None or bool((r.weights[b.mask] == 1.0).all())
    base = load_remedy("none")(b).metrics
    assert {k: v for k, v in r.metrics.items() if k in base} == base


def test_list_shows_every_verl_preset_and_trl_mode(capsys):
    assert main(["remedies", "list", "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    for p in (
        "decoupled_token_is",
        "decoupled_seq_is",
        "decoupled_seq_is_rs",
        "decoupled_geo_rs",
        "decoupled_k3_rs",
        "bypass_ppo_clip",
        "bypass_ppo_clip_geo_rs",
    ):
        assert f"verl:{p}" in rows and p in VERL_PRESETS
    assert {f"verl:{p}" for p in VERL_PRESETS} | {f"trl:{m}" for m in TRL_MODES} | {"verl"} <= set(rows)
    assert rows["verl:bypass_ppo_clip"]["hooks"]["mode"] == "bypass"
    assert rows["verl:decoupled_geo_rs"]["params"]["rollout_rs"] == "seq_mean_k1"
    assert rows["trl:sequence_mask"]["params"] == {
        "vllm_importance_sampling_cap": 3.0,
        "vllm_importance_sampling_clip_min": None,
    }


def test_bypass_presets_set_the_mode_or_refuse_a_conflicting_one():
    from timbench.rl.config import from_dict

    base = {"steps": 1, "eval_n": 4}
    assert from_dict({**base, "remedy": "verl:bypass_ppo_clip", "mode": "bypass"}).remedy_impl.mode == "bypass"
    with pytest.raises(ValueError, match="implies mode=bypass .* config says mode=recompute; set mode: bypass") as e:
        from_dict({**base, "remedy": "verl:bypass_ppo_clip_geo_rs", "mode": "recompute"})
    assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match="implies mode=recompute"):
        from_dict({**base, "remedy": "verl:decoupled_geo_rs", "mode": "bypass"})
    assert from_dict({**base, "remedy": "verl", "remedy_args": {"bypass_mode": True}, "mode": "bypass"})


@pytest.mark.parametrize(
    "spec, args, message",
    [
        ("verl:nope", {}, r"unknown verl remedy 'verl:nope'; valid: verl:\{decoupled_token_is, "),
        ("trl:nope", {}, r"unknown trl remedy 'trl:nope'; valid: trl:\{token_truncate, "),
        ("verl", {"rollout_is": "seq"}, "rollout_is 'seq' is invalid; valid: token, sequence, null"),
        ("verl", {"rollout_rs": "seq_max_k1", "rollout_rs_threshold": "2"}, "criterion 'seq_max_k1' is invalid"),
        ("verl", {"rollout_rs": "token_k2"}, "needs rollout_rs_threshold"),
        ("verl", {"rollout_rs": "token_k2,seq_mean_k3", "rollout_rs_threshold": "1,2,3"}, "gives 3 thresholds for 2"),
        ("verl", {"rollout_rs": "token_k2", "rollout_rs_threshold": "0.5_2"}, "k2/k3 criteria take one upper bound"),
        ("verl", {"rollout_is_threshold": "2_1"}, "lower bound must be <= upper bound"),
        ("verl", {"rollout_is_threshold": "-1"}, "must be a finite number > 0"),
        ("trl:token_mask", {"vllm_importance_sampling_clip_min": 5.0}, r"must be in \[0, cap=3.0\)"),
    ],
)
def test_bad_vocabulary_is_a_one_line_error(spec, args, message):
    with pytest.raises(ValueError, match=message) as e:
        load_remedy(spec, args)
    assert "\n" not in str(e.value)


# verl's presets as verl/trainer/config/algorithm.py defines them (rollout_is, is threshold, rollout_rs, rs threshold,
# bypass_mode); the reference also lists the token IcePop presets.
VERL_TABLE = {
    "decoupled_token_is": ("token", "2.0", None, None, False),
    "decoupled_seq_is": ("sequence", "2.0", None, None, False),
    "decoupled_token_icepop": ("token", "0.5_5.0", None, None, False),
    "decoupled_seq_is_rs": ("sequence", "2.0", "seq_sum_k1", "0.5_2.0", False),
    "decoupled_geo_rs": (None, "2.0", "seq_mean_k1", "0.999_1.001", False),
    "decoupled_geo_rs_seq_tis": ("sequence", "2.0", "seq_mean_k1", "0.999_1.001", False),
    "decoupled_geo_rs_token_tis": ("token", "2.0", "seq_mean_k1", "0.999_1.001", False),
    "decoupled_k3_rs": (None, "2.0", "seq_mean_k3", "0.01", False),
    "decoupled_k3_rs_seq_tis": ("sequence", "2.0", "seq_mean_k3", "0.01", False),
    "decoupled_k3_rs_token_tis": ("token", "2.0", "seq_mean_k3", "0.01", False),
    "bypass_ppo_clip": (None, "2.0", None, None, True),
    "bypass_ppo_clip_geo_rs": (None, "2.0", "seq_mean_k1", "0.999_1.001", True),
    "bypass_ppo_clip_k3_rs": (None, "2.0", "seq_mean_k3", "0.01", True),
    "bypass_pg_is": ("sequence", "2.0", None, None, True),
    "bypass_pg_token_icepop": ("token", "0.5_5.0", None, None, True),
    "bypass_pg_geo_rs": (None, "2.0", "seq_mean_k1", "0.999_1.001", True),
    "bypass_pg_geo_rs_seq_tis": ("sequence", "2.0", "seq_mean_k1", "0.999_1.001", True),
    "bypass_pg_geo_rs_token_tis": ("token", "2.0", "seq_mean_k1", "0.999_1.001", True),
    "disabled": (None, "2.0", None, None, False),
}


def verl_by_hand(rollout_is, is_thr, rs, rs_thr):
    """Plain-Python verl: (weight(i, t) or None, keep(i, t))."""

    def weight(i, t):
        raw = (
            math.exp(lr(i, t)) if rollout_is == "token" else math.exp(max(-20.0, min(20.0, seq(i, ident, "sum", x=d))))
        )
        if "_" in is_thr:
            lo, hi = map(float, is_thr.split("_"))
            return raw if lo <= raw <= hi else 0.0
        return min(raw, float(is_thr))

    def keep(i, t):
        for crit, thr in zip(rs.split(","), rs_thr.split(",")) if rs else []:
            level, k = crit.rsplit("_", 1)
            fn = {"k1": K1, "k2": K2, "k3": K3}[k]
            stat = fn(lr(i, t)) if level == "token" else seq(i, fn, level.removeprefix("seq_"))
            if k == "k1":
                lo, hi = map(float, thr.split("_"))
                ok = math.log(lo) <= stat <= math.log(hi)
            else:
                ok = stat <= float(thr)
            if not ok:
                return False
        return True

    return (weight if rollout_is else None), keep


@pytest.mark.parametrize("preset", sorted(VERL_TABLE))
def test_every_verl_preset_by_hand(preset):
    rollout_is, is_thr, rs, rs_thr, bypass = VERL_TABLE[preset]
    remedy = load_remedy(f"verl:{preset}")
    p = remedy.params
    assert (p.rollout_is, p.rollout_is_threshold, p.rollout_rs, p.rollout_rs_threshold, p.bypass_mode) == VERL_TABLE[
        preset
    ]
    assert remedy.mode == ("bypass" if bypass else "recompute")
    weight, keep = verl_by_hand(rollout_is, is_thr, rs, rs_thr)
    check(remedy(batch()), weight=weight, keep=keep)
    assert set(VERL_PRESETS) == set(VERL_TABLE)
