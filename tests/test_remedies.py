"""Remedies: every formula on a hand-made batch, the registry and CLI, plug-in loading, loop integration."""

import importlib.metadata
import json
import math

import pytest
import torch

from timbench.cli import main
from timbench.model import PRESETS, Qwen3ForCausalLM, save_checkpoint
from timbench.remedies import (
    METRIC_NAMES,
    REMEDIES,
    RemedyBatch,
    RemedyResult,
    check_result,
    list_remedies,
    load_remedy,
    replay_tensor,
)
from timbench.rl import loop as loop_mod
from timbench.rl import step as step_mod
from timbench.rl.config import load_config
from timbench.rl.loop import run
from timbench.tasks.base import Task
from timbench.trainer import update as update_mod

# ---------------------------------------------------------------- a hand-made batch

# delta = log pi_old - log mu per token; row 3's last token and all of row 7 are masked out (their
# junk values must not matter); 25.0 checks verl's +-20 clamp.
DELTA = [
    [0.0, 0.0, 0.0],  # r0 no mismatch
    [math.log(3), 0.0, -0.1],  # r1 one token with rho = 3
    [-0.8, 0.05, 0.02],  # r2 a low token (rho 0.45)
    [0.3, 25.0, 30.0],  # r3 an extreme token (clamped to 20), last token masked
    [5e-4, -5e-4, 1e-3],  # r4 tiny mismatch
    [0.2, -0.2, 0.1],  # r5 moderate
    [0.1, -0.1, 0.0],  # r6 mean log rho = 0 but k3 > 0
    [9.0, 9.0, 9.0],  # r7 empty row (e.g. dropped by dynamic sampling)
]
MASK = [[True] * 3] * 3 + [[True, True, False]] + [[True] * 3] * 3 + [[False] * 3]
ROWS = [i for i, m in enumerate(MASK) if any(m)]
TOKENS = [(i, t) for i in range(8) for t in range(3) if MASK[i][t]]


def _batch(delta=DELTA):
    roll = torch.full((8, 3), -2.0, dtype=torch.float64)
    return RemedyBatch(
        roll + torch.tensor(delta, dtype=torch.float64), roll, torch.zeros(8), torch.tensor(MASK), group_size=2
    )


def _lr(i, t):  # the reference value, recomputed in plain Python from the batch's own tensors
    b = _batch()
    return max(-20.0, min(20.0, float(b.old_logprobs[i, t]) - float(b.rollout_logprobs[i, t])))


def _seq(i, fn, agg):
    vals = [fn(_lr(i, t)) for t in range(3) if MASK[i][t]]
    return {"sum": sum(vals), "mean": sum(vals) / len(vals), "max": max(vals)}[agg]


def _k3(x):
    return math.exp(x) - 1 - x


def _check(result, weight=None, keep=None, truncated=None):
    """Compare a result with per-token expectations (functions of (row, token)) on masked-in tokens."""
    keep = keep or (lambda i, t: True)
    assert result.mask.dtype == torch.bool and result.mask.shape == (8, 3)
    assert not result.mask[~torch.tensor(MASK)].any()  # never resurrects a masked-out token
    for i, t in TOKENS:
        assert bool(result.mask[i, t]) == keep(i, t), (i, t)
        if weight is None:
            assert result.weights is None
        else:
            assert float(result.weights[i, t]) == pytest.approx(weight(i, t), rel=1e-12), (i, t)
    kept = [(i, t) for i, t in TOKENS if keep(i, t)]
    ws = [weight(i, t) if weight else 1.0 for i, t in kept]
    m = result.metrics
    assert m[METRIC_NAMES["remedy/token_masked_frac"]] == pytest.approx(1 - len(kept) / len(TOKENS))
    dropped_rows = {i for i, t in TOKENS if not keep(i, t)}
    assert m[METRIC_NAMES["remedy/seq_masked_frac"]] == pytest.approx(len(dropped_rows) / len(ROWS))
    n_trunc = sum(1 for i, t in TOKENS if truncated and truncated(i, t))
    assert m[METRIC_NAMES["remedy/token_truncated_frac"]] == pytest.approx(n_trunc / len(TOKENS))
    assert m[METRIC_NAMES["remedy/is_weight_mean"]] == pytest.approx(sum(ws) / len(ws), rel=1e-12)
    assert m[METRIC_NAMES["remedy/is_weight_min"]] == pytest.approx(min(ws), rel=1e-12)
    assert m[METRIC_NAMES["remedy/is_weight_max"]] == pytest.approx(max(ws), rel=1e-12)


