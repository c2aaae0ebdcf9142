"""Synthetic task suite: determinism, split disjointness, verifiers, IO, registry, CLI."""

from __future__ import annotations

import argparse
import json
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from timbench.tasks import (
    DEFAULT_TASK,
    Problem,
    UnknownTaskError,
    cli,
    expr,
    get_task,
    list_tasks,
    load_split,
    problems_from_dataset,
    save_split,
    split_of,
    task_names,
)
from timbench.tasks.addition import AdditionTask
from timbench.tasks.countdown import CountdownTask, parse_prompt
from timbench.tokenizer import CharTokenizer

pytestmark = pytest.mark.unit  # builds no model (make test-unit)

NAMES = task_names()
REQUIRED = {"add-3d-v1", "add-4d-v1", "mul-v1", "lineq-v1", "countdown-v1", "addchain-v1"}
GARBAGE = [
    "",
    " ",
    "#",
    "##",
    "x=",
    "x=-",
    "x=-0",
    "=",
    "((((",
    "1/0",
    "9" * 100_000,
    "#" + "9" * 100_000,
    "x=" + "9" * 10_000,
    "(" * 5000 + "1" + ")" * 5000,
    "\x00\x01",
    "é#12",
    "12 11 09 06#",
    "#-5",
    "#+5",
    "1" * 300,
    "1+" * 200 + "1",
    "2*" * 127 + "2",
    "None",
    "#06912",
    "x=05",
    "0#0",
]


@pytest.fixture(scope="module", params=NAMES)
def task(request):
    return get_task(request.param)


@pytest.fixture(scope="module")
def eval_sets():
    return {name: get_task(name).eval_set() for name in NAMES}


def test_required_tasks_registered():
    assert REQUIRED <= set(NAMES)
    assert DEFAULT_TASK == "add-4d-v1" and DEFAULT_TASK in NAMES


def test_determinism(task, eval_sets):
    a, b = task.train_batch(7, 3, 20), get_task(task.name).train_batch(7, 3, 20)
    assert a == b
    assert task.train_batch(7, 4, 20) != a and task.train_batch(8, 3, 20) != a
    s1, s2 = task.train_stream(5), get_task(task.name).train_stream(5)
    assert [next(s1) for _ in range(20)] == [next(s2) for _ in range(20)]
    assert eval_sets[task.name] == get_task(task.name).eval_set()
    assert task.eval_set(10) == eval_sets[task.name][:10]


def test_eval_set_distinct_and_pinned(eval_sets):
    for name, ev in eval_sets.items():
        assert len(ev) == 512 and len({p.prompt for p in ev}) == 512, name
        assert all(p.task == name for p in ev)
    # Pin the default task's first problems: a change here silently changes every benchmark number.
    first = eval_sets["add-4d-v1"][0]
    assert (first.prompt, first.solution, first.answer) == ("2247+7830=", "07 07 10 10#77001", "10077")


def test_train_eval_disjoint(task, eval_sets):
    eval_prompts = {p.prompt for p in eval_sets[task.name]}
    train = [p.prompt for step in range(20) for p in task.train_batch(0, step, 100)]
    assert not eval_prompts & set(train)
    assert all(split_of(p) == "train" for p in train)
    assert all(split_of(p) == "eval" for p in eval_prompts)


def test_solutions_score_one_and_encode(task):
    tok = CharTokenizer()
    rng = random.Random("test-solutions")
    for _ in range(200):
        p = task.sample(rng)
        assert task.reward(p.solution, p) == 1.0, (p.prompt, p.solution)
        assert task.extract_answer(p.solution) == p.answer or task.family == "countdown"
        assert task.reward(p.solution, p, format_reward=0.25) == 1.25
        tok.encode(p.prompt + p.solution)  # raises on a character outside the vocabulary
        assert "\n" not in p.prompt + p.solution


def test_wrong_and_malformed_score_zero(task, eval_sets):
    p = eval_sets[task.name][0]
    for bad in GARBAGE:
        r = task.reward(bad, p, format_reward=0.1)
        assert r in (0.0, 0.1), bad[:40]
    assert task.reward(None, p) == 0.0
    # A well-formed solution of another problem is wrong here (and only earns the format term).
    other = next(q for q in eval_sets[task.name] if q.answer != p.answer)
    assert task.reward(other.solution, p) == 0.0
    assert task.reward(other.solution, p, format_reward=0.1) == 0.1


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.characters(min_codepoint=0, max_codepoint=300), max_size=300))
def test_verifiers_never_raise(text):
    for name in NAMES:
        t = get_task(name)
        p = t.eval_set(1)[0]
        assert t.reward(text, p) in (0.0, 1.0)
        assert t.reward(p.solution + text, p) in (0.0, 1.0)


