"""Typed values from YAML and `--set KEY=VALUE` strings: one coercion for config keys and remedy parameters.

YAML reads `1e-3` as a string and users write `true`, `yes` or `1` for a bool; this module turns such
a value into the type a dataclass field declares, or raises a bare ValueError that the caller words
with the key's name (`config key 'lr': ...`, `remedy tis_token: parameter C=...`).
"""

from __future__ import annotations

import dataclasses
import math

BOOLS = {"true": True, "false": False, "1": True, "0": False, "yes": True, "no": False}
NULLS = ("None", "null")  # strings that mean None where a kind is optional


def field_kind(f: dataclasses.Field) -> str:
    """A field's annotation as a string, e.g. 'float', 'int', 'float | None' (with or without PEP 563)."""
    return f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))


def coerce(value, kind: str):
    """`value` as type `kind` ('bool', 'int', 'float', 'str', optionally '... | None' / 'Optional[...]').

    bool: a bool or one of BOOLS (case-insensitive); int: a whole number, not a bool; float: a finite
    number, not a bool; None only where the kind is optional. Other kinds pass the value through.
    Raises ValueError (without a message: the caller names the key) on anything else.
    """
    optional = kind.replace(" ", "").endswith("|None") or kind.startswith("Optional")
    base = kind.split("|")[0].strip().removeprefix("Optional[").rstrip("]")
    if value is None or (optional and value in NULLS):
        if optional:
            return None
        raise ValueError
    try:
        if base == "bool":
            return value if isinstance(value, bool) else BOOLS[str(value).lower()]
        if base == "int":
            if isinstance(value, bool) or float(value) != int(float(value)):
                raise ValueError
            return int(float(value))
        if base == "float":
            if isinstance(value, bool) or not math.isfinite(float(value)):
                raise ValueError
            return float(value)
        if base == "str":
            return str(value)
    except (ValueError, TypeError, KeyError, OverflowError):
        raise ValueError from None
    return value
