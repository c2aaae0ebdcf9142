"""timbench diagnose: attribution known answers, generic per-key split, views, per-layer localisation, CLI errors."""

import json

import pytest
import torch

from timbench.cli import main
from timbench.diagnose import diagnose, diagnose_rollouts
from timbench.diagnose.attribution import attribute, changed_keys, errors, key_groups, key_shares
from timbench.diagnose.figures import draw_all
from timbench.diagnose.forward import reference, score
from timbench.diagnose.layers import localise
from timbench.diagnose.views import by_probability, flip_rate, routing_by_layer
from timbench.model import load_model
from timbench.spec.keys import SPEC_KEYS, parse_spec

SMALL = (2, 5)  # engine batches: a slice of the align workload, enough tokens, seconds not minutes


@pytest.fixture(scope="module")
def dense():
    return load_model("tiny-dense", seed=0)


@pytest.fixture(scope="module")
def moe():
    return load_model("tiny-moe", seed=0)


def test_fp64_trainer_has_zero_error_so_the_gap_is_the_engine_error(dense):
    r = diagnose(dense, "dtype=bf16", "dtype=fp64", batches=SMALL, per_key=False, layers=False)
    a = r["attribution"]
    assert a["e_trainer"] == {"mean_abs": 0.0, "rms": 0.0, "max_abs": 0.0}
    assert a["gap"] == a["e_engine"] and a["e_engine"]["rms"] > 1e-4
    assert a["quadrature_ratio"] == 1.0
    # the same at the tensor level: trainer fp64 logprobs are the reference's, bit for bit
    seqs = [((5, 6, 7), (8, 9, 10)), ((12,), (13, 14, 15, 16))]
    lp_e = [torch.tensor([-1.0, -2.0, -0.5]), torch.tensor([-0.1, -3.0, -2.0, -1.0])]
    lp_t, lp_r = score(dense, parse_spec("dtype=fp64"), seqs, groups=[[1], [0]]), reference(dense, seqs)
    e = errors(torch.cat(lp_e), torch.cat(lp_t.logprobs), torch.cat(lp_r.logprobs))
    assert torch.equal(e["e_trainer"], torch.zeros(7, dtype=torch.float64))
    assert torch.equal(e["gap"], e["e_engine"])


def test_exact_exact_has_zero_gap_and_equal_nonzero_side_errors(moe):
    r = diagnose(moe, "kernels=exact", "kernels=exact", batches=SMALL)
    a = r["attribution"]
    assert a["gap"]["max_abs"] == 0.0 and r["max_abs_diff"] == 0.0
    assert a["e_engine"] == a["e_trainer"] and a["e_engine"]["rms"] > 0  # fp32 vs fp64: 1e-7 .. 1e-5
    assert abs(a["correlation"] - 1) < 1e-12 and a["best_model"] == "same_sign"
    assert r["replay_max_abs_diff"] == 0.0 and r["views"]["argmax_flip_rate"] == 0.0
    assert r["layers"]["identical_frac"] == 1.0 and r["layers"]["first_level"] is None
    assert r["views"]["routing_disagreement_by_layer"]["engine_vs_trainer"] == [0.0] * 4
    assert r["keys"]["keys"] == []


def test_attribution_models_on_synthetic_errors():
    g = torch.Generator().manual_seed(0)
    ref = torch.randn(20000, generator=g, dtype=torch.float64)
    ee, et = (
        1e-3 * torch.randn(20000, generator=g, dtype=torch.float64),
        2e-3 * torch.randn(20000, generator=g, dtype=torch.float64),
    )
    a = attribute(ref + ee, ref + et, ref)  # independent: quadrature
    assert a["best_model"] == "quadrature" and abs(a["quadrature_ratio"] - 1) < 0.05
    b = attribute(ref + ee, ref + 0.5 * ee, ref)  # same sign, fully correlated: errors cancel
    assert b["best_model"] == "same_sign" and abs(b["models"]["same_sign"]["ratio"] - 1) < 1e-9
    c = attribute(ref + ee, ref - ee, ref)  # opposite sign: errors add
    assert c["best_model"] == "opposite_sign" and abs(c["correlation"] + 1) < 1e-12


