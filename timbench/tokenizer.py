"""Character-level tokenizer, stored as a Hugging Face `tokenizer.json`.

Every checkpoint carries the same file, so timbench, transformers and vLLM read
one vocabulary. Ids are fixed: three specials, then printable ASCII in order, so
a tokenizer rebuilt anywhere gives the same ids.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from tokenizers import Tokenizer, decoders, models

PAD, BOS, EOS = "<pad>", "<bos>", "<eos>"
SPECIALS = (PAD, BOS, EOS)
CHARS = tuple(chr(c) for c in range(32, 127)) + ("\n",)


def _build_hf_tokenizer() -> Tokenizer:
    vocab = {tok: i for i, tok in enumerate(SPECIALS + CHARS)}
    # BPE with no merges over a pre-tokenizer-free string splits into single
    # characters, each mapped to its id; specials are matched whole.
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=None, fuse_unk=False))
    tok.add_special_tokens(list(SPECIALS))
    tok.decoder = decoders.Fuse()
    return tok


class CharTokenizer:
    """Fixed character vocabulary: `<pad>`=0, `<bos>`=1, `<eos>`=2, then ASCII 32..126 and newline."""

    def __init__(self, hf: Tokenizer | None = None):
        self.hf = hf or _build_hf_tokenizer()
        self.pad_id = self.hf.token_to_id(PAD)
        self.bos_id = self.hf.token_to_id(BOS)
        self.eos_id = self.hf.token_to_id(EOS)
        self.vocab_size = self.hf.get_vocab_size()
        self._char_to_id = {c: self.hf.token_to_id(c) for c in CHARS}
        self._id_to_char = {i: c for c, i in self._char_to_id.items()}

    def encode(self, text: str) -> list[int]:
        try:
            return [self._char_to_id[c] for c in text]
        except KeyError as e:
            raise ValueError(
                f"character {e.args[0]!r} is not in the timbench vocabulary (printable ASCII and newline)"
            ) from None

    def decode(self, ids, skip_special: bool = True) -> str:
        out = []
        for i in ids:
            i = int(i)
            if i in self._id_to_char:
                out.append(self._id_to_char[i])
            elif not skip_special:
                out.append(SPECIALS[i] if i < len(SPECIALS) else "")
        return "".join(out)

    def save(self, directory: str | os.PathLike) -> None:
        """Write `tokenizer.json`, `tokenizer_config.json` and `special_tokens_map.json`."""
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        self.hf.save(str(d / "tokenizer.json"))
        cfg = {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": BOS,
            "eos_token": EOS,
            "pad_token": PAD,
            "model_max_length": 4096,
            "clean_up_tokenization_spaces": False,
            "add_bos_token": False,
            "add_eos_token": False,
        }
        (d / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2) + "\n")
        (d / "special_tokens_map.json").write_text(
            json.dumps({"bos_token": BOS, "eos_token": EOS, "pad_token": PAD}, indent=2) + "\n"
        )

    @classmethod
    def load(cls, directory: str | os.PathLike) -> CharTokenizer:
        path = Path(directory) / "tokenizer.json"
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no tokenizer.json in checkpoint directory {directory}")
        try:
            tok = cls(Tokenizer.from_file(str(path)))
        except Exception as e:  # the Rust parser raises a bare Exception on a corrupt file
            raise ValueError(f"{path}: not a readable tokenizer.json ({' '.join(str(e).split())})") from None
        ref = cls()
        if tok.hf.get_vocab() != ref.hf.get_vocab():
            raise ValueError(f"{path}: vocabulary differs from the timbench character vocabulary")
        return tok
