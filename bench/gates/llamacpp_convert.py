"""A timbench checkpoint (a Hugging Face directory with timbench's character tokenizer) to an F32 GGUF file for
llama.cpp, through llama.cpp's own `convert_hf_to_gguf.py` (the copy vendored in the llama-cpp-python sdist).

Usage: python bench/gates/llamacpp_convert.py LLAMA_CPP_DIR HF_DIR OUT.gguf

The converter handles the Qwen3 architecture as it is; timbench's tokenizer needs two things it does not do:
- it names a BPE pre-tokenizer by the hash of a test string's tokens, and a character tokenizer's hash is none it
  knows (NotImplementedError "BPE pre-tokenizer was not recognized"): the tokenizer has no merges, so every
  character is one token whatever splits the text first, and "gpt-2" is named (refused for a tokenizer that has
  merges, where the choice would matter);
- llama.cpp's BPE tokenizer reads a vocabulary in GPT-2's byte-level alphabet (the byte of " " is "Ġ", of "\\n"
  "Ċ"); timbench's vocabulary holds the characters themselves, so each normal token is rewritten into that
  alphabet (special tokens stay as they are: llama.cpp matches them as text);
- llama.cpp refuses a BPE vocabulary without a merges key ("cannot find tokenizer merges in model file") and the
  GGUF writer refuses an empty array, so one inert merge is written: two special tokens' texts (BPE starts from
  single characters and no merge builds a longer symbol, so it never applies).
Runs in a venv with the converter's imports (torch, transformers, numpy, mistral-common; bench/gates/llamacpp_gate.sh
makes one).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print("usage: llamacpp_convert.py LLAMA_CPP_DIR HF_DIR OUT.gguf", file=sys.stderr)
        return 2
    llama_dir, hf_dir, out = (Path(a) for a in argv)
    if not (llama_dir / "convert_hf_to_gguf.py").is_file():
        print(
            f"llamacpp_convert: {llama_dir} has no convert_hf_to_gguf.py (the sdist's vendor/llama.cpp)",
            file=sys.stderr,
        )
        return 2
    merges = json.loads((hf_dir / "tokenizer.json").read_text())["model"].get("merges") or []
    sys.path.insert(0, str(llama_dir))
    import convert_hf_to_gguf as conv  # the vendored converter (it puts its own gguf-py on the path)
    from gguf.vocab import bytes_to_unicode

    byte_char = bytes_to_unicode()
    base = conv.TextModel.get_vocab_base
    base_pre = conv.TextModel.get_vocab_base_pre

    def get_vocab_base_pre(self, tokenizer):
        try:
            return base_pre(self, tokenizer)
        except NotImplementedError:
            if merges:
                raise  # with merges the pre-tokenizer decides the tokens: no name may be guessed
            return "gpt-2"

    def get_vocab_base(self):
        tokens, types, pre = base(self)
        normal = int(conv.gguf.TokenType.NORMAL)
        tokens = ["".join(byte_char[b] for b in t.encode()) if int(k) == normal else t for t, k in zip(tokens, types)]
        return tokens, types, pre

    set_vocab_gpt2 = conv.TextModel._set_vocab_gpt2

    def _set_vocab_gpt2(self):
        set_vocab_gpt2(self)
        if not merges:
            specials = [t for t, k in zip(*base(self)[:2]) if int(k) == int(conv.gguf.TokenType.CONTROL)]
            self.gguf_writer.add_token_merges([f"{specials[0]} {specials[0]}"])

    conv.TextModel._set_vocab_gpt2 = _set_vocab_gpt2
    conv.TextModel.get_vocab_base_pre = get_vocab_base_pre
    conv.TextModel.get_vocab_base = get_vocab_base
    sys.argv = ["convert_hf_to_gguf.py", str(hf_dir), "--outfile", str(out), "--outtype", "f32"]
    conv.main()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
