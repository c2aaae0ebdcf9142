"""Loaders for real math datasets the user already has on disk.

Supported layouts (Parquet, JSONL or JSON; one file = one split, used as-is):

- GSM8K:  `question`, `answer` (worked solution ending in `#### 42`)
- MATH / MATH-500: `problem`, `solution` (with `\\boxed{...}`), optional `answer`
- DAPO-Math-17k: `prompt` (a string or a chat list of {role, content}) and the
  gold answer in `reward_model.ground_truth`, else `solution` or `answer`

All return the common `Problem` schema (task = "gsm8k" | "math" | "dapo").
Real text may be non-ASCII: it is meant for users' own models, never for
`CharTokenizer`. Rows whose gold answer cannot be found are skipped with a
warning rather than kept with an unscorable empty answer.
"""

from __future__ import annotations

import os
import random
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .answers import answers_match, extract_boxed, extract_final_answer, extract_hash_answer
from .base import Problem, Task
from .io import read_records

KINDS = ("gsm8k", "math", "dapo")
_EXPECTED = {
    "gsm8k": "question, answer",
    "math": "problem, solution (optional answer)",
    "dapo": "prompt and one of reward_model, solution, answer",
}


def _require(path: Path, columns: list[str], kind: str, ok: bool) -> None:
    if not ok:
        raise ValueError(f"{path}: not a {kind} file: found columns {columns}, expected {_EXPECTED[kind]}")


def _meta(row: dict, keys: tuple[str, ...]) -> dict[str, Any]:
    return {k: row[k] for k in keys if row.get(k) is not None}


def _gsm8k(path: Path, columns: list[str], rows: list[dict]) -> list[Problem | None]:
    _require(path, columns, "gsm8k", {"question", "answer"} <= set(columns))
    out = []
    for i, r in enumerate(rows):
        gold = extract_hash_answer(str(r.get("answer") or ""))
        out.append(gold and Problem(str(r["question"]), gold, "gsm8k", {"index": i}, str(r["answer"])))
    return out


def _math(path: Path, columns: list[str], rows: list[dict]) -> list[Problem | None]:
    _require(path, columns, "math", {"problem", "solution"} <= set(columns))
    out = []
    for i, r in enumerate(rows):
        sol = str(r.get("solution") or "")
        gold = r.get("answer")
        gold = str(gold).strip() if gold not in (None, "") else extract_boxed(sol)
        meta = {"index": i, **_meta(r, ("level", "type", "subject", "unique_id"))}
        out.append(gold and Problem(str(r["problem"]), gold, "math", meta, sol))
    return out


def _chat_prompt(prompt: Any) -> tuple[str, list | None]:
    """(prompt text, chat messages or None): the last user turn of a chat list."""
    if isinstance(prompt, str):
        return prompt, None
    if isinstance(prompt, (list, tuple)):
        msgs = [m for m in prompt if isinstance(m, dict)]
        users = [m for m in msgs if m.get("role") == "user"] or msgs
        if users:
            return str(users[-1].get("content") or ""), msgs
    return "", None


def _dapo(path: Path, columns: list[str], rows: list[dict]) -> list[Problem | None]:
    _require(path, columns, "dapo", "prompt" in columns and bool({"reward_model", "solution", "answer"} & set(columns)))
    out = []
    for i, r in enumerate(rows):
        text, messages = _chat_prompt(r.get("prompt"))
        rm = r.get("reward_model")
        gold = rm.get("ground_truth") if isinstance(rm, dict) else None
        if gold in (None, ""):
            gold = r.get("answer") if r.get("answer") not in (None, "") else r.get("solution")
            # A worked solution rather than a bare answer: take its final answer.
            if isinstance(gold, str) and ("\\boxed" in gold or "####" in gold or "\n" in gold):
                gold = extract_final_answer(gold)
        gold = str(gold).strip() if gold not in (None, "") else None
        meta = {"index": i, **_meta(r, ("data_source", "ability", "extra_info"))}
        if messages is not None:
            meta["messages"] = messages
        sol = r.get("solution") if isinstance(r.get("solution"), str) else ""
        out.append(gold and text and Problem(text, gold, "dapo", meta, sol))
    return out


