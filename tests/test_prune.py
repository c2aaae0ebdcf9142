"""Expert pruning (timbench.warmstart.prune, `timbench prune-experts`): keep = all is the original bitwise, the
kept experts are the most frequent ones, the pruned router routes among them as the original did, a
pruned checkpoint loads and generates, and bad values are one-line errors."""

from __future__ import annotations

import json

import pytest
import torch

from timbench.cli import main
from timbench.data import max_new_tokens, requests_for
from timbench.engine import SamplingParams, make_engine
from timbench.kernels import get_kernels
from timbench.model import PRESETS, Compute, Qwen3ForCausalLM, load_checkpoint, save_checkpoint
from timbench.tasks import get_task
from timbench.trainer.forward import pack
from timbench.util.shipped import default_checkpoint
from timbench.warmstart.prune import calibration_set, expert_frequencies, kept_experts, prune_experts

TASK = get_task("add-4d-v1")


@pytest.fixture(scope="module")
def moe():
    return load_checkpoint(default_checkpoint("add-4d-v1", "tiny-moe"))


@pytest.fixture(scope="module")
def ids():
    seqs = calibration_set(TASK, n=6, seed=3)[0]
    return pack(seqs, 0)[0]


def _exact():
    return Compute(get_kernels("exact"))


def test_keep_all_is_the_original_bitwise(moe, ids):
    freqs = torch.arange(32).reshape(4, 8).flip(-1)  # a ranking unlike the index order: the order must not matter
    same = prune_experts(moe, 8, freqs)
    assert same.config == moe.config
    for (k, a), (k2, b) in zip(moe.state_dict().items(), same.state_dict().items()):
        assert k == k2 and torch.equal(a, b), k
    with torch.no_grad():
        (la, ra), (lb, rb) = moe(ids, _exact()), same(ids, _exact())
    assert (la - lb).abs().max().item() == 0.0
    assert torch.equal(ra, rb)


def test_prune_keeps_the_most_frequent_experts():
    net = Qwen3ForCausalLM(PRESETS["tiny-moe"], seed=1)
    freqs = torch.tensor(
        [
            [5, 9, 1, 9, 0, 3, 7, 2],  # 1 and 3 tie at 9: both kept, then 6 (7), then 0 (5)
            [4, 4, 4, 4, 4, 4, 4, 4],  # all tie: the lowest indices
            [0, 0, 0, 0, 0, 0, 0, 100],
            [8, 7, 6, 5, 4, 3, 2, 1],
        ]
    )
    assert kept_experts(freqs, 4) == [[0, 1, 3, 6], [0, 1, 2, 3], [0, 1, 2, 7], [0, 1, 2, 3]]
    assert kept_experts(freqs, 1) == [[1], [0], [7], [0]]
    pruned = prune_experts(net, 4, freqs)
    assert (pruned.config.num_experts, pruned.config.num_experts_per_tok) == (4, 2)
    assert prune_experts(net, 1, freqs).config.num_experts_per_tok == 1  # top-k = min(k, keep)
    for layer, kept in enumerate(kept_experts(freqs, 4)):
        old, new = net.model.layers[layer].mlp, pruned.model.layers[layer].mlp
        assert torch.equal(new.gate.weight, old.gate.weight[kept])
        for j, e in enumerate(kept):
            for name in ("gate_proj", "up_proj", "down_proj"):
                assert torch.equal(getattr(new.experts[j], name).weight, getattr(old.experts[e], name).weight)
    # everything outside the experts and routers is copied bit for bit
    old_sd, new_sd = net.state_dict(), pruned.state_dict()
    for k in new_sd:
        if ".mlp." not in k:
            assert torch.equal(new_sd[k], old_sd[k]), k


def test_pruned_router_routes_among_kept_experts_as_the_original(moe, ids):
    freqs = expert_frequencies(moe, calibration_set(TASK, n=32))
    kept = torch.tensor(kept_experts(freqs, 4))
    pruned = prune_experts(moe, 4, freqs)
    with torch.no_grad():
        _, r_full = moe(ids, _exact())
        _, r_pruned = pruned(ids, _exact())
    # only layer 0 sees the same input in both models (later layers follow the pruned experts' outputs)
    mapped = kept[0][r_pruned[..., 0, :]]
    assert torch.isin(mapped, kept[0]).all()
    both_kept = torch.isin(r_full[..., 0, :], kept[0]).all(-1)
    assert both_kept.sum() > 10
    assert torch.equal(mapped[both_kept], r_full[..., 0, :][both_kept])
    assert not torch.isin(r_full[..., 0, :], kept[0]).all()  # the original did route outside the kept set


