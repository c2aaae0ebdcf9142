"""Reading user-supplied YAML and JSON files with one kind of error for every bad input.

A missing file is a FileNotFoundError "<what> <path> does not exist"; a file that does not parse is a
ValueError "<path>: malformed YAML|JSON (<first line of the parser's message>)", and one that is not
UTF-8 text (a binary file) is a ValueError "<path>: not UTF-8 text (...)". Callers then check the
shape of what they got. Writes go through `timbench.atomic`.
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml


def _existing(path, what: str) -> Path:
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"{what} {p} does not exist")
    return p


def _text(p: Path) -> str:
    try:
        return p.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{p}: not UTF-8 text (byte {e.start} is {e.object[e.start:e.start + 1]!r}); "
                         "is it a binary file?") from None


def read_yaml(path, what: str = "file"):
    """The parsed YAML document at `path` (None for an empty file)."""
    p = _existing(path, what)
    try:
        return yaml.safe_load(_text(p))
    except yaml.YAMLError as e:
        raise ValueError(f"{p}: malformed YAML ({' '.join(str(e).split())})") from None


def read_json(path, what: str = "file"):
    """The parsed JSON document at `path`."""
    p = _existing(path, what)
    try:
        return json.loads(_text(p))
    except json.JSONDecodeError as e:
        raise ValueError(f"{p}: malformed JSON ({e.msg} at line {e.lineno})") from None
