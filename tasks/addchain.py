"""Chained addition with running partial sums: the long-response family.

Training-inference mismatch accumulates over the tokens of a sequence, so this
family exists to give responses of ~40-150 tokens with the same per-step skill
(adding two numbers) as the short tasks.

Prompt: `t1+t2+...+tk=`, each term with exactly `digits` digits.
Response: one step per term after the first, `acc+t=new`, separated by `;`,
then `#` and the total (normal digit order). Only the final answer is rewarded.

    prompt   12+34+56+78+90=
    solution 12+34=46;46+56=102;102+78=180;180+90=270#270     answer 270

`addchain-v1`: 5-8 two-digit terms (mean ~63 response tokens, up to ~80).
`addchain-long-v1`: 8-12 three-digit terms (mean ~130 response tokens, up to ~160).
"""

from __future__ import annotations

import random

from .base import Problem, Task, is_canonical_int, text_after_last
from .registry import register


@register
class AddChainTask(Task):
    family = "addchain"
    version = 1
    name = "addchain-v1"
    difficulty = {"min_terms": 5, "max_terms": 8, "digits": 2}
    description = "sum of 5-8 two-digit numbers with running partial sums 'a+b=s;s+c=t;...#total'"

    def validate(self) -> None:
        d = self.difficulty
        if not 2 <= d["min_terms"] <= d["max_terms"] <= 100 or not 1 <= d["digits"] <= 18:
            raise ValueError("need 2 <= min_terms <= max_terms <= 100 and 1 <= digits <= 18")

    def sample(self, rng: random.Random) -> Problem:
        d = self.difficulty
        lo = 10 ** (d["digits"] - 1) if d["digits"] > 1 else 0
        k = rng.randint(d["min_terms"], d["max_terms"])
        terms = [rng.randint(lo, 10 ** d["digits"] - 1) for _ in range(k)]
        steps, acc = [], terms[0]
        for t in terms[1:]:
            steps.append(f"{acc}+{t}={acc + t}")
            acc += t
        prompt = "+".join(map(str, terms)) + "="
        return self.make_problem(prompt, str(acc), ";".join(steps) + f"#{acc}", terms=terms)

    def extract_answer(self, response: str) -> str | None:
        tail = text_after_last(response, "#")
        return tail if tail is not None and is_canonical_int(tail) else None


@register
class AddChainLong(AddChainTask):
    name = "addchain-long-v1"
    difficulty = {"min_terms": 8, "max_terms": 12, "digits": 3}
    description = "sum of 8-12 three-digit numbers with running partial sums (~130-token responses)"
