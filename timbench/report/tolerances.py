"""`timbench compare`'s tolerances: how much worse a candidate may be before it is a regression.

Apart from timbench.report.compare so that the CLI can list the keys in its help without importing the
comparison (which loads torch through the summary).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path

from ..util.readfile import read_yaml


@dataclass(frozen=True)
class Tolerances:
    """How much worse the candidate may be before `timbench compare` calls it a regression."""

    mismatch_rel: float = 0.5
    """Allowed relative growth of mean |delta| and k3_kl (0.5: up to 1.5x the baseline)."""
    mismatch_abs: float = 1e-12
    """Absolute slack added to the mismatch limits, so values at float-noise level (k3_kl ~1e-14) never flap."""
    accuracy_abs: float = 0.05
    """Allowed absolute drop of final accuracy T=1 for single-seed grid cells (seed groups of >= 2 seeds are
    judged by their intervals); ~2 standard errors of a 512-problem eval (SE <= 0.022)."""
    routing_abs: float = 0.01
    """Allowed absolute drop of MoE routing agreement (alignment rows)."""


def load_tolerances(path: str | Path | None) -> Tolerances:
    """Tolerances from a YAML mapping of overrides; unknown keys, non-numbers, NaN or negatives raise."""
    if path is None:
        return Tolerances()
    path = Path(path)
    data = read_yaml(path, "tolerances file") or {}
    valid = [f.name for f in dataclasses.fields(Tolerances)]
    if not isinstance(data, dict):
        raise ValueError(f"tolerances file {path}: expected a mapping with keys {', '.join(valid)}")
    values = {}
    for k, v in data.items():
        if k not in valid:
            raise ValueError(f"tolerances file {path}: unknown key {k!r}; valid: {', '.join(valid)}")
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            raise ValueError(f"tolerances file {path}: {k} must be a finite number >= 0, got {v!r}")
        values[k] = float(v)
    return Tolerances(**values)
