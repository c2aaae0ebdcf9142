"""Where a result came from: installed distributions' versions and the checkout's git revision (the CLI's
`--version` and the gate's identity both print them; here so that the gate need not import the CLI)."""

from __future__ import annotations

import os
import subprocess
from importlib.metadata import PackageNotFoundError, version


def dist_version(name: str) -> str:
    """An installed distribution's version from its metadata (no import of the package itself)."""
    try:
        return version(name)
    except PackageNotFoundError:
        return "not installed"


def git_revision() -> str | None:
    """The checkout's commit (+ "-dirty" with uncommitted changes), or None outside a git checkout."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    try:
        rev = subprocess.run(
            ["git", "-C", root, "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True, timeout=5
        )
        if rev.returncode != 0:
            return None
        dirty = subprocess.run(
            ["git", "-C", root, "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=5,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return rev.stdout.strip() + ("-dirty" if dirty else "")
