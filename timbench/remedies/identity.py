"""A remedy's identity in results: a plug-in file is `name@sha8` (class name + file content hash), never its path.

The spec a user writes (`path/to/file.py:Class`) still loads the code, but cell ids, run directories,
leaderboards and submissions carry the identity, so the same file copied or moved elsewhere is the same
remedy and an edited file is another one. Every other spec (built-in, verl/TRL vocabulary, `pkg.module:Class`,
entry point) holds no path and is its own identity, byte-identical to before.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

HASH_CHARS = 8
"""Hex digits of the file's sha256 kept in the identity (collisions need ~65k plug-ins of one name)."""


def split_file_spec(spec: str) -> tuple[str, str] | None:
    """(file, class) of a `path/to/file.py:Class` spec, else None (the registry's rule for a file target)."""
    if not isinstance(spec, str):
        return None
    target, _, cls_name = spec.strip().rpartition(":")
    if not target or not cls_name:
        return None
    return (target, cls_name) if target.endswith(".py") or "/" in target or "\\" in target else None


def is_file_spec(spec: str) -> bool:
    return split_file_spec(spec) is not None


def content_hash(path: str | Path) -> str:
    """First HASH_CHARS hex digits of the sha256 of the file's bytes (its content, not its location)."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"remedy file {p} does not exist")
    return hashlib.sha256(p.read_bytes()).hexdigest()[:HASH_CHARS]


def remedy_identity(spec: str) -> str:
    """`name@sha8` for a plug-in file spec (name: the class's `name`, else its class name); any other spec as is."""
    parts = split_file_spec(spec)
    if parts is None:
        return spec
    from .registry import resolve  # deferred: torch is heavy (and it imports the plug-in file)

    cls = resolve(spec)
    return f"{cls.name or cls.__name__}@{content_hash(parts[0])}"


def other_version(identity: str, identities) -> str | None:
    """The first of `identities` with the same plug-in name as `identity` and another content hash, else None."""
    if "@" not in identity:
        return None
    name = identity.partition("@")[0]
    return next((i for i in sorted(identities) if i != identity and "@" in i and i.partition("@")[0] == name), None)


def comparable_remedy(spec):
    """The spec without the plug-in file's directory: what a resume check compares, so a moved file resumes.

    Content changes are caught by the identity on the remedy axis (in the cell id); this only drops the path.
    """
    parts = split_file_spec(spec)
    return spec if parts is None else f"{Path(parts[0].replace(chr(92), '/')).name}:{parts[1]}"


def comparable_config(config: dict) -> dict:
    """A RunConfig dict with `remedy` made directory-independent (comparable_remedy); other keys untouched."""
    if not isinstance(config, dict) or "remedy" not in config:
        return config
    return {**config, "remedy": comparable_remedy(config["remedy"])}


def comparable_cell(cell):
    """A cells.json entry with its config made directory-independent (comparable_config); anything else as is."""
    if not isinstance(cell, dict) or "config" not in cell:
        return cell
    return {**cell, "config": comparable_config(cell["config"])}
