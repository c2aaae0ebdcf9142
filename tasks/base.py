"""The `Problem` record and the abstract `Task` every task family implements.

Determinism: every generator is a `random.Random` seeded with a *string*
(`"<name>:train:<seed>:<step>"`, `"<name>:eval"`); string seeds go through
SHA-512 inside `random`, so they are stable across runs, machines and Python
builds (unlike `hash()`, which is salted per process).

Train/eval disjointness is by construction, not by filtering: a prompt belongs
to the eval split iff the last byte of `sha256(prompt)` is even, otherwise to the
train split (`split_of`). Generators rejection-sample until the prompt falls on
the requested side, so no train stream, however long, can ever produce an eval
prompt, and the rule needs no stored state. It depends only on the prompt text,
so a prompt keeps its side across task versions that render it identically.
"""

from __future__ import annotations

import abc
import hashlib
import random
import re
from collections.abc import Iterator
from typing import Any, ClassVar

from .io import to_dataset
from .problem import Problem

SPLITS = ("train", "eval")
# Rejection sampling halves the acceptance rate; 200 misses in a row means the
# generator's prompt space is (almost) all on one side, which is a bug.
_MAX_REJECTIONS = 200
# Canonical integer: no sign but '-', no leading zeros; bounded so a huge
# malformed response can never reach int() (which raises past 4300 digits).
CANONICAL_INT = re.compile(r"-?(0|[1-9][0-9]{0,63})")


def split_of(prompt: str) -> str:
    """'eval' if sha256(prompt) ends in an even byte, else 'train'."""
    return "eval" if hashlib.sha256(prompt.encode("utf-8")).digest()[-1] % 2 == 0 else "train"


def is_canonical_int(text: str) -> bool:
    return CANONICAL_INT.fullmatch(text) is not None and text != "-0"


def text_after_last(response: str, marker: str) -> str | None:
    """The stripped text after the last `marker`, or None if there is none."""
    i = response.rfind(marker)
    return None if i < 0 else response[i + len(marker) :].strip()


class Task(abc.ABC):
    """A generator of problems plus the verifier for its response format.

    Subclasses set the class attributes and implement `sample` and
    `extract_answer`; registered subclasses fix `difficulty` (their generator
    parameters), while constructing a family class with other parameters gives
    an unregistered variant named `<family>-v<version>[k=v,...]`, so its seeds
    never collide with a registered task's.
    """

    name: ClassVar[str] = ""
    family: ClassVar[str] = ""
    version: ClassVar[int] = 1
    difficulty: ClassVar[dict] = {}
    description: ClassVar[str] = ""

    def __init__(self, **params: Any):
        base = dict(type(self).difficulty)
        unknown = sorted(set(params) - set(base))
        if unknown:
            raise TypeError(f"{type(self).__name__}: unknown parameter(s) {unknown}; valid: {sorted(base)}")
        merged = {**base, **params}
        # Instance attributes shadow the class ones; the class dict is never mutated.
        self.difficulty = merged
        if merged != base:
            args = ",".join(f"{k}={v}" for k, v in sorted(merged.items()))
            self.name = f"{self.family}-v{self.version}[{args}]"
        self.validate()

    def validate(self) -> None:  # noqa: B027 - an optional hook: a task without parameters to check keeps this
        """Check `self.difficulty`; raise ValueError on impossible parameters."""

    # ---- generation -----------------------------------------------------
    @abc.abstractmethod
    def sample(self, rng: random.Random) -> Problem:
        """One problem from either split (the split rule is applied by `generate`)."""

    def generate(self, rng: random.Random, split: str = "train") -> Problem:
        """One problem whose prompt lies in `split` ('train' or 'eval')."""
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        for _ in range(_MAX_REJECTIONS):
            p = self.sample(rng)
            if split_of(p.prompt) == split:
                return p
        raise RuntimeError(f"{self.name}: no {split} prompt in {_MAX_REJECTIONS} samples")

    def train_stream(self, seed: int) -> Iterator[Problem]:
        """Infinite deterministic stream of training problems."""
        rng = random.Random(f"{self.name}:train:{seed}")
        while True:
            yield self.generate(rng, "train")

    def train_batch(self, seed: int, step: int, n: int) -> list[Problem]:
        """The `n` training problems of step `step`: random access, no stream state."""
        rng = random.Random(f"{self.name}:train:{seed}:{step}")
        return [self.generate(rng, "train") for _ in range(n)]

    def eval_set(self, n: int = 512) -> list[Problem]:
        """`n` distinct eval problems; the same list on every call and machine.

        Prefix-stable: `eval_set(k) == eval_set(n)[:k]` for k <= n.
        """
        rng = random.Random(f"{self.name}:eval")
        seen: set[str] = set()
        out: list[Problem] = []
        for _ in range(100 * n + 1000):
            if len(out) >= n:
                break
            p = self.generate(rng, "eval")
            if p.prompt not in seen:
                seen.add(p.prompt)
                out.append(p)
        if len(out) < n:
            raise ValueError(f"{self.name}: could only find {len(out)} distinct eval problems (asked {n})")
        return out

    # ---- verification ---------------------------------------------------
    @abc.abstractmethod
    def extract_answer(self, response: str) -> str | None:
        """The final answer in canonical form, or None if the format is broken.
        Never raises."""

    def is_correct(self, extracted: str, problem: Problem) -> bool:
        return extracted == problem.answer

    def reward(self, response: str, problem: Problem, format_reward: float = 0.0) -> float:
        """1.0 if the final answer is correct, else 0.0; plus `format_reward` if
        the response is well formed (an answer could be extracted). Never raises."""
        if not isinstance(response, str):
            return 0.0
        extracted = self.extract_answer(response)
        if extracted is None:
            return 0.0
        return (1.0 if self.is_correct(extracted, problem) else 0.0) + format_reward

    # ---- export ---------------------------------------------------------
    def to_dataset(self, problems):
        return to_dataset(problems)

    def make_problem(self, prompt: str, answer: str, solution: str, **meta: Any) -> Problem:
        return Problem(prompt=prompt, answer=answer, task=self.name, meta=meta, solution=solution)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}>"
