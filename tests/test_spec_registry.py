"""The condition-key registry is the one definition of a key: a key added to a copy of
`SPEC_KEYS` parses, validates, reaches the model's `Compute`, and a bad value is a one-line error."""

import dataclasses
import pickle
from pathlib import Path

import pytest

from timbench.kernels import get_kernels
from timbench.model import Compute
from timbench.spec import keys as S
from timbench.spec.noise import NOISE_KINDS, Noise, parse_noise

pytestmark = pytest.mark.unit  # builds no model (make test-unit)


def _with_key():
    keys = {
        **S.SPEC_KEYS,
        "staleness_demo": S.SpecKey(
            S._positive_int,
            "integer >= 1",
            "throwaway key of this test",
            ("engine",),
            1,
            check=lambda s: "staleness_demo=3 needs tp > 1" if s.staleness_demo == 3 and s.tp == 1 else None,
        ),
    }
    return keys, S.make_spec_class(keys)


def test_a_new_key_is_one_registry_entry():
    keys, cls = _with_key()
    spec = S.parse_spec("dtype=bf16,staleness_demo=4", "engine", "engine", keys=keys, spec_cls=cls)
    assert spec.staleness_demo == 4 and spec.dtype == "bf16"
    assert cls().staleness_demo == 1  # the registry's default
    assert [f.name for f in dataclasses.fields(cls)] == list(keys)
    assert str(spec) == "kernels=exact,dtype=bf16,staleness_demo=4"  # printed only where it differs
    c = Compute(get_kernels(spec.kernels), spec)
    assert c.staleness_demo == 4  # reaches the model with no copy in Compute
    with pytest.raises(S.SpecError, match=r"^engine: invalid value '0' for staleness_demo; valid: integer >= 1$"):
        S.parse_spec("staleness_demo=0", "engine", keys=keys, spec_cls=cls)
    with pytest.raises(S.SpecError, match=r"^trainer: staleness_demo is an engine-only key"):
        S.parse_spec("staleness_demo=2", "trainer", "trainer", keys=keys, spec_cls=cls)
    with pytest.raises(S.SpecError, match=r"^engine: staleness_demo=3 needs tp > 1$"):
        S.parse_spec("staleness_demo=3", "engine", keys=keys, spec_cls=cls)
    assert S.parse_spec("staleness_demo=3,tp=2", keys=keys, spec_cls=cls).tp == 2
    with pytest.raises(S.SpecError, match="unknown key 'staleness_demo'"):  # the real registry is untouched
        S.parse_spec("staleness_demo=2")


def test_spec_is_the_registry():
    assert [f.name for f in dataclasses.fields(S.Spec)] == list(S.SPEC_KEYS)
    assert {f.name: f.default for f in dataclasses.fields(S.Spec)} == {k: v.default for k, v in S.SPEC_KEYS.items()}
    s = S.parse_spec("dtype=bf16,tp=2,noise=student_t:0.5:3")
    assert pickle.loads(pickle.dumps(s)) == s and isinstance(s, S.Spec)
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.tp = 4


def test_compute_carries_the_spec():
    s = S.parse_spec(
        "dtype=bf16,logits_dtype=fp32,tp=4,tp_reduce=tree,router_noise=0.1,attn_splits=2,"
        "weight_quant=fp8,act_quant=fp8,kv_cache_dtype=fp8,noise=gaussian:1"
    )
    c = Compute.from_spec(s)
    assert c.spec is s
    for key in S.SPEC_KEYS:
        if key not in ("kernels", "dtype", "logits_dtype", "router_dtype"):  # resolved: an instance, torch dtypes
            assert getattr(c, key) == getattr(s, key), key
    assert (c.dtype, c.logits_dtype, c.router_dtype) == (s.torch_dtype, s.torch_logits_dtype, s.torch_router_dtype)
    with pytest.raises(AttributeError):
        _ = c.not_a_key


def test_noise_kinds_are_one_table():
    for kind, nk in NOISE_KINDS.items():
        text = ":".join([kind, "0.5", *["3"] * (nk.n_params - 1)])
        assert str(parse_noise(text)) == text and callable(nk.unit)
        assert f"{kind}:SIGMA" in S.SPEC_KEYS["noise"].valid
    assert parse_noise("none") == Noise()
    for bad in ("gaussian", "gaussian:1:2", "student_t:1", "student_t:1:0", "gaussian:-1", "cauchy:1"):
        with pytest.raises(ValueError):
            parse_noise(bad)


def test_condition_kinds_are_one_table():
    from timbench.grid.conditions import KINDS, load_conditions
    from timbench.report.figures.cells import KIND_MARKERS

    assert KIND_MARKERS is KINDS and len(set(KINDS.values())) == len(KINDS)  # one distinct marker per family
    table = Path(__file__).resolve().parents[1] / "timbench/grid/conditions.yaml"
    assert {c.kind for c in load_conditions(table).values()} <= set(KINDS)