def test_addition_format():
    t = get_task("add-4d-v1")
    p = Problem("1234+5678=", "6912", t.name, {}, "")
    assert t.extract_answer("12 11 09 06#2196") == "6912"
    assert t.reward("12 11 09 06#2196", p) == 1.0
    assert t.reward("#2196", p) == 1.0  # steps are not verified, only the final answer
    assert t.reward("12 11 09 06#6912", p) == 0.0  # answer must be written reversed
    assert t.extract_answer("#21960") is None  # reverses to a leading zero: not canonical
    assert t.reward("#2196 ", p) == 1.0 and t.reward("#2196#", p) == 0.0
    n = len(t.eval_set(1)[0].solution) + 1
    assert 15 <= n <= 20


def test_other_formats():
    mul, lin, ch = get_task("mul-v1"), get_task("lineq-v1"), get_task("addchain-v1")
    assert mul.extract_answer("42 28 20#2802") == "2082"
    assert lin.extract_answer("3*x=11+4=15;x=5") == "5"
    assert lin.extract_answer("x=-7") == "-7" and lin.extract_answer("x=-0") is None
    assert ch.extract_answer("12+34=46;46+56=102;102+78=180#180") == "180"
    lens = [len(p.solution) + 1 for p in ch.eval_set(100)]
    assert min(lens) >= 40 and 50 <= sum(lens) / len(lens) <= 150


def test_countdown_verifier():
    t = get_task("countdown-v1")
    p = Problem("3 5 7 2>22:", "22", t.name, {}, "")
    assert t.reward("(7-3)*5+2", p) == 1.0
    assert t.reward(" (7 - 3) * 5 + 2 = 22", p) == 1.0
    assert t.reward("7*3+1", p) == 0.0  # 1 is not given
    assert t.reward("5*5-3", p) == 0.0  # 5 used twice
    assert t.reward("3*7+2", p) == 0.0  # wrong value
    assert t.reward("2*(7+3)+2", p) == 0.0  # 2 used twice
    assert t.reward("7/0+22", p) == 0.0 and t.extract_answer("7/0") is None
    assert t.reward("-3+25", p) == 0.0  # no unary minus
    assert parse_prompt("3 5 7 2>22:") == ([3, 5, 7, 2], 22) and parse_prompt("3 5>") is None
    q = Problem("4 6 8>3:", "3", t.name, {}, "")
    assert t.reward("(4+8)/(6-4)", q) == 0.0 and t.reward("6/(8/4)", q) == 1.0  # exact fractions


@settings(max_examples=200, deadline=None)
@given(st.recursive(st.integers(1, 50), lambda kids: st.tuples(st.sampled_from("+-*/"), kids, kids), max_leaves=8))
def test_expr_render_roundtrip(tree):
    from fractions import Fraction

    def value(t):
        if isinstance(t, int):
            return Fraction(t)
        op, a, b = t[0], value(t[1]), value(t[2])
        if op == "/" and b == 0:
            raise ZeroDivisionError
        return {"+": a + b, "-": a - b, "*": a * b, "/": a / b if op == "/" else 0}[op]

    try:
        want = value(tree)
    except ZeroDivisionError:
        return
    got, literals = expr.evaluate(expr.render(tree))
    assert got == want


def test_custom_difficulty_and_validation():
    t = AdditionTask(n_digits=6)
    assert t.name == "addition-v1[n_digits=6]" and t.difficulty == {"n_digits": 6}
    assert AdditionTask.difficulty == {"n_digits": 4}
    p = t.eval_set(1)[0]
    assert len(p.prompt) == 14 and t.reward(p.solution, p) == 1.0
    with pytest.raises(TypeError, match="unknown parameter"):
        AdditionTask(digits=3)
    with pytest.raises(ValueError):
        CountdownTask(min_numbers=5, max_numbers=3)
    with pytest.raises(ValueError, match="split"):
        t.generate(random.Random(0), "test")


def test_registry_errors_and_listing():
    with pytest.raises(KeyError) as e:
        get_task("add-9d-v7")
    assert isinstance(e.value, UnknownTaskError)
    msg = str(e.value)
    assert "add-9d-v7" in msg and "add-4d-v1" in msg and "\n" not in msg
    rows = {r["name"]: r for r in list_tasks(n=64)}
    assert set(rows) == set(NAMES)
    for r in rows.values():
        assert {"name", "family", "version", "difficulty", "description", "mean_response_tokens"} <= set(r)
    assert rows["addchain-long-v1"]["mean_response_tokens"] > 100


