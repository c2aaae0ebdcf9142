"""Multi-digit by one-digit multiplication with column products (`mul-v1`: 3x1).

Prompt: `a*b=` with `a` of exactly `a_digits` digits and `b` in 2..9.
Response: per column of `a`, least significant first, the two-digit value
digit*b + carry-in (at most 9*9+8 = 89, so always two digits), then `#` and
the answer digits least significant first, including the final carry
(see `columns`). Only the final answer is rewarded.

    prompt   347*6=
    solution 42 28 20#2802           answer 2082 (14 tokens with EOS)
"""

from __future__ import annotations

import random

from . import columns
from .base import Problem, Task
from .registry import register


@register
class MultiplicationTask(Task):
    family = "multiplication"
    version = 1
    name = "mul-v1"
    difficulty = {"a_digits": 3}
    description = (
        "3-digit x 1-digit multiplication; column products least significant first, then '#' and the reversed answer"
    )

    def validate(self) -> None:
        if not 1 <= self.difficulty["a_digits"] <= 30:
            raise ValueError("a_digits must be in 1..30")

    def sample(self, rng: random.Random) -> Problem:
        n = self.difficulty["a_digits"]
        a = rng.randint(10 ** (n - 1) if n > 1 else 1, 10**n - 1)
        b = rng.randint(2, 9)
        return self.make_problem(f"{a}*{b}=", str(a * b), solution(a, b, n), a=a, b=b)

    def extract_answer(self, response: str) -> str | None:
        return columns.extract_reversed(response)


def solution(a: int, b: int, n: int) -> str:
    values, carry = [], 0
    for d in columns.digits_lsd(a, n):
        v = d * b + carry
        values.append(v)
        carry = v // 10
    return columns.render(values, carry)
