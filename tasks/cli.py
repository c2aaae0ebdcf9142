"""`timbench tasks ...`: list, show and score tasks from the command line.

`add_parser(subparsers)` registers the `tasks` subcommand; each `cmd_*` takes
the parsed args, prints its result to stdout and returns an exit status. Errors
are printed as one line, `timbench tasks: error: ...`, with status 2.

    timbench tasks list [--json]
    timbench tasks show NAME [--split eval|train] [--n 5] [--seed S] [--json]
    timbench tasks score NAME --file predictions.jsonl [--n 512]

A predictions line is `{"prompt": ..., "response": ...}`; the problem is found by
its prompt in the task's eval set (first `--n` problems), else built from the
line's `answer` field, else by `id` (an index into that eval set).
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

from .base import Problem
from .registry import get_task, list_tasks


class CliError(Exception):
    """A user-facing error; its message is printed as the one error line."""


def _fail(msg: str) -> int:
    print(f"timbench tasks: error: {msg}", file=sys.stderr)
    return 2


def _guarded(fn):
    def run(args) -> int:
        try:
            return fn(args)
        except (CliError, KeyError, ValueError, OSError) as e:
            return _fail(str(e) or repr(e))

    run.__name__, run.__doc__ = fn.__name__, fn.__doc__
    return run


@_guarded
def cmd_list(args) -> int:
    """Print the registered tasks (name, difficulty, mean response tokens, ...)."""
    rows = list_tasks()
    if getattr(args, "json", False):
        print(json.dumps(rows, indent=2))
        return 0
    print(f"{'name':<18} {'family':<15} {'resp tok':>8}  description")
    for r in rows:
        print(f"{r['name']:<18} {r['family']:<15} {r['mean_response_tokens']:>8.1f}  {r['description']}")
    return 0


@_guarded
def cmd_show(args) -> int:
    """Print the first `--n` problems of a split."""
    task = get_task(args.name)
    _check_n(args.n, 0)
    if args.split == "eval":
        problems = task.eval_set(args.n)
    else:
        problems = list(itertools.islice(task.train_stream(args.seed), args.n))
    if args.json:
        print(json.dumps([p.to_dict() for p in problems], indent=2))
        return 0
    for p in problems:
        print(f"{p.prompt}{p.solution}    [answer {p.answer}]")
    return 0


def _check_n(n: int, least: int) -> None:
    if n < least:
        raise CliError(f"--n must be >= {least}, got {n}")


def _read_predictions(path: Path) -> list[dict]:
    """The JSON objects of a predictions file; a missing, non-text or empty file is a CliError."""
    if path.is_dir():
        raise CliError(f"{path} is a directory; --file takes a predictions JSONL file")
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise CliError(
            f"{path}: not UTF-8 text (byte {e.start}); --file takes a predictions JSONL file, one JSON object per line"
        ) from None
    lines = []
    for i, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise CliError(f"{path}:{i}: not valid JSON ({e.msg})") from None
        if not isinstance(rec, dict) or not isinstance(rec.get("response"), str):
            raise CliError(f"{path}:{i}: expected an object with a string 'response'")
        lines.append(rec)
    if not lines:  # scoring nothing would print accuracy 0.0 for n=0 and exit 0
        raise CliError(
            f"{path}: no predictions (the file is empty); expected one JSON object per line with a string 'response'"
        )
    return lines


def _problem_for(rec: dict, task, by_prompt: dict[str, Problem], eval_list: list[Problem], where: str) -> Problem:
    prompt = rec.get("prompt")
    if isinstance(prompt, str) and prompt in by_prompt:
        return by_prompt[prompt]
    if "answer" in rec:
        return Problem(prompt=str(prompt or ""), answer=str(rec["answer"]), task=task.name)
    if isinstance(prompt, str):
        raise CliError(
            f"{where}: prompt {prompt!r} is not in the eval set (first {len(eval_list)}) and the line has no 'answer'"
        )
    idx = rec.get("id")
    if isinstance(idx, int) and not isinstance(idx, bool) and 0 <= idx < len(eval_list):
        return eval_list[idx]
    raise CliError(f"{where}: needs a 'prompt', an 'answer', or an 'id' in 0..{len(eval_list) - 1}")


@_guarded
def cmd_score(args) -> int:
    """Score a predictions JSONL file with the task verifier; print accuracy JSON."""
    task = get_task(args.name)
    _check_n(args.n, 1)
    path = Path(args.file)
    records = _read_predictions(path)
    eval_list = task.eval_set(args.n)
    by_prompt = {p.prompt: p for p in eval_list}
    correct = well_formed = 0
    for i, rec in enumerate(records, 1):
        problem = _problem_for(rec, task, by_prompt, eval_list, f"{path}:{i}")
        correct += task.reward(rec["response"], problem) >= 1.0
        well_formed += task.extract_answer(rec["response"]) is not None
    n = len(records)
    print(
        json.dumps(
            {
                "task": task.name,
                "file": str(path),
                "n": n,
                "correct": int(correct),
                "accuracy": correct / n,
                "well_formed": well_formed / n,
            }
        )
    )
    return 0


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Register `tasks {list,show,score}` on an argparse subparsers object."""
    p = subparsers.add_parser("tasks", help="list, show and score the math tasks")
    sub = p.add_subparsers(dest="tasks_command", metavar="{list,show,score}", required=True)

    sp = sub.add_parser("list", help="list registered tasks")
    sp.add_argument("--json", action="store_true", help="print JSON")
    sp.set_defaults(func=cmd_list)

    sp = sub.add_parser("show", help="print problems of a task")
    sp.add_argument("name", help="task name (timbench tasks list)")
    sp.add_argument("--split", choices=("eval", "train"), default="eval", help="which split to draw from")
    sp.add_argument("--n", type=int, default=5, help="how many problems to print")
    sp.add_argument("--seed", type=int, default=0, help="train stream seed (the eval set is fixed)")
    sp.add_argument("--json", action="store_true", help="print JSON")
    sp.set_defaults(func=cmd_show)

    sp = sub.add_parser("score", help="score a predictions JSONL file")
    sp.add_argument("name", help="task name (timbench tasks list)")
    sp.add_argument("--file", required=True, help="JSONL lines {prompt, response} (or id / answer)")
    sp.add_argument("--n", type=int, default=512, help="eval-set size to match prompts against")
    sp.set_defaults(func=cmd_score)
    return p