def test_key_groups_split_any_spec_one_key_at_a_time():
    s = parse_spec("kernels=torch,dtype=bf16,tp=4,tp_reduce=tree,attn_splits=2,noise=gaussian:0.5", side="engine")
    groups = key_groups(s, "engine")
    assert [g for g, _ in groups] == [
        "kernels=torch",
        "dtype=bf16",
        "attn_splits=2",
        "tp=4,tp_reduce=tree",
        "noise=gaussian:0.5",
    ]
    for label, g in groups:  # each is the reference with only those keys changed
        assert {k for k, _ in changed_keys(g)} == {kv.split("=")[0] for kv in label.split(",")}
    # every key of the registry, set alone to a non-default valid value, forms its own group
    for key in SPEC_KEYS:
        spec = next(
            (
                sp
                for v in ("bf16", "torch", "2", "4", "0.1", "gaussian:0.1", "vllm", "fp16", "tree")
                for sp in [_try(key, v)]
                if sp is not None
            ),
            None,
        )
        if spec is not None and changed_keys(spec):
            assert [k for k, _ in changed_keys(key_groups(spec, "engine")[0][1])] == [key]


def _try(key, value):
    try:
        return parse_spec({key: value}, side="engine")
    except ValueError:
        return None


def test_key_shares_and_gap_share():
    out = key_shares(
        1.0,
        [
            {"side": "engine", "key": "a", "ms": 4.0, "shared": False},
            {"side": "engine", "key": "b", "ms": 2.0, "shared": True},
            {"side": "trainer", "key": "b", "ms": 2.0, "shared": True},
            {"side": "trainer", "key": "c", "ms": 0.5, "shared": False},
        ],
    )
    assert [k["share"] for k in out] == [0.6, 0.2, 0.2, 0.0]
    assert [k["gap_share"] for k in out] == [1.0, None, None, 0.0]


def test_views_and_localise_on_known_inputs():
    errs = {"gap": torch.tensor([1.0, 2.0, 0.0, 4.0], dtype=torch.float64)}
    p = torch.tensor([5e-5, 0.005, 0.5, 0.95], dtype=torch.float64)
    b = {x["bucket"]: x for x in by_probability(errs, p)}
    assert b["<0.0001"]["tokens"] == 1 and b["0.001..0.01"]["mean_abs_gap"] == 2.0
    assert b[">=0.9"]["gap_sq_share"] == 16 / 21 and b["0.5..0.9"]["tokens"] == 1
    assert flip_rate(torch.tensor([1, 2, 3, 4]), torch.tensor([1, 2, 0, 4])) == 0.25
    ea = torch.tensor([[[0, 1], [2, 3]], [[0, 1], [2, 3]]])
    eb = torch.tensor([[[1, 0], [2, 4]], [[0, 1], [3, 2]]])
    assert routing_by_layer(ea, eb) == [0.0, 0.5]
    a = [torch.zeros(3, 4), torch.zeros(3, 4), torch.zeros(3, 5)]
    b = [torch.zeros(3, 4), torch.tensor([[0.0] * 4, [0.0, 0.0, 1e-7, 0.0], [0.0] * 4]), torch.ones(3, 5)]
    out = localise(a, b, torch.zeros(3), torch.zeros(3), ["layer0", "layer1", "logits"])
    assert [lv["first_differ_frac"] for lv in out["levels"]] == [0.0, 1 / 3, 2 / 3, 0.0]
    assert out["first_level"] == "layer1" and out["most_common_first_level"] == "logits"


@pytest.mark.parametrize(
    "spec,first",
    [("tp=4", "layer0"), ("noise=gaussian:0.5", "logprob"), ("kernels=exact,dtype=bf16,logits_dtype=fp32", "layer0")],
)
def test_localisation_pins_the_level(dense, spec, first):
    r = diagnose(dense, spec, "kernels=exact", batches=SMALL, per_key=False)
    assert r["layers"]["first_level"] == first
    assert r["replay_max_abs_diff"] == 0.0  # batch-invariant engine: the replay is the engine, bitwise
    if first == "logprob":  # sampler noise: every hidden level is identical
        assert all(lv["max_abs_diff"] == 0.0 for lv in r["layers"]["levels"][:-1])


