"""Warm start: the shipped checkpoints load (timbench and transformers) and keep their card's
accuracy; the CLI writes a valid checkpoint and rejects bad arguments with a one-line error."""

from __future__ import annotations

import json

import pytest
import torch

from timbench.cli import main
from timbench.data import encode_prompt
from timbench.evaluate import evaluate
from timbench.kernels import get_kernels
from timbench.model import PRESETS, Compute, load_checkpoint
from timbench.tasks import get_task
from timbench.util.shipped import available_checkpoints, default_checkpoint
from timbench.warmstart.run import WarmstartError, parse_band

SHIPPED = [
    ("add-4d-v1", "tiny-dense"),
    ("add-4d-v1", "tiny-moe"),
    ("add-4d-v1", "tiny-moe-e4"),
    ("add-4d-v1", "tiny-moe-e2"),
    ("add-4d-v1", "small-dense"),
    ("add-4d-v1", "medium-dense"),
]
CARD_KEYS = {
    "task",
    "task_version",
    "model",
    "seed",
    "steps",
    "wall_time_s",
    "accuracy_t1",
    "accuracy_greedy",
    "eval_n",
    "band",
    "command",
}


@pytest.mark.parametrize("task,model", SHIPPED)
def test_shipped_checkpoint(task, model):
    d = default_checkpoint(task, model)
    card = json.loads((d / "card.json").read_text())
    assert CARD_KEYS <= set(card)
    assert card["task"] == task and card["model"] == model
    lo, hi = card["band"]
    assert lo <= card["accuracy_t1"] <= hi
    assert 0.2 <= card["accuracy_t1"] <= 0.6  # RL needs signal and headroom

    net = load_checkpoint(d)
    assert net.config == PRESETS[model]

    # the same weights through transformers give the same logits
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(str(d), dtype=torch.float32).eval()
    t = get_task(task)
    ids = torch.tensor([encode_prompt(t.eval_set(1)[0].prompt)])
    with torch.no_grad():
        ours, _ = net(ids, Compute(get_kernels("torch")))
        theirs = hf(ids).logits
    torch.testing.assert_close(theirs, ours, atol=1e-4, rtol=1e-4)

    # the card's T=1 accuracy is reproduced on a 128-problem prefix of the eval set
    # (binomial sd <= 0.044 at n=128, so 0.12 is > 2.5 sd)
    r = evaluate(net, t, t.eval_set(128), temperature=1.0, seed=card.get("eval_seed", card["seed"]))
    assert abs(r["accuracy"] - card["accuracy_t1"]) < 0.12, (r, card["accuracy_t1"])


def test_default_checkpoint_unknown_lists_available():
    assert {f"{t}-{m}" for t, m in SHIPPED} <= set(available_checkpoints())
    with pytest.raises(FileNotFoundError, match="available: .*add-4d-v1-tiny-dense"):
        default_checkpoint("mul-v1", "tiny-dense")


def test_tiny_run_writes_checkpoint(tmp_path, capsys):
    out = tmp_path / "ckpt"
    rc = main(
        [
            "warmstart",
            "--task",
            "add-3d-v1",
            "--model",
            "tiny-dense",
            "--out",
            str(out),
            "--max-steps",
            "3",
            "--band",
            "0,1",
            "--eval-n",
            "16",
            "--batch-size",
            "8",
            "--no-progress",
        ]
    )
    assert rc == 0
    card = json.loads((out / "card.json").read_text())
    assert CARD_KEYS <= set(card)
    assert card["task"] == "add-3d-v1" and card["task_version"] == 1 and card["model"] == "tiny-dense"
    assert card["steps"] == 3 and card["eval_n"] == 16 and card["band"] == [0.0, 1.0]
    assert card["command"].startswith("timbench warmstart --task add-3d-v1")
    for f in ("config.json", "model.safetensors", "tokenizer.json", "generation_config.json"):
        assert (out / f).is_file()
    net = load_checkpoint(out)
    assert not net.config.is_moe
    assert "steps=3" in capsys.readouterr().out


def test_band_not_reached_is_exit_2(tmp_path, capsys):
    rc = main(
        [
            "warmstart",
            "--model",
            "tiny-dense",
            "--out",
            str(tmp_path / "x"),
            "--max-steps",
            "2",
            "--band",
            "0.9,1",
            "--eval-n",
            "8",
            "--batch-size",
            "4",
            "--no-progress",
        ]
    )
    assert rc == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "below the band" in err and "--max-steps" in err
    assert not (tmp_path / "x").exists()  # no checkpoint that looks valid


@pytest.mark.parametrize(
    "args,message",
    [
        (["--task", "nope"], "unknown task 'nope'; valid names:"),
        (["--model", "huge"], "unknown model preset 'huge'; valid: tiny-dense, tiny-moe"),
    ],
)
def test_bad_names_are_one_line_errors(tmp_path, capsys, args, message):
    rc = main(["warmstart", "--out", str(tmp_path / "x"), "--no-progress", *args])
    assert rc == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err


@pytest.mark.parametrize("band", ["0.5", "a,b", "0.6,0.2", "0,1.5", "-0.1,0.5"])
def test_bad_band(tmp_path, capsys, band):
    with pytest.raises(SystemExit) as e:
        main(["warmstart", "--out", str(tmp_path / "x"), f"--band={band}"])
    assert e.value.code == 2
    assert "--band" in capsys.readouterr().err
    with pytest.raises(WarmstartError):
        parse_band(band)


def test_parse_band():
    assert parse_band("0.2,0.6") == (0.2, 0.6)
    assert parse_band("0,1") == (0.0, 1.0)