def test_none_changes_nothing():
    _check(load_remedy("none")(_batch()))


def test_tis_token_caps_each_rho_at_C():
    r = load_remedy("tis_token")(_batch())
    _check(r, weight=lambda i, t: min(math.exp(_lr(i, t)), 2.0), truncated=lambda i, t: math.exp(_lr(i, t)) > 2)
    assert r.weights[1, 0] == 2.0 and r.weights[3, 1] == 2.0 and (r.weights[0] == 1.0).all()
    r3 = load_remedy("tis_token", {"C": 3.5})(_batch())
    assert float(r3.weights[1, 0]) == pytest.approx(3.0) and float(r3.weights[3, 1]) == 3.5


def test_tis_seq_caps_the_sequence_product():
    rho = lambda i: math.exp(max(-20, min(20, _seq(i, lambda x: x, "sum"))))
    _check(load_remedy("tis_seq")(_batch()), weight=lambda i, t: min(rho(i), 2.0), truncated=lambda i, t: rho(i) > 2)
    assert rho(1) == pytest.approx(3 * math.exp(-0.1)) and rho(3) == pytest.approx(math.exp(20))


def test_mis_token_masks_above_C_and_optionally_below_C_min():
    rho = lambda i, t: math.exp(_lr(i, t))
    _check(load_remedy("mis_token")(_batch()), weight=rho, keep=lambda i, t: rho(i, t) <= 2)
    _check(load_remedy("mis_token", {"C_min": 0.5})(_batch()), weight=rho, keep=lambda i, t: 0.5 <= rho(i, t) <= 2)


def test_mis_seq_masks_whole_sequences():
    rho = lambda i: math.exp(max(-20, min(20, _seq(i, lambda x: x, "sum"))))
    r = load_remedy("mis_seq")(_batch())
    _check(r, weight=lambda i, t: rho(i), keep=lambda i, t: rho(i) <= 2)
    assert not r.mask[1].any() and not r.mask[3].any() and r.mask[2].all()
    _check(
        load_remedy("mis_seq", {"C_min": 0.9})(_batch()),
        weight=lambda i, t: rho(i),
        keep=lambda i, t: 0.9 <= rho(i) <= 2,
    )


def test_icepop_weights_rho_inside_the_band_and_masks_outside():
    rho = lambda i, t: math.exp(_lr(i, t))
    r = load_remedy("icepop")(_batch())
    _check(r, weight=rho, keep=lambda i, t: 0.5 <= rho(i, t) <= 5)
    assert not r.mask[2, 0] and not r.mask[3, 1] and r.mask[1, 0]  # 0.45 and e^20 out, 3 in


def test_geo_rs_rejects_on_the_geometric_mean():
    g = lambda i: math.exp(_seq(i, lambda x: x, "mean"))
    r = load_remedy("geo_rs")(_batch())
    _check(r, keep=lambda i, t: 0.999 <= g(i) <= 1.001)
    assert [bool(r.mask[i].any()) for i in range(7)] == [True, False, False, False, True, False, True]


@pytest.mark.parametrize(
    "name, stat, threshold",
    [
        ("k3_rs", lambda i: _seq(i, _k3, "mean"), 0.01),
        ("trm_avg", lambda i: _seq(i, _k3, "mean"), 0.001),
        ("trm_max", lambda i: _seq(i, lambda x: 0.5 * x * x, "max"), 0.05),
    ],
)
def test_sequence_rejection_on_a_divergence(name, stat, threshold):
    r = load_remedy(name)(_batch())
    _check(r, keep=lambda i, t: stat(i) <= threshold)
    assert r.mask[0].all() and r.mask[4].all() and not r.mask[1].any()
    assert bool(r.mask[5].any()) == (name == "trm_max")  # max k2 = 0.02 <= 0.05; mean k3 = 0.015 > 0.01