@pytest.mark.parametrize("ext", [".parquet", ".jsonl"])
def test_dataset_roundtrip(tmp_path, ext):
    problems = get_task("countdown-v1").eval_set(20) + get_task("lineq-v1").eval_set(5)
    ds = get_task("lineq-v1").to_dataset(problems)
    assert ds.column_names == ["prompt", "answer", "task", "meta", "solution"]
    assert json.loads(ds[0]["meta"]) == problems[0].meta
    path = save_split(problems, tmp_path / f"sub/eval{ext}")
    assert problems_from_dataset(load_split(path)) == problems
    save_split(ds, path)  # overwrite from a Dataset
    assert load_split(path)[:] == ds[:]
    assert [f.name for f in path.parent.iterdir()] == [path.name]  # no temp files left


def test_dataset_io_errors(tmp_path):
    with pytest.raises(ValueError, match=r"\.csv"):
        save_split([], tmp_path / "x.csv")
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        load_split(tmp_path / "nope.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "1+1="}\n')
    with pytest.raises(ValueError, match="missing columns"):
        load_split(bad)
    assert len(load_split(save_split([], tmp_path / "empty.parquet"))) == 0


def _cli(argv):
    ap = argparse.ArgumentParser(prog="timbench")
    cli.add_parser(ap.add_subparsers(dest="command"))
    args = ap.parse_args(argv)
    return args.func(args)


def test_cli(tmp_path, capsys):
    assert _cli(["tasks", "list", "--json"]) == 0
    assert {r["name"] for r in json.loads(capsys.readouterr().out)} == set(NAMES)
    assert _cli(["tasks", "show", "mul-v1", "--n", "3", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert [s["prompt"] for s in shown] == [p.prompt for p in get_task("mul-v1").eval_set(3)]
    assert _cli(["tasks", "show", "mul-v1", "--split", "train", "--seed", "3", "--n", "2", "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)) == 2

    ev = get_task("add-4d-v1").eval_set(4)
    preds = tmp_path / "preds.jsonl"
    preds.write_text(
        "\n".join(
            json.dumps(r)
            for r in [
                {"prompt": ev[0].prompt, "response": ev[0].solution},
                {"prompt": ev[1].prompt, "response": "garbage"},
                {"id": 2, "response": ev[2].solution},
                {"prompt": "1+1=", "answer": "2", "response": "02#2"},
            ]
        )
        + "\n"
    )
    assert _cli(["tasks", "score", "add-4d-v1", "--file", str(preds)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["n"], out["correct"], out["accuracy"], out["well_formed"]) == (4, 3, 0.75, 0.75)

    assert _cli(["tasks", "show", "nope"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unknown task" in err
    preds.write_text('{"prompt": "0+0=", "response": "00#0"}\n')
    assert _cli(["tasks", "score", "add-4d-v1", "--file", str(preds)]) == 2
    assert "not in the eval set" in capsys.readouterr().err
    assert _cli(["tasks", "score", "add-4d-v1", "--file", str(tmp_path / "missing.jsonl")]) == 2
    assert "missing.jsonl" in capsys.readouterr().err


@pytest.mark.parametrize("case", ["binary", "directory", "empty", "blank-lines", "negative-n", "zero-n"])
def test_cli_score_bad_input_is_one_line(tmp_path, capsys, case):
    ev = get_task("add-4d-v1").eval_set(2)
    good = json.dumps({"prompt": ev[0].prompt, "response": ev[0].solution}) + "\n"
    path, n, says = tmp_path / "preds.jsonl", "512", None
    if case == "binary":
        path.write_bytes(bytes(range(256)) * 4)
        says = "not UTF-8 text"
    elif case == "directory":
        path.mkdir()
        says = "is a directory"
    elif case in ("empty", "blank-lines"):
        path.write_text("" if case == "empty" else "\n  \n\n")
        says = "no predictions"
    else:
        path.write_text(good)
        n, says = ("-5", "--n must be >= 1, got -5") if case == "negative-n" else ("0", "--n must be >= 1, got 0")
    assert _cli(["tasks", "score", "add-4d-v1", "--file", str(path), "--n", n]) == 2
    cap = capsys.readouterr()
    assert cap.out == "" and cap.err.count("\n") == 1 and says in cap.err, cap.err
    if case != "negative-n" and case != "zero-n":
        assert str(path) in cap.err
    # the same file with a valid --n, or a valid file, still scores: the check is not over-eager
    path_ok = tmp_path / "ok.jsonl"
    path_ok.write_text(good)
    assert _cli(["tasks", "score", "add-4d-v1", "--file", str(path_ok), "--n", "2"]) == 0
    assert json.loads(capsys.readouterr().out)["n"] == 1


def test_cli_show_negative_n_is_one_line(capsys):
    assert _cli(["tasks", "show", "mul-v1", "--n", "-5"]) == 2
    assert capsys.readouterr().err == "timbench tasks: error: --n must be >= 0, got -5\n"
