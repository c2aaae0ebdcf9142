"""Real-dataset loaders (GSM8K, MATH, DAPO) and free-form answer extraction/matching."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from timbench.tasks import load_split, save_split
from timbench.tasks.answers import answers_match, extract_boxed, extract_final_answer, normalize_answer
from timbench.tasks.real import RealTask, load_dapo, load_gsm8k, load_math, load_real, real_reward

pytestmark = pytest.mark.unit  # builds no model (make test-unit)


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return path


GSM = [
    {
        "question": "Tom has 3 apples and buys 1,000 more. How many?",
        "answer": "3 + 1000 = <<3+1000=1003>>1003\n#### 1,003",
    },
    {"question": "Half of 9 €?", "answer": "9/2 = 4.5\n#### 4.5"},
]
MATH = [
    {
        "problem": "Compute $\\frac{1}{2}+\\frac{1}{4}$.",
        "solution": "We get $\\boxed{\\frac{3}{4}}$.",
        "level": "Level 1",
        "type": "Algebra",
    },
    {"problem": "Nested?", "solution": "So $\\boxed{\\frac{\\sqrt{2}}{2}}$ and that's it."},
    {"problem": "No box", "solution": "nothing here"},
]
DAPO = [
    {
        "data_source": "math_dapo",
        "ability": "MATH",
        "prompt": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "What is 6*7?"}],
        "reward_model": {"ground_truth": "42", "style": "rule"},
        "extra_info": {"index": "a1"},
    },
    {
        "data_source": "math_dapo",
        "ability": "MATH",
        "prompt": [{"role": "user", "content": "1+1?"}],
        "reward_model": {"ground_truth": "2", "style": "rule"},
        "extra_info": {"index": "a2"},
    },
]


@pytest.mark.parametrize(
    "pred,gold",
    [
        ("1/2", "0.5"),
        ("\\frac{1}{2}", "0.5"),
        ("\\dfrac12", "1/2"),
        ("\\tfrac{1}{2}", "\\frac12"),
        ("1,000", "1000"),
        ("$5$", "5"),
        ("5.0", "5"),
        ("5.", "5"),
        ("5\\text{ cm}", "5"),
        ("\\text{5}", "5"),
        ("-\\frac{3}{4}", "-0.75"),
        ("\\frac{-3}{4}", "-3/4"),
        ("x = 3", "3"),
        ("30^\\circ", "30"),
        ("50\\%", "50"),
        ("\\boxed{7}", "7"),
        ("\\frac{\\sqrt{3}}{2}", "\\dfrac{\\sqrt{3}}{2}"),
        ("(1,2)", "(1, 2)"),
        ("\\left(1,2\\right)", "(1,2)"),
        ("0.25", "\\frac{1}{4}"),
    ],
)
def test_answers_match(pred, gold):
    assert answers_match(pred, gold) and answers_match(gold, pred)


@pytest.mark.parametrize(
    "pred,gold",
    [
        ("2", "3"),
        ("\\frac{1}{2}", "\\frac{1}{3}"),
        ("", ""),
        ("1/0", "0"),
        ("0.33", "1/3"),
        ("1,2", "12"),
        (None, "1"),
        ("10", "1" + "0" * 5000),
    ],
)
def test_answers_differ(pred, gold):
    assert not answers_match(pred, gold)


@pytest.mark.parametrize(
    "text,want",
    [
        ("so \\boxed{\\frac{1}{2}} and finally \\boxed{3}", "3"),
        ("\\boxed{\\frac{a}{b^{2}}}", "\\frac{a}{b^{2}}"),
        ("the answer is \\boxed 5$.", "5"),
        ("\\fbox{12}", "12"),
        ("ok \\boxed{1} then broken \\boxed{", "1"),
        ("\\boxed{unbalanced", None),
        ("\\boxed{}", None),
        ("#### 1,234", "1234"),
        ("steps\n#### 42.\n", "42"),
        ("work\nAnswer: 42\n", "42"),
        ("**Answer:** $17$", "$17$"),
        ("no answer at all", None),
        ("", None),
    ],
)
def test_extract_final_answer(text, want):
    assert extract_final_answer(text) == want


@settings(max_examples=300, deadline=None)
@given(
    st.text(alphabet=st.sampled_from(list("\\boxedfrac{}$#:Answer 0123456789./,-\n")), max_size=200),
    st.text(max_size=60),
)
def test_extraction_never_raises(a, b):
    extract_final_answer(a)
    extract_boxed(a + b)
    normalize_answer(a)
    answers_match(a, b)
    answers_match(extract_final_answer(a), a)


def test_gsm8k_jsonl(tmp_path):
    probs = load_gsm8k(_jsonl(tmp_path / "gsm.jsonl", GSM))
    assert [p.answer for p in probs] == ["1003", "4.5"] and probs[0].task == "gsm8k"
    assert probs[0].prompt == GSM[0]["question"] and probs[0].solution == GSM[0]["answer"]
    assert real_reward("so it is 1003.\n#### 1,003", probs[0]) == 1.0
    assert real_reward("\\boxed{9/2}", probs[1]) == 1.0
    assert real_reward("#### 5", probs[1]) == 0.0 and real_reward("", probs[1], format_reward=0.5) == 0.0
    assert real_reward("#### 5", probs[1], format_reward=0.5) == 0.5


def test_math_parquet_and_skipped_rows(tmp_path):
    path = tmp_path / "math500.parquet"
    pq.write_table(pa.Table.from_pylist(MATH), path)
    with pytest.warns(UserWarning, match="skipped 1 of 3"):
        probs = load_math(path)
    assert [p.answer for p in probs] == ["\\frac{3}{4}", "\\frac{\\sqrt{2}}{2}"]
    assert probs[0].meta["level"] == "Level 1"
    assert real_reward("thus $\\boxed{0.75}$", probs[0]) == 1.0
    with_answer = [dict(r, answer=a) for r, a in zip(MATH, ["3/4", "\\frac{\\sqrt2}{2}", "7"])]
    probs = load_real(_jsonl(tmp_path / "m.jsonl", with_answer))  # auto-detects math
    assert [p.answer for p in probs] == ["3/4", "\\frac{\\sqrt2}{2}", "7"] and probs[0].task == "math"


def test_dapo_chat_and_string_prompts(tmp_path):
    path = tmp_path / "dapo.parquet"
    pq.write_table(pa.Table.from_pylist(DAPO), path)
    probs = load_dapo(path)
    assert [(p.prompt, p.answer) for p in probs] == [("What is 6*7?", "42"), ("1+1?", "2")]
    assert probs[0].meta["messages"][0]["role"] == "system" and probs[0].meta["data_source"] == "math_dapo"
    assert real_reward("6*7 is 42\nAnswer: 42", probs[0]) == 1.0
    flat = [{"prompt": "What is 2^5?", "solution": "2^5 = \\boxed{32}"}, {"prompt": "3-1?", "answer": 2}]
    probs = load_dapo(_jsonl(tmp_path / "flat.jsonl", flat))
    assert [(p.prompt, p.answer) for p in probs] == [("What is 2^5?", "32"), ("3-1?", "2")]
    # The common schema survives the split IO, non-ASCII included.
    back = load_split(save_split(load_gsm8k(_jsonl(tmp_path / "g.jsonl", GSM)), tmp_path / "g.parquet"))
    assert back[1]["prompt"] == "Half of 9 €?"


def test_real_task_interface(tmp_path):
    t = RealTask(_jsonl(tmp_path / "gsm.jsonl", GSM * 5))
    assert t.name == "gsm8k:gsm.jsonl" and len(t.eval_set(3)) == 3 and len(t.eval_set(None)) == 10
    s1, s2 = t.train_stream(1), t.train_stream(1)
    assert [next(s1).prompt for _ in range(25)] == [next(s2).prompt for _ in range(25)]
    assert t.train_batch(0, 2, 4) == t.train_batch(0, 2, 4)
    p = t.eval_set(1)[0]
    assert t.reward("#### 1003", p) == 1.0 and t.reward("garbage", p) == 0.0
    ds = t.to_dataset(t.eval_set(2))
    assert ds.column_names == ["prompt", "answer", "task", "meta", "solution"]


def test_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="missing.parquet"):
        load_math(tmp_path / "missing.parquet")
    bad = _jsonl(tmp_path / "bad.jsonl", [{"text": "hi", "label": 1}])
    with pytest.raises(ValueError) as e:
        load_gsm8k(bad)
    msg = str(e.value)
    assert "bad.jsonl" in msg and "text" in msg and "question" in msg
    with pytest.raises(ValueError, match="unrecognised columns"):
        load_real(bad)
    with pytest.raises(ValueError, match="kind"):
        load_real(bad, kind="mmlu")
    (tmp_path / "x.csv").write_text("question,answer\n")
    with pytest.raises(ValueError, match="extension"):
        load_real(tmp_path / "x.csv")
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"question": 1\n')
    with pytest.raises(ValueError, match="broken.jsonl"):
        load_gsm8k(broken)
