"""Packaging: every importable sub-package is declared, and nothing installs a generic top-level name."""

import tomllib
from pathlib import Path

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
