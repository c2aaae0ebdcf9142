"""Model: HF parity (transformers loads our checkpoints), save/load round trip, clear errors."""

import json

import pytest
import torch

from timbench.kernels import get_kernels
from timbench.model import PRESETS, Compute, ModelConfig, Qwen3ForCausalLM, load_checkpoint, save_checkpoint


def test_presets_are_tiny_and_counted_right():
    for name, cfg in PRESETS.items():
        m = Qwen3ForCausalLM(cfg)
        n = sum(p.numel() for p in m.parameters())
        assert n == cfg.num_parameters()
        assert 0.5e6 <= n <= 7e6, name  # CPU scale: up to the size ladder's medium-dense (6.06M)


@pytest.mark.parametrize("kernels", ["torch", "exact"])
def test_transformers_loads_checkpoint_and_agrees(model, kernels, tmp_path):
    from transformers import AutoModelForCausalLM

    save_checkpoint(model, tmp_path)
    hf = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32, attn_implementation="eager").eval()
    assert hf.config.model_type == model.config.model_type
    ids = torch.randint(3, 99, (2, 33), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = hf(ids).logits
        ours, _ = model(ids, Compute(get_kernels(kernels)))
    assert (ref - ours).abs().max().item() < 1e-4


def test_save_load_round_trip_is_bitwise(model, tmp_path):
    save_checkpoint(model, tmp_path, card={"note": "x"})
    back = load_checkpoint(tmp_path)
    assert back.config == model.config
    for (k, a), (_, b) in zip(model.state_dict().items(), back.state_dict().items()):
        assert torch.equal(a, b), k
    assert json.loads((tmp_path / "card.json").read_text()) == {"note": "x"}
    assert {"config.json", "model.safetensors", "tokenizer.json", "generation_config.json"} <= {
        p.name for p in tmp_path.iterdir()
    }


def test_checkpoint_whose_config_does_not_match_is_rejected(dense, tmp_path):
    save_checkpoint(dense, tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["hidden_size"] = 64
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="does not match"):
        load_checkpoint(tmp_path)


def test_missing_checkpoint_files_are_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_checkpoint(tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_checkpoint(tmp_path)


CORRUPTIONS = {  # file -> (how its bytes are damaged, what the one-line error must say)
    "truncated-weights": ("model.safetensors", lambda b: b[: len(b) // 2], "truncated or corrupt"),
    "weights-cut-in-header": ("model.safetensors", lambda b: b[:20], "truncated or corrupt"),
    "empty-weights": ("model.safetensors", lambda b: b"", "truncated or corrupt"),
    "config-not-json": ("config.json", lambda b: b[: len(b) // 2], "malformed JSON"),
    "config-a-list": ("config.json", lambda b: b"[1, 2]", "expected a JSON object"),
    "config-binary": ("config.json", lambda b: b"\xff\xfe\x00\x01", "not UTF-8 text"),
    "tokenizer-not-json": ("tokenizer.json", lambda b: b"{oops", "not a readable tokenizer.json"),
    "config-field-wrong-type": (
        "config.json",
        lambda b: b.replace(b'"hidden_size": 128', b'"hidden_size": "x"'),
        "hidden_size='x' is not valid; expected an integer >= 0",
    ),
}


@pytest.mark.parametrize("case", list(CORRUPTIONS))
def test_corrupt_checkpoint_file_is_a_one_line_error_naming_it(dense, tmp_path, case, capsys):
    from timbench.cli import main

    name, damage, says = CORRUPTIONS[case]
    save_checkpoint(dense, tmp_path)
    path = tmp_path / name
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(ValueError, match=says) as e:
        load_checkpoint(tmp_path)
    assert str(path) in str(e.value) and "\n" not in str(e.value)
    # The same through the command line: exit 2, one stderr line, no traceback.
    assert main(["align", "--model", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(path) in err and says in err


def test_bad_configs_are_one_line_errors():
    with pytest.raises(ValueError, match="valid: qwen3, qwen3_moe"):
        ModelConfig(model_type="llama")
    with pytest.raises(ValueError, match="must divide"):
        ModelConfig(num_attention_heads=4, num_key_value_heads=3)
    with pytest.raises(ValueError, match="rms_norm_eps=nan is not valid"):
        ModelConfig(rms_norm_eps=float("nan"))
    with pytest.raises(ValueError, match="tie_word_embeddings=1 is not valid; expected true or false"):
        ModelConfig(tie_word_embeddings=1)


def test_sequence_longer_than_context_is_rejected(dense):
    ids = torch.zeros(1, dense.config.max_position_embeddings + 1, dtype=torch.long)
    with pytest.raises(ValueError, match="exceeds max_position_embeddings"):
        dense(ids, Compute(get_kernels("torch")))
