"""Packaging: every importable sub-package is declared, and nothing installs a generic top-level name."""

import tomllib
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit  # builds no model (make test-unit)

ROOT = Path(__file__).resolve().parents[1]


def test_every_package_directory_is_declared():
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    declared = set(cfg["packages"])
    mapping = cfg["package-dir"]
    found = set()
    for name, src in mapping.items():
        for init in (ROOT / src).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / src)
            found.add(".".join([name, *rel.parts]) if rel.parts else name)
    assert found <= declared, f"packages missing from pyproject: {sorted(found - declared)}"
    assert all(p == "timbench" or p.startswith("timbench.") for p in declared)


def test_installed_numerics_libraries_match_constraints():
    """The venv runs exactly the library versions constraints.txt pins: a drift, e.g. an extra's
    install moving numba, fails here instead of silently changing bytes."""
    from importlib.metadata import PackageNotFoundError, version

    root = Path(__file__).resolve().parents[1]
    pins = [line.split("#")[0].strip() for line in (root / "constraints.txt").read_text().splitlines()]
    pins = [p.split("==") for p in pins if p]
    assert {"torch", "numba", "llvmlite", "numpy"} <= {name for name, _ in pins}
    wrong = []
    for name, want in pins:
        try:
            got = version(name).split("+")[0]  # torch 2.13.0+cpu is the 2.13.0 pin
        except PackageNotFoundError:
            got = None
        if got != want:
            wrong.append(f"{name}: installed {got}, pinned {want}")
    assert not wrong, "run `make setup` (pip install -c constraints.txt): " + "; ".join(wrong)
