"""Engine and trainer specs: `key=value,key=value` strings parsed against one registry of keys.

A spec says how one side of the RL system computes (kernel set, dtype, ...).
Each key is data: a parser, its valid values and a one-line doc, so a new
condition adds an entry here and nowhere else, and every bad spec produces the
same kind of one-line error naming the key and what is valid.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable

import torch

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


class SpecError(ValueError):
    """A spec string that names an unknown key or an invalid value."""


@dataclass(frozen=True)
class SpecKey:
    parse: Callable[[str], Any]
    valid: str
    doc: str


def _choice(*options: str) -> Callable[[str], str]:
    def parse(v: str) -> str:
        if v not in options:
            raise ValueError
        return v
    return parse


SPEC_KEYS: dict[str, SpecKey] = {
    "kernels": SpecKey(_choice("exact", "torch"), "exact|torch",
                       "exact: fixed-order batch-invariant kernels; torch: plain PyTorch (MKL, SDPA)"),
    "dtype": SpecKey(_choice(*DTYPES), "|".join(DTYPES), "dtype of weights and activations"),
}


@dataclass(frozen=True)
class Spec:
    """How one side (engine or trainer) computes. Defaults are the zero-mismatch reference."""

    kernels: str = "exact"
    """Kernel set name (see `timbench.kernels`)."""
    dtype: str = "fp32"
    """Weights/activations dtype: fp32, bf16 or fp16."""

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    def __str__(self) -> str:
        return ",".join(f"{f.name}={getattr(self, f.name)}" for f in dataclasses.fields(self))


def parse_spec(text: str | dict | Spec | None, what: str = "spec") -> Spec:
    """Parse `kernels=torch,dtype=bf16` (or a dict of the same) into a Spec; raise SpecError on any bad part."""
    if isinstance(text, Spec):
        return text
    if text is None:
        return Spec()
    items: dict[str, str] = {}
    if isinstance(text, dict):
        items = {str(k): str(v) for k, v in text.items()}
    elif text.strip():
        for part in text.split(","):
            key, sep, value = part.strip().partition("=")
            if not sep or not key:
                raise SpecError(f"{what}: {part.strip()!r} is not key=value; valid keys: {', '.join(SPEC_KEYS)}")
            items[key.strip()] = value.strip()
    values = {}
    for key, raw in items.items():
        if key not in SPEC_KEYS:
            raise SpecError(f"{what}: unknown key {key!r}; valid keys: "
                            + ", ".join(f"{k}={s.valid}" for k, s in SPEC_KEYS.items()))
        try:
            values[key] = SPEC_KEYS[key].parse(raw)
        except (ValueError, TypeError):
            raise SpecError(f"{what}: invalid value {raw!r} for {key}; valid: {SPEC_KEYS[key].valid}") from None
    return Spec(**values)
