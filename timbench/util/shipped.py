"""Where the shipped warm-start checkpoints lie: package data under `timbench/assets/checkpoints/<task>-<preset>`."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

ASSET_DIR = "assets/checkpoints"


def _asset_root() -> Path:
    return Path(str(resources.files("timbench"))) / ASSET_DIR


def available_checkpoints() -> list[str]:
    """Names (`<task>-<preset>`) of the shipped checkpoints."""
    root = _asset_root()
    if not root.is_dir():
        return []
    return sorted(p.name for p in root.iterdir() if (p / "config.json").is_file())


def shipped_checkpoint(name: str) -> Path:
    """Directory of the shipped checkpoint `name` (`<task>-<preset>`, one of `available_checkpoints()`)."""
    return _asset_root() / name


def default_checkpoint(task: str = "add-4d-v1", model: str = "tiny-dense") -> Path:
    """Directory of the shipped warm-start checkpoint `<task>-<model>`."""
    d = shipped_checkpoint(f"{task}-{model}")
    if not (d / "config.json").is_file():
        have = available_checkpoints()
        raise FileNotFoundError(
            f"no shipped warm-start checkpoint for task {task!r} and model {model!r}; "
            f"available: {', '.join(have) if have else 'none'}"
        )
    return d


def resolve_checkpoint(model: str, task: str, preset: str) -> Path:
    """A run's warm start: `model` itself, or the shipped checkpoint of (task, preset) for `default`."""
    return default_checkpoint(task, preset) if model == "default" else Path(model)
