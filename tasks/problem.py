"""One task problem: prompt, canonical answer and a reference solution (its own module, so that
tasks.base and tasks.io both import it without importing each other)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Problem:
    """One problem. `answer` is the canonical final answer, `solution` a correct
    response in the task's documented format (for supervised warm start)."""

    prompt: str
    answer: str
    task: str
    meta: dict = field(default_factory=dict, hash=False)  # hashable despite the dict
    solution: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "prompt": self.prompt,
            "answer": self.answer,
            "task": self.task,
            "meta": dict(self.meta),
            "solution": self.solution,
        }
