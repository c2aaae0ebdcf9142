"""Gate suites: versioned YAML files (`bench/gates/<name>.yaml`) naming the probes, their work and thresholds."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from ..util.readfile import read_yaml
from .probes import PROBES
from .shapes import valid_models
from .suite_values import check_values

ROOT = Path(__file__).resolve().parents[2]
SUITES_DIR = ROOT / "bench" / "gates"
"""Where `--suite NAME` looks (a checkout or editable install); a path to a .yaml file works anywhere."""


@dataclass(frozen=True)
class Suite:
    name: str
    version: int
    models: tuple[str, ...]
    seed: int
    temperature: float
    probes: dict
    """probe name -> its parameters, in run order."""
    baseline: Path | None = None
    """The stored gate run `timbench gate run` compares with by default (the suite's `baseline:`, a path from the
    repository root), or None when the suite has none."""
    content: str = ""
    """sha256 of what the suite tests (`content_hash`): gate runs record it, and `gate check` refuses to compare
    two runs of the same name and version whose suites differ."""


def content_hash(doc: dict) -> str:
    """sha256 of a suite document as parsed (comments and layout do not count; `baseline`, a path to compare
    with, is not part of the test)."""
    return hashlib.sha256(
        json.dumps({k: v for k, v in doc.items() if k != "baseline"}, sort_keys=True, default=str).encode()
    ).hexdigest()


def load_suite(name_or_path: str) -> Suite:
    """A suite by name (bench/gates/NAME.yaml) or path; a one-line ValueError naming what is valid otherwise."""
    path = Path(name_or_path)
    if path.suffix != ".yaml":
        path = SUITES_DIR / f"{name_or_path}.yaml"
    if not path.is_file():
        known = sorted(p.stem for p in SUITES_DIR.glob("*.yaml")) if SUITES_DIR.is_dir() else []
        raise ValueError(
            f"unknown gate suite {name_or_path!r}; valid: {', '.join(known) or 'none found'} "
            "(or a path to a suite .yaml)"
        )
    doc = read_yaml(path, "gate suite") or {}
    need = ("name", "version", "models", "probes")
    missing = [k for k in need if k not in doc]
    if missing:
        raise ValueError(f"gate suite {path}: missing key(s) {missing}; a suite has {', '.join(need)}")
    bad = sorted(set(doc["models"]) - set(valid_models())) if isinstance(doc["models"], list) else doc["models"]
    if bad:
        raise ValueError(
            f"gate suite {path}: unknown model(s) {bad}; valid: {', '.join(valid_models())} "
            "(a shipped add-4d-v1 warm start or a production shape of timbench.gate.shapes)"
        )
    if not isinstance(doc["probes"], dict):
        raise ValueError(f"gate suite {path}: probes must be a mapping of probe name to its parameters")
    unknown = sorted(set(doc["probes"]) - set(PROBES))
    if unknown:
        raise ValueError(f"gate suite {path}: unknown probe(s) {unknown}; valid: {', '.join(PROBES)}")
    check_values(doc, f"gate suite {path}")
    baseline = doc.get("baseline")
    if baseline is not None and not isinstance(baseline, str):
        raise ValueError(f"gate suite {path}: baseline must be a path (a gate run's directory), got {baseline!r}")
    return Suite(
        doc["name"],
        int(doc["version"]),
        tuple(doc["models"]),
        int(doc.get("seed", 0)),
        float(doc.get("temperature", 1.0)),
        dict(doc["probes"]),
        baseline and ROOT / baseline,
        content_hash(doc),
    )
