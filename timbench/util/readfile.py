"""Reading user-supplied YAML and JSON files with one kind of error for every bad input.

A missing file is a FileNotFoundError "<what> <path> does not exist"; a file that does not parse is a
ValueError "<path>: malformed YAML|JSON (<first line of the parser's message>)", and one that is not
UTF-8 text (a binary file) is a ValueError "<path>: not UTF-8 text (...)". Callers then check the
shape of what they got. Writes go through `timbench.util.atomic`.
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
        raise ValueError(
            f"{p}: not UTF-8 text (byte {e.start} is {e.object[e.start : e.start + 1]!r}); is it a binary file?"
        ) from None


class KeyShapeError(ValueError):
    """A YAML mapping key this loader refuses: given twice, or not a plain value."""


class DuplicateKeyError(KeyShapeError):
    """A YAML mapping that gives one key twice (PyYAML would silently keep the last)."""


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key given twice in one mapping (naming the key and both lines) or a complex key."""

    def construct_mapping(self, node, deep=False):
        seen: dict = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            try:
                hash(key)
            except TypeError:  # a YAML complex key (`? [a, b]`): no config key is a list or a mapping
                raise KeyShapeError(
                    f"line {line}: a mapping key is a {type(key).__name__} (a YAML `?` complex key); "
                    "keys must be plain names"
                ) from None
            if key in seen:
                raise DuplicateKeyError(f"key {key!r} is given twice (lines {seen[key]} and {line}); give it once")
            seen[key] = line
        return super().construct_mapping(node, deep)


def load_yaml_text(text: str):
    """yaml.safe_load that refuses duplicate and complex keys (KeyShapeError)."""
    return yaml.load(text, Loader=_UniqueKeyLoader)


def read_yaml(path, what: str = "file"):
    """The parsed YAML document at `path` (None for an empty file); a key given twice is an error."""
    p = _existing(path, what)
    try:
        return load_yaml_text(_text(p))
    except KeyShapeError as e:
        raise ValueError(f"{p}: {e}") from None
    except yaml.YAMLError as e:
        raise ValueError(f"{p}: malformed YAML ({' '.join(str(e).split())})") from None


def read_json(path, what: str = "file"):
    """The parsed JSON document at `path`."""
    p = _existing(path, what)
    try:
        return json.loads(_text(p))
    except json.JSONDecodeError as e:
        raise ValueError(f"{p}: malformed JSON ({e.msg} at line {e.lineno})") from None