_LOADERS = {"gsm8k": _gsm8k, "math": _math, "dapo": _dapo}


def detect_kind(columns: list[str]) -> str | None:
    cols = set(columns)
    if {"question", "answer"} <= cols:
        return "gsm8k"
    if {"problem", "solution"} <= cols:
        return "math"
    if "prompt" in cols and cols & {"reward_model", "solution", "answer"}:
        return "dapo"
    return None


def load_real(path: str | os.PathLike, kind: str = "auto", limit: int | None = None) -> list[Problem]:
    """Problems from a GSM8K / MATH / DAPO file; `kind="auto"` detects by columns."""
    path = Path(path)
    if kind != "auto" and kind not in KINDS:
        raise ValueError(f"unknown dataset kind {kind!r}; valid: auto, {', '.join(KINDS)}")
    columns, rows = read_records(path)
    if kind == "auto":
        kind = detect_kind(columns) or ""
        if not kind:
            raise ValueError(
                f"{path}: unrecognised columns {columns}; expected one of: "
                + "; ".join(f"{k} ({v})" for k, v in _EXPECTED.items())
            )
    loaded = _LOADERS[kind](path, columns, rows)
    problems = [p for p in loaded if p]
    if len(problems) < len(loaded):
        warnings.warn(
            f"{path}: skipped {len(loaded) - len(problems)} of {len(loaded)} rows without a gold answer", stacklevel=2
        )
    return problems[:limit] if limit is not None else problems


def load_gsm8k(path, limit=None):
    return load_real(path, "gsm8k", limit)


def load_math(path, limit=None):
    return load_real(path, "math", limit)


def load_dapo(path, limit=None):
    return load_real(path, "dapo", limit)


def real_reward(response: str, problem: Problem, format_reward: float = 0.0) -> float:
    """1.0 if the response's final answer matches, plus `format_reward` if one was found."""
    pred = extract_final_answer(response) if isinstance(response, str) else None
    if pred is None:
        return 0.0
    return (1.0 if answers_match(pred, problem.answer) else 0.0) + format_reward


class RealTask(Task):
    """A file of real problems behind the `Task` interface (not registered).

    The file is one split chosen by the user, so there is no hash split:
    `eval_set(n)` is the first n problems in file order, and training shuffles
    the whole file with seeded generators.
    """

    family = "real"

    def __init__(self, path: str | os.PathLike, kind: str = "auto", name: str | None = None, limit: int | None = None):
        self.problems = load_real(path, kind, limit)
        if not self.problems:
            raise ValueError(f"{path}: no usable problems")
        self.name = name or f"{self.problems[0].task}:{Path(path).name}"
        self.difficulty = {"path": str(path), "kind": self.problems[0].task}
        self.description = f"{len(self.problems)} {self.problems[0].task} problems from {path}"

    def sample(self, rng: random.Random) -> Problem:
        return rng.choice(self.problems)

    def generate(self, rng: random.Random, split: str = "train") -> Problem:
        return self.sample(rng)

    def train_stream(self, seed: int) -> Iterator[Problem]:
        epoch = 0
        while True:
            order = list(self.problems)
            random.Random(f"{self.name}:train:{seed}:epoch{epoch}").shuffle(order)
            yield from order
            epoch += 1

    def eval_set(self, n: int | None = 512) -> list[Problem]:
        return list(self.problems[:n] if n is not None else self.problems)

    def extract_answer(self, response: str) -> str | None:
        return extract_final_answer(response)

    def is_correct(self, extracted: str, problem: Problem) -> bool:
        return answers_match(extracted, problem.answer)
