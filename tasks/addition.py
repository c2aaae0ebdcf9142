"""n-digit addition with column sums, the default task family (`add-4d-v1`).

Prompt: the bare problem, both operands with exactly n digits.
Response: the n column sums (digit + digit + carry-in) as two-digit values,
least significant column first, then `#` and the answer digits least
significant first (see `columns`). Only the final answer is rewarded.

    prompt   1234+5678=
    solution 12 11 09 06#2196        answer 6912 (17 tokens with EOS)

    prompt   905+187=
    solution 12 09 10#2901           answer 1092
"""

from __future__ import annotations

import random

from . import columns
from .base import Problem, Task
from .registry import register


class AdditionTask(Task):
    family = "addition"
    version = 1
    name = "add-4d-v1"
    difficulty = {"n_digits": 4}
    description = "4-digit addition; column sums least significant first, then '#' and the reversed answer"

    def validate(self) -> None:
        if not 1 <= self.difficulty["n_digits"] <= 30:
            raise ValueError("n_digits must be in 1..30")

    def sample(self, rng: random.Random) -> Problem:
        n = self.difficulty["n_digits"]
        lo = 10 ** (n - 1) if n > 1 else 0
        a, b = rng.randint(lo, 10**n - 1), rng.randint(lo, 10**n - 1)
        return self.make_problem(f"{a}+{b}=", str(a + b), solution(a, b, n), a=a, b=b)

    def extract_answer(self, response: str) -> str | None:
        return columns.extract_reversed(response)


def solution(a: int, b: int, n: int) -> str:
    values, carry = [], 0
    for da, db in zip(columns.digits_lsd(a, n), columns.digits_lsd(b, n)):
        s = da + db + carry
        values.append(s)
        carry = s // 10
    return columns.render(values, carry)


register(AdditionTask)


@register
class Add3D(AdditionTask):
    name = "add-3d-v1"
    difficulty = {"n_digits": 3}
    description = "3-digit addition; column sums least significant first, then '#' and the reversed answer"


@register
class Add5D(AdditionTask):
    name = "add-5d-v1"
    difficulty = {"n_digits": 5}
    description = "5-digit addition; column sums least significant first, then '#' and the reversed answer"
