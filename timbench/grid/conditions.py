"""The condition table: named (engine spec, trainer spec) pairs, each one mismatch source.

A condition is data: `conditions.yaml` next to this module (shipped as package
data, the default table of every grid) maps a name to its kind, the two
spec strings (`key=value,...`, validated with `timbench.spec.keys.parse_spec`) and a
one-paragraph doc naming the real system it stands for. A grid names
conditions from this table; adding a mismatch source is adding an entry here.

    conditions:
      bf16-engine: {kind: precision, engine: "kernels=exact,dtype=bf16",
                    trainer: "kernels=exact,dtype=fp32", doc: "..."}
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from ..spec.keys import Spec, parse_spec
from ..util.readfile import read_yaml

KINDS = {
    "reference": "*",
    "precision": "s",
    "quant": "p",
    "kernels": "D",
    "tp": "^",
    "moe": "v",
    "noise": "o",
    "vllm": "P",
    "accum": "X",
    "async": "h",
}
"""Mismatch families, each with its matplotlib marker in the reports (one table: a new family is one entry);
`reference` is the zero-mismatch baseline every other cell is compared with."""


@dataclass(frozen=True)
class Condition:
    """One mismatch condition: how the rollout engine and the trainer compute."""

    name: str
    """Table key, used in cell ids (e.g. `bf16-engine`)."""
    kind: str
    """Mismatch family: one of KINDS."""
    engine: str
    """Engine spec string, `key=value,...` (see `timbench.spec.keys`)."""
    trainer: str
    """Trainer spec string."""
    doc: str = ""
    """One paragraph: what it models and which real system it stands for."""
    engine_spec: Spec = dataclasses.field(default=Spec(), compare=False, repr=False)
    """`engine` parsed (what a cell's RunConfig gets)."""
    trainer_spec: Spec = dataclasses.field(default=Spec(), compare=False, repr=False)
    """`trainer` parsed."""

    def to_dict(self) -> dict:
        return {k: v for k, v in dataclasses.asdict(self).items() if k not in ("engine_spec", "trainer_spec")}


_FIELDS = ("kind", "engine", "trainer", "doc")
_REQUIRED = ("kind", "engine", "trainer")


def make_condition(name, entry, source: str = "conditions") -> Condition:
    """Validate one table entry; every problem is a one-line ValueError naming the condition."""
    where = f"{source}: condition {name!r}"
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"{source}: condition names are non-empty strings, got {name!r}")
    if not isinstance(entry, dict):
        raise ValueError(f"{where} is not a mapping of {', '.join(_FIELDS)}")
    unknown = sorted(set(map(str, entry)) - set(_FIELDS))
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {unknown}; valid: {', '.join(_FIELDS)}")
    missing = [k for k in _REQUIRED if entry.get(k) in (None, "")]
    if missing:
        raise ValueError(f"{where}: missing {', '.join(missing)}")
    kind = str(entry["kind"])
    if kind not in KINDS:
        raise ValueError(f"{where}: unknown kind {kind!r}; valid: {', '.join(KINDS)}")
    for side in ("engine", "trainer"):
        if not isinstance(entry[side], str):
            raise ValueError(f"{where}: {side} must be a 'key=value,...' string, got {entry[side]!r}")
    engine = parse_spec(entry["engine"], f"{where}: engine spec")
    trainer = parse_spec(entry["trainer"], f"{where}: trainer spec")
    # The reference is what every other cell is measured against: it must be zero mismatch by
    # construction (one kernel set that is batch-invariant, the same spec on both sides).
    if kind == "reference" and (engine != trainer or engine.kernels != "exact"):
        raise ValueError(
            f"{where}: a reference condition needs identical engine and trainer specs "
            f"with kernels=exact (got engine {engine}, trainer {trainer})"
        )
    doc = " ".join(str(entry.get("doc") or "").split())
    return Condition(name, kind, entry["engine"].strip(), entry["trainer"].strip(), doc, engine, trainer)


def parse_conditions(data, source: str = "conditions") -> dict[str, Condition]:
    """A `{name: entry}` mapping (the value of the `conditions:` key) -> validated Conditions."""
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ValueError(f"{source}: 'conditions' must map names to entries, got {type(data).__name__}")
    return {str(name): make_condition(name, entry, source) for name, entry in data.items()}


def load_conditions(path: str | Path) -> dict[str, Condition]:
    """Load and validate a condition table file (`conditions: {NAME: {...}}`)."""
    p = Path(path)
    doc = read_yaml(p, "condition table")
    if not isinstance(doc, dict) or set(doc) != {"conditions"}:
        keys = sorted(doc) if isinstance(doc, dict) else type(doc).__name__
        raise ValueError(f"{p}: a condition table has exactly one top-level key 'conditions', got {keys}")
    return parse_conditions(doc["conditions"], str(p))