def test_expert_frequencies_count_k_routes_per_token(moe):
    batches = calibration_set(TASK, n=10, batch=4)
    assert [len(b) for b in batches] == [4, 4, 2]
    freqs = expert_frequencies(moe, batches)
    tokens = sum(len(p) + len(r) for b in batches for p, r in b)
    assert freqs.dtype == torch.int64 and freqs.shape == (4, 8)
    assert freqs.sum(-1).tolist() == [2 * tokens] * 4


def test_pruned_checkpoint_loads_and_generates(moe, tmp_path):
    pruned = prune_experts(moe, 2, expert_frequencies(moe, calibration_set(TASK, n=16)))
    save_checkpoint(pruned, tmp_path)
    back = load_checkpoint(tmp_path)
    assert back.config.num_experts == 2
    for (k, a), (_, b) in zip(pruned.state_dict().items(), back.state_dict().items()):
        assert torch.equal(a, b), k
    probs = TASK.eval_set(4)
    engine = make_engine(back.config, "kernels=exact", max_num_seqs=4, weights=back)
    outs = engine.generate(
        requests_for(probs, range(4), max_new_tokens(TASK, engine.max_len)), SamplingParams(temperature=1.0, seed=0)
    )
    assert len(outs) == 4 and all(len(o.token_ids) > 0 for o in outs)


def test_cli_writes_a_pruned_checkpoint_with_its_card(tmp_path, capsys):
    out = tmp_path / "e4"
    assert (
        main(["prune-experts", "--keep", "4", "--out", str(out), "--calib-n", "8", "--eval-n", "8", "--no-progress"])
        == 0
    )
    card = json.loads((out / "card.json").read_text())
    src = default_checkpoint("add-4d-v1", "tiny-moe") / "model.safetensors"
    import hashlib

    assert card["pruning"]["source_sha256"] == hashlib.sha256(src.read_bytes()).hexdigest()
    assert card["model"] == "tiny-moe-e4" and card["pruning"]["keep"] == 4 and card["recovery"] is None
    assert card["pruning"]["kept_experts"] == kept_experts(torch.tensor(card["pruning"]["frequencies"]), 4)
    assert load_checkpoint(out).config.num_experts == 4
    assert "kept" in capsys.readouterr().out


def test_cli_recovery_fine_tunes_the_pruned_model(tmp_path):
    out = tmp_path / "e2"
    assert (
        main(
            [
                "prune-experts",
                "--keep",
                "2",
                "--out",
                str(out),
                "--calib-n",
                "8",
                "--eval-n",
                "8",
                "--recover",
                "0,1",
                "--eval-every",
                "1",
                "--max-steps",
                "3",
                "--no-progress",
            ]
        )
        == 0
    )
    card = json.loads((out / "card.json").read_text())
    assert card["steps"] == 1 and card["recovery"]["band"] == [0.0, 1.0]  # in the band after the first step
    assert "--recover 0,1" in card["command"]
    recovered = load_checkpoint(out)
    src = load_checkpoint(default_checkpoint("add-4d-v1", "tiny-moe"))
    pruned = prune_experts(src, 2, torch.tensor(card["pruning"]["frequencies"]))
    changed = [k for k, v in pruned.state_dict().items() if not torch.equal(v, recovered.state_dict()[k])]
    assert changed  # the fine-tune moved the weights


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["--keep", "0"], "keep=0 is not valid; expected an integer from 1 to num_experts=8"),
        (["--keep", "9"], "keep=9 is not valid"),
        (["--keep", "2", "--model", "tiny-dense"], "needs a qwen3_moe model"),
        (["--keep", "2", "--model", "no/such/dir"], "neither a preset"),
        (["--keep", "2", "--calib-n", "0"], "calibration set size must be >= 1, got 0"),
        (["--keep", "2", "--eval-n", "0"], "eval_n must be >= 1, got 0"),
    ],
)
def test_cli_bad_values_are_one_line_errors(argv, needle, tmp_path, capsys):
    out = tmp_path / "x"
    assert main(["prune-experts", "--out", str(out), "--no-progress", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1, err
    assert not out.exists()


def test_prune_rejects_frequencies_of_the_wrong_shape(moe):
    with pytest.raises(ValueError, match=r"frequencies have shape \(4, 4\); this model needs \(4, 8\)"):
        prune_experts(moe, 2, torch.zeros(4, 4, dtype=torch.int64))