def test_tis_token_plus_sequence_rejection():
    rho = lambda i, t: math.exp(_lr(i, t))
    k3 = lambda i: _seq(i, _k3, "mean")
    r = load_remedy("tis_token+seq_rs")(_batch())
    _check(
        r,
        weight=lambda i, t: min(rho(i, t), 2.0),
        keep=lambda i, t: k3(i) <= 0.001,
        truncated=lambda i, t: rho(i, t) > 2,
    )
    assert not r.mask[6].any()  # K3 sees r6's +-0.1; K1 does not
    k1 = load_remedy("tis_token+seq_rs", {"divergence": "k1"})(_batch())
    _check(
        k1,
        weight=lambda i, t: min(rho(i, t), 2.0),
        keep=lambda i, t: abs(_seq(i, lambda x: x, "mean")) <= 0.001,
        truncated=lambda i, t: rho(i, t) > 2,
    )
    assert k1.mask[6].all()


def test_rejection_on_the_ppo_ratio_moves_into_the_update():
    rho = lambda i, t: math.exp(_lr(i, t))
    remedy = load_remedy("tis_token+seq_rs", {"ratio": "ppo"})
    r = remedy(_batch())  # token TIS on rho as before, but no sequence is rejected on rho
    _check(r, weight=lambda i, t: min(rho(i, t), 2.0), truncated=lambda i, t: rho(i, t) > 2)
    # In the update the same K3 criterion reads log r = log pi_theta - log pi_old, here the batch's deltas.
    b = _batch()
    keep = remedy.update_keep(b.old_logprobs - b.rollout_logprobs, b.mask)
    assert keep.dtype == torch.bool and keep.shape == (8, 3)
    assert [bool(keep[i].any()) for i in ROWS] == [_seq(i, _k3, "mean") <= 0.001 for i in ROWS]
    assert load_remedy("tis_token+seq_rs").update_keep(b.old_logprobs, b.mask) is None
    assert all(load_remedy(n).update_keep(b.old_logprobs, b.mask) is None for n in REMEDIES)
    with pytest.raises(ValueError) as e:
        load_remedy("tis_token+seq_rs", {"ratio": "pi"})
    assert "ratio 'pi' is invalid; valid: rho, ppo" in str(e.value) and "\n" not in str(e.value)


def test_hook_remedies_act_earlier_and_leave_the_batch_alone():
    assert load_remedy("routing_replay_r2").replay == "old"
    assert load_remedy("routing_replay_r3").replay == "engine"
    fp16 = load_remedy("fp16")
    assert fp16.engine_override == {"dtype": "fp16"} and fp16.trainer_override == {"dtype": "fp16"}
    for name in ("routing_replay_r2", "routing_replay_r3", "fp16"):
        _check(load_remedy(name)(_batch()))


@pytest.mark.parametrize("name", sorted(REMEDIES))
def test_zero_mismatch_is_a_no_op_for_every_remedy(name):
    b = _batch([[0.0] * 3] * 8)
    r = load_remedy(name)(b)
    assert torch.equal(r.mask, b.mask)
    assert r.weights is None or bool((r.weights[b.mask] == 1.0).all())
    assert r.metrics == load_remedy("none")(b).metrics


# ---------------------------------------------------------------- registry, params, CLI, errors