def test_production_keys_and_figures(moe, tmp_path):
    r = diagnose(moe, "kernels=torch,dtype=bf16,router_noise=0.05", "kernels=torch", batches=SMALL)
    keys = {(k["side"], k["key"]): k for k in r["keys"]["keys"]}
    assert set(keys) == {
        ("engine", "kernels=torch"),
        ("engine", "dtype=bf16"),
        ("engine", "router_noise=0.05"),
        ("trainer", "kernels=torch"),
    }
    assert keys[("engine", "kernels=torch")]["shared"] and keys[("engine", "kernels=torch")]["gap_share"] is None
    own = [keys[("engine", "dtype=bf16")]["gap_share"], keys[("engine", "router_noise=0.05")]["gap_share"]]
    assert min(own) > 0 and abs(sum(own) - 1) < 1e-12
    assert abs(sum(k["share"] for k in keys.values()) - 1) < 1e-12
    assert max(r["views"]["routing_disagreement_by_layer"]["engine_vs_trainer"]) > 0
    json.dumps(r)
    paths = draw_all([("prod", r)], tmp_path)
    assert {p.name for p in paths} == {
        "attribution.png",
        "keys.png",
        "probability.png",
        "position.png",
        "argmax.png",
        "layers.png",
        "routing.png",
    }
    assert all(p.stat().st_size > 1000 for p in paths)


def test_library_call_without_engine_spec(dense):
    seqs = [((5, 6, 7), (8, 9, 10)), ((12,), (13, 14, 15, 16))]
    lp = [torch.tensor([-1.0, -2.0, -0.5]), torch.tensor([-0.1, -3.0, -2.0, -1.0])]
    r = diagnose_rollouts(dense, seqs, lp, "kernels=exact")
    assert r["tokens"] == 7 and "layers" not in r and r["views"]["argmax_flip_rate"] is None
    with pytest.raises(ValueError, match="one logprob per response token"):
        diagnose_rollouts(dense, seqs, lp[:1], "kernels=exact")


@pytest.mark.parametrize(
    "args,msg",
    [
        (["--engine", "kernals=torch"], "unknown key 'kernals'"),
        (["--trainer", "noise=gaussian:1"], "engine-only key"),
        (["--engine", "dtype=fp64"], "dtype=fp64 is the trainer-side reference"),
        (["--model", "/nonexistent/ckpt"], "neither a preset"),
        (["--table", "/nonexistent.yaml"], "nonexistent"),
    ],
)
def test_bad_input_is_one_line(capsys, args, msg):
    assert main(["diagnose", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert msg in err and "\n" not in err and err.startswith("timbench diagnose: error:")


def test_low_precision_keys_need_no_diagnose_code(moe):
    # weight_quant + act_quant (act_quant alone is invalid, so it joins weight_quant's group) and the KV
    # cache format, split one group at a time; the replay reproduces the quantized engine bitwise.
    r = diagnose(moe, "weight_quant=nvfp4,act_quant=nvfp4,kv_cache_dtype=fp8_e4m3", "kernels=exact", batches=SMALL)
    assert r["replay_max_abs_diff"] == 0.0
    keys = {k["key"]: k for k in r["keys"]["keys"] if k["side"] == "engine"}
    assert set(keys) == {"weight_quant=nvfp4,act_quant=nvfp4", "kv_cache_dtype=fp8_e4m3"}
    assert all(k["gap_share"] > 0 for k in keys.values())
    assert r["layers"]["first_level"] == "layer0"


def test_diagnose_table_writes_under_build_unless_told_results(tmp_path, monkeypatch):
    """A regeneration writes under build/ by default (never over a committed result); results/diagnose only with --out
    results/..."""
    import timbench.diagnose.table as table

    outs = []
    monkeypatch.setattr(table, "run_table", lambda path, out, progress: outs.append(str(out)))
    monkeypatch.chdir(tmp_path)
    assert main(["diagnose", "--table", "bench/diagnose.yaml"]) == 0
    assert main(["diagnose", "--table", "bench/diagnose.yaml", "--out", "results/diagnose"]) == 0
    assert outs == ["build/diagnose", "results/diagnose"]
