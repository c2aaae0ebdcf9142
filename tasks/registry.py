"""Name -> task class registry (module-level state, filled once as the task modules are imported).

Task modules register their fixed-difficulty classes with `@register`; importing
`timbench.tasks` imports them all, so the registry is complete after import.
"""

from __future__ import annotations

import random
from statistics import mean
from typing import Any

from timbench.util.registry import Registry

from .base import Task

DEFAULT_TASK = "add-4d-v1"


class UnknownTaskError(KeyError):
    """Unknown task name; `str()` is a one-line message listing the valid names."""

    def __str__(self) -> str:  # KeyError's default repr-quotes the message
        return str(self.args[0]) if self.args else ""


_REGISTRY: Registry[type[Task]] = Registry("task", error=UnknownTaskError, valid_label="valid names", sort=True)


def register(cls: type[Task]) -> type[Task]:
    """Class decorator: make `cls` available as `get_task(cls.name)`."""
    if not cls.name:
        raise ValueError(f"{cls.__name__} has no name")
    return _REGISTRY.register(cls.name, cls)


def task_names() -> list[str]:
    return sorted(_REGISTRY)


def get_task(name: str) -> Task:
    """A fresh instance of the registered task `name`."""
    return _REGISTRY.lookup(name)()


def response_stats(task: Task, n: int = 256) -> dict[str, float]:
    """Token counts of `n` generated solutions (+1 for the EOS the engine appends)
    and prompts, from a fixed generator so the numbers are reproducible."""
    from timbench.tokenizer import CharTokenizer

    tok = CharTokenizer()
    rng = random.Random(f"{task.name}:stats")
    problems = [task.sample(rng) for _ in range(n)]
    resp = [len(tok.encode(p.solution)) + 1 for p in problems]
    prompt = [len(tok.encode(p.prompt)) for p in problems]
    return {
        "mean_response_tokens": round(mean(resp), 2),
        "max_response_tokens": max(resp),
        "mean_prompt_tokens": round(mean(prompt), 2),
        "max_prompt_tokens": max(prompt),
    }


def describe(task: Task, n: int = 256) -> dict[str, Any]:
    return {
        "name": task.name,
        "family": task.family,
        "version": task.version,
        "difficulty": dict(task.difficulty),
        "description": task.description,
        **response_stats(task, n),
    }


def list_tasks(n: int = 256) -> list[dict[str, Any]]:
    """One summary dict per registered task, sorted by name."""
    return [describe(get_task(name), n) for name in task_names()]