def test_list_describes_every_builtin(capsys):
    assert main(["remedies", "list", "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert set(REMEDIES) <= set(rows) and len(REMEDIES) == 18  # plus the verl / TRL vocabulary (test_remedy_vocab)
    assert rows["tis_token"]["params"] == {"C": 2.0}
    assert rows["icepop"]["params"] == {"low": 0.5, "high": 5.0}
    assert rows["mis_seq"]["params"] == {"C": 2.0, "C_min": None}
    assert rows["fp16"]["hooks"]["engine_override"] == {"dtype": "fp16"}
    assert rows["routing_replay_r3"]["hooks"]["replay"] == "engine"
    assert rows["unified_precision"]["hooks"]["trainer_follows_engine"] == [
        "dtype",
        "logits_dtype",
        "weight_quant",
        "act_quant",
    ]
    assert rows["rounding_aligned"]["hooks"]["rollout_rounding"] is True
    assert (
        rows["rounding_aligned"]["hooks"]["trainer_follows_engine"]
        == rows["unified_precision"]["hooks"]["trainer_follows_engine"]
    )
    assert rows["sampling_replay"]["hooks"]["sampling_replay"] is True
    assert "sampling_replay" not in rows["none"]["hooks"]  # hooks a remedy does not use are left out
    assert all(r["doc"] for r in rows.values())
    assert main(["remedies", "list"]) == 0
    assert "tis_token+seq_rs" in capsys.readouterr().out


@pytest.mark.parametrize(
    "spec, args, err, message",
    [
        ("tis", {}, ValueError, r"unknown remedy 'tis'; did you mean tis_seq\? registered: none, tis_token"),
        ("tis_token", {"cap": 2}, ValueError, r"unknown parameter\(s\) \['cap'\]; valid: C"),
        ("tis_token", {"C": -1}, ValueError, "C must be > 0"),
        ("tis_token", {"C": "big"}, ValueError, "parameter C='big' is not a valid float"),
        ("tis_token", {"C": float("nan")}, ValueError, "is not a valid float"),
        ("mis_token", {"C_min": 3.0}, ValueError, "C_min=3.0 must be < C=2.0"),
        ("tis_token+seq_rs", {"divergence": "k2"}, ValueError, "valid: k3, k1"),
        ("none", {"C": 1}, ValueError, r"valid: \(none\)"),
        ("/no/such/file.py:X", {}, FileNotFoundError, "remedy file /no/such/file.py does not exist"),
        ("no_such_pkg.mod:X", {}, ValueError, "cannot be imported"),
        ("timbench.remedies.builtin:Nope", {}, ValueError, "has no class 'Nope'; remedies defined there: FP16"),
        ("timbench.remedies.base:RemedyBatch", {}, ValueError, "not a subclass of timbench.remedies.Remedy"),
        ("timbench.remedies:Remedy", {}, ValueError, "not a subclass"),
    ],
)
def test_bad_remedy_or_params_is_a_one_line_error(spec, args, err, message):
    with pytest.raises(err, match=message) as e:
        load_remedy(spec, args)
    assert "\n" not in str(e.value)


def test_config_validates_the_remedy_before_any_work(capsys):
    cfg = load_config("bench/runs/baseline.yaml", ["remedy=tis_token", "remedy_args.C=3"])
    assert cfg.remedy_args == {"C": 3.0} and cfg.to_dict()["remedy"] == "tis_token"
    with pytest.raises(ValueError, match="unknown parameter"):
        load_config("bench/runs/baseline.yaml", ["remedy=tis_token", "remedy_args.D=3"])
    with pytest.raises(ValueError, match="unknown remedy 'nope'"):
        load_config("bench/runs/baseline.yaml", ["remedy=nope"])
    assert main(["train", "bench/runs/baseline.yaml", "--out", "/nonexistent/x", "--remedy", "nope"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("timbench train: error: unknown remedy 'nope'") and err.count("\n") == 1


def test_bad_plugin_files_are_clear_errors(tmp_path):
    bad = tmp_path / "broken.py"
    bad.write_text("import no_such_module_xyz\n")
    with pytest.raises(ValueError, match="broken.py failed to import: ModuleNotFoundError"):
        load_remedy(f"{bad}:X")
    hooks = tmp_path / "hooks.py"
    hooks.write_text(
        PLUGIN + "\nclass BadReplay(Scaled):\n    replay = 'sideways'\n"
        "\nclass BadSpec(Scaled):\n    engine_override = {'dtype': 'fp8'}\n"
        "\nclass NoCall(Remedy):\n    pass\n"
    )
    with pytest.raises(ValueError, match="replay='sideways' is invalid"):
        load_remedy(f"{hooks}:BadReplay")
    with pytest.raises(ValueError, match="invalid value 'fp8' for dtype"):
        load_remedy(f"{hooks}:BadSpec")
    with pytest.raises(ValueError, match="does not implement __call__"):
        load_remedy(f"{hooks}:NoCall")


def test_results_of_plugins_are_validated():
    b = _batch()
    with pytest.raises(ValueError, match="bool tensor of shape"):
        check_result(RemedyResult(None, torch.ones(8, 2, dtype=torch.bool), {}), b, "x")
    w = torch.ones(8, 3)
    w[0, 0] = float("nan")
    with pytest.raises(ValueError, match="NaN or infinite"):
        check_result(RemedyResult(w, b.mask, {}), b, "x")
    with pytest.raises(ValueError, match="not a finite number"):
        check_result(RemedyResult(None, b.mask, {"remedy/x": float("inf")}), b, "x")


BAD_SHAPE_PLUGIN = """
import torch
from timbench.remedies import Remedy, finish


class WideWeights(Remedy):
    name = "wide_weights"
    doc = "Returns weights one token too wide (a broken test plug-in)."

    def __call__(self, batch):
        n, t = batch.mask.shape
        return finish(batch, weights=torch.ones(n, t + 1, dtype=torch.float64))


class WideKeep(WideWeights):
    name = "wide_keep"

    def __call__(self, batch):
        return finish(batch, keep=torch.ones(batch.mask.shape[0] + 1, batch.mask.shape[1], dtype=torch.bool))
"""


@pytest.mark.parametrize("cls, what, got", [("WideWeights", "weights", "(8, 4)"), ("WideKeep", "keep", "(9, 3)")])
def test_wrongly_shaped_plugin_result_is_a_one_line_error_naming_remedy_and_shapes(tmp_path, cls, what, got):
    f = tmp_path / "bad_shape.py"
    f.write_text(BAD_SHAPE_PLUGIN)
    remedy = load_remedy(f"{f}:{cls}")
    with pytest.raises(ValueError) as e:
        remedy(_batch())  # before: IndexError / RuntimeError from inside finish
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"remedy {remedy.name}: finish({what}=...)")
    assert f"has shape {got}" in msg and "(8, 3)" in msg


# ---------------------------------------------------------------- plug-ins

PLUGIN = """
from dataclasses import dataclass
from timbench.remedies import Remedy, finish, log_rho, param


@dataclass(frozen=True)
class ScaledParams:
    scale: float = param(0.5, "multiplier on every token")


class Scaled(Remedy):
    name = "scaled"
    doc = "Scale every token by a constant (a test plug-in)."
    Params = ScaledParams

    def __call__(self, batch):
        w = log_rho(batch).exp() * 0 + self.params.scale
        return finish(batch, weights=w, extra={"remedy/scaled_tokens": float(batch.mask.sum())})
"""


def test_entry_point_remedy(tmp_path, monkeypatch):
    (tmp_path / "my_remedy_pkg.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    ep = importlib.metadata.EntryPoint(name="scaled_ep", value="my_remedy_pkg:Scaled", group="timbench.remedies")
    monkeypatch.setattr(
        importlib.metadata, "entry_points", lambda group=None: [ep] if group == "timbench.remedies" else []
    )
    r = load_remedy("scaled_ep", {"scale": 0.25})
    assert type(r).__name__ == "Scaled" and float(r(_batch()).weights[0, 0]) == 0.25
    assert "scaled_ep" in {row["name"] for row in list_remedies()}
    assert load_remedy("my_remedy_pkg:Scaled").params.scale == 0.5


# ---------------------------------------------------------------- loop integration


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    d = tmp_path_factory.mktemp("ckpt")
    save_checkpoint(Qwen3ForCausalLM(PRESETS["tiny-dense"], seed=2), d)
    return d


@pytest.fixture(scope="module")
def moe_ckpt(tmp_path_factory):
    d = tmp_path_factory.mktemp("moe_ckpt")
    save_checkpoint(Qwen3ForCausalLM(PRESETS["tiny-moe"], seed=2), d)
    return d


def _parity(self, response, problem, format_reward=0.0):
    # A random-init model never solves the task; reward response parity so advantages are non-zero.
    return float(len(response) % 2)


@pytest.fixture
def parity_reward(monkeypatch):
    monkeypatch.setattr(Task, "reward", _parity)


def _cfg(ckpt, *extra):
    return load_config(
        None,
        [
            f"model={ckpt}",
            "steps=2",
            "prompts_per_step=2",
            "group_size=4",
            "mini_batches=2",
            "eval_every=2",
            "eval_n=4",
            "lr=1e-3",
            *extra,
        ],
    )


def _rows(d):
    return [json.loads(l) for l in (d / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def none_run(ckpt, tmp_path_factory):
    """The remedy=none zero-mismatch run every other run here is compared with (run once)."""
    out = tmp_path_factory.mktemp("none")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Task, "reward", _parity)
        run(_cfg(ckpt), out, progress=False)
    return out


def test_plugin_file_runs_in_training_and_logs_its_metric(ckpt, none_run, tmp_path, parity_reward):
    f = tmp_path / "elsewhere" / "my_remedy.py"
    f.parent.mkdir()
    f.write_text(PLUGIN)
    run(_cfg(ckpt, f"remedy={f}:Scaled", "remedy_args.scale=0.5"), tmp_path / "p", progress=False)
    rows, base = _rows(tmp_path / "p"), _rows(none_run)
    assert all(r["remedy/scaled_tokens"] > 0 for r in rows)
    assert rows[0]["rollout_corr/rollout_is_mean"] == 0.5
    # Halving every token's weight halves the step-0 loss (same samples, same old policy).
    assert rows[0]["actor/pg_loss"] == pytest.approx(0.5 * base[0]["actor/pg_loss"], rel=1e-5)


@pytest.mark.parametrize("name", sorted(REMEDIES))
def test_zero_mismatch_training_is_byte_identical_to_none(name, ckpt, none_run, tmp_path, parity_reward, monkeypatch):
    specs = []
    real_lane = loop_mod.make_lane
    monkeypatch.setattr(
        loop_mod, "make_lane", lambda *a: specs.append((a[3].to_dict(), a[4].to_dict())) or real_lane(*a)
    )
    run(_cfg(ckpt, f"remedy={name}"), tmp_path / "r", progress=False)
    same = (tmp_path / "r" / "metrics.jsonl").read_bytes() == (none_run / "metrics.jsonl").read_bytes()
    if name == "fp16":  # changes the numerics (both sides fp16) but keeps exact/exact bitwise aligned
        assert not same and specs == [({"kernels": "exact", "dtype": "fp16"},) * 2]
        assert all(r["rollout_corr/k3_kl"] == 0.0 for r in _rows(tmp_path / "r"))
    else:
        assert same and specs == [({"kernels": "exact", "dtype": "fp32"},) * 2]
        assert len(_rows(tmp_path / "r")) == 2


def test_ppo_ratio_rejection_in_training_sees_ratio_one_on_the_first_mini_batch(
    ckpt, tmp_path, parity_reward, monkeypatch
):
    seen = []
    cls = type(load_remedy("tis_token+seq_rs"))
    real = cls.update_keep
    monkeypatch.setattr(cls, "update_keep", lambda self, lr, m: seen.append(lr.clone()) or real(self, lr, m))
    run(
        _cfg(ckpt, "remedy=tis_token+seq_rs", "remedy_args.ratio=ppo", "remedy_args.threshold=1e-6"),
        tmp_path / "p",
        progress=False,
    )
    assert len(seen) == 4  # 2 steps x 2 mini-batches
    # The recompute and the first update pass run the same weights through the same batch-invariant kernels:
    # the PPO ratio is exactly 1 there, so nothing can be rejected; after one optimizer step it is not.
    assert all(float(x.abs().max()) == 0.0 for x in seen[0::2]) and all(float(x.abs().max()) > 0 for x in seen[1::2])
    rows = _rows(tmp_path / "p")
    assert all(0.0 < r["actor/ppo_rs_seq_masked_fraction"] <= 0.5 for r in rows)  # mean of (0, >0)
    assert all(r["rollout_corr/rollout_rs_seq_masked_fraction"] == 0.0 for r in rows)


def test_a_plugin_update_keep_of_the_wrong_shape_is_a_one_line_error(ckpt, tmp_path, parity_reward):
    f = tmp_path / "bad_keep.py"
    f.write_text(
        "from timbench.remedies import Remedy, finish\n"
        "class BadKeep(Remedy):\n"
        "    name = 'bad_keep'\n"
        "    def __call__(self, batch):\n"
        "        return finish(batch)\n"
        "    def update_keep(self, log_r, mask):\n"
        "        return mask[:1]\n"
    )
    with pytest.raises(ValueError) as e:
        run(_cfg(ckpt, f"remedy={f}:BadKeep"), tmp_path / "b", progress=False)
    assert "remedy bad_keep: update_keep must return None or a bool tensor of shape" in str(e.value)
    assert "\n" not in str(e.value)


def test_replay_tensor_pads_the_never_needed_positions():
    seqs = [((1, 2), [3, 4]), ((1,), [2])]
    routes = [torch.full((3, 2, 2), 5), torch.full((1, 2, 2), 6)]
    r = replay_tensor(seqs, routes).reshape(2, 4, 2, 2)
    assert (r[0, :3] == 5).all() and (r[1, :1] == 6).all()
    assert (r[0, 3] == torch.tensor([0, 1])).all() and (r[1, 1:] == torch.tensor([0, 1])).all()
    assert replay_tensor(seqs, [None, None]) is None
    with pytest.raises(ValueError, match="needs"):
        replay_tensor(seqs, [torch.zeros(2, 2, 2, dtype=torch.long), routes[1]])


def test_routing_replay_on_moe_uses_the_right_routing(moe_ckpt, tmp_path, parity_reward, monkeypatch):
    calls = []
    real = step_mod.sequence_logprobs

    def spy(model, compute, seqs, temperature=1.0, replay=None, support=None, **kw):
        out = real(model, compute, seqs, temperature, replay=replay, support=support, **kw)
        calls.append((torch.is_grad_enabled(), seqs, replay, out.routing))
        return out

    monkeypatch.setattr(step_mod, "sequence_logprobs", spy)  # the recompute
    monkeypatch.setattr(update_mod, "sequence_logprobs", spy)  # the update passes
    mismatch = ["engine.dtype=bf16", "steps=1", "mini_batches=1"]
    run(_cfg(moe_ckpt, *mismatch), tmp_path / "base", progress=False)
    assert _rows(tmp_path / "base")[0]["mismatch/routing_agreement"] < 1.0  # the condition really disagrees
    assert all(c[2] is None for c in calls)

    calls.clear()
    run(_cfg(moe_ckpt, *mismatch, "remedy=routing_replay_r3"), tmp_path / "r3", progress=False)
    assert _rows(tmp_path / "r3")[0]["mismatch/routing_agreement"] == 1.0
    # the update's first step may backpropagate through the recompute's own pass (same rows, weights and kernels)
    (_, seqs, rp_old, route_old) = calls[0]
    (grad, _, rp_upd, route_upd) = calls[1] if len(calls) > 1 else calls[0]
    assert grad and rp_old is not None and torch.equal(rp_old, rp_upd)  # engine routing in both passes
    for i, (p, r) in enumerate(seqs):  # and it is what the trainer used at every scored position
        assert torch.equal(route_upd[i, : len(p) + len(r) - 1], route_old[i, : len(p) + len(r) - 1])

    calls.clear()
    run(_cfg(moe_ckpt, *mismatch, "remedy=routing_replay_r2"), tmp_path / "r2", progress=False)
    (g0, seqs, rp_old, route_old), (g1, _, rp_upd, route_upd) = calls[:2]
    assert not g0 and rp_old is None and g1 and rp_upd is not None  # own routing, replayed in the update
    flat = route_old.reshape(-1, *route_old.shape[2:])
    width = route_old.shape[1]
    for i, (p, r) in enumerate(seqs):
        n = len(p) + len(r) - 1
        assert torch.equal(rp_upd[i * width : i * width + n], flat[i * width : i * width + n])
    assert _rows(tmp_path / "r2")[0]["mismatch/routing_agreement"] < 1.0


def test_readme_example_remedy_loads_and_computes(tmp_path):
    text = open("docs/guides/remedy.md").read()  # the plug-in example, as the docs show it
    code = text.split("```python\n# my_remedy.py")[1].split("```")[0]
    assert "fexp(" in code and ".exp()" not in code  # CPU-independent maths, as the built-ins
    (tmp_path / "my_remedy.py").write_text("# my_remedy.py" + code)
    r = load_remedy(f"{tmp_path / 'my_remedy.py'}:MyRemedy", {"C": 3})
    out = check_result(r(_batch()), _batch(), r.name)
    assert float(out.weights[1, 0]) == pytest.approx(3.0) and float(out.weights[2, 0]) == 0.5
    assert out.metrics["remedy/low_clipped_frac"] == pytest.approx(1 / len(TOKENS))
