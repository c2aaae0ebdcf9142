"""timbench.util.coerce: YAML / --set values to a field's declared type, one rule for configs and remedy parameters."""

import math

import pytest

from timbench.util.coerce import coerce

pytestmark = pytest.mark.unit  # builds no model (make test-unit)


@pytest.mark.parametrize(
    "value, kind, want",
    [
        ("yes", "bool", True),
        ("FALSE", "bool", False),
        (1, "bool", True),
        (False, "bool", False),
        ("3", "int", 3),
        (4.0, "int", 4),
        ("1e3", "int", 1000),
        ("1e-3", "float", 1e-3),
        (2, "float", 2.0),
        ("None", "float | None", None),
        (None, "Optional[float]", None),
        ("0.5", "float | None", 0.5),
        ("None", "str", "None"),
        (7, "str", "7"),
        ([1, 2], "list", [1, 2]),
    ],
)
def test_valid_values_take_the_declared_type(value, kind, want):
    got = coerce(value, kind)
    assert got == want and type(got) is type(want)


@pytest.mark.parametrize(
    "value, kind",
    [
        ("maybe", "bool"),
        (2.5, "int"),
        (True, "int"),
        ("x", "int"),
        (math.inf, "float"),
        ("nan", "float"),
        (True, "float"),
        (None, "float"),
        ("null", "float"),
        ("1e999", "int"),
    ],
)
def test_invalid_values_raise_a_bare_value_error(value, kind):
    with pytest.raises(ValueError):
        coerce(value, kind)
