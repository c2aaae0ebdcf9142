"""Linear equations `a*x+b=c` with an integer solution (`lineq-v1`).

Prompt: `a*x+b=c:` with a in ±[2, a_max], b in ±[1, b_max] written with its sign,
x in [-x_max, x_max]; the trailing `:` ends the prompt (the prompt itself
contains `=`).
Response: move b across (`a*x=c-b=<value>`, written `c+|b|` when b < 0), then
`;x=` and the integer solution. The final answer is the text after the last
`x=`, in canonical integer form. Only the final answer is rewarded.

    prompt   3*x-4=11:
    solution 3*x=11+4=15;x=5          answer 5

    prompt   -7*x+12=-2:
    solution -7*x=-2-12=-14;x=2       answer 2
"""

from __future__ import annotations

import random

from .base import Problem, Task, is_canonical_int, text_after_last
from .registry import register


@register
class LinearEquationTask(Task):
    family = "lineq"
    version = 1
    name = "lineq-v1"
    difficulty = {"a_max": 9, "b_max": 20, "x_max": 20}
    description = "solve a*x+b=c for integer x; response 'a*x=c-b=<v>;x=<x>'"

    def validate(self) -> None:
        d = self.difficulty
        if d["a_max"] < 2 or d["b_max"] < 1 or d["x_max"] < 0:
            raise ValueError("need a_max >= 2, b_max >= 1, x_max >= 0")

    def sample(self, rng: random.Random) -> Problem:
        d = self.difficulty
        a = rng.randint(2, d["a_max"]) * rng.choice((-1, 1))
        b = rng.randint(1, d["b_max"]) * rng.choice((-1, 1))
        x = rng.randint(-d["x_max"], d["x_max"])
        c = a * x + b
        prompt = f"{a}*x{b:+d}={c}:"
        sol = f"{a}*x={c}{-b:+d}={c - b};x={x}"
        return self.make_problem(prompt, str(x), sol, a=a, b=b, c=c)

    def extract_answer(self, response: str) -> str | None:
        tail = text_after_last(response, "x=")
        return tail if tail is not None and is_canonical_int(tail) else None
