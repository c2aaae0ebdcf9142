"""A Hugging Face checkpoint as the gate's trainer (`--trainer hf=DIR`): the user's own model, run as their trainer.

The model is `transformers.AutoModelForCausalLM` from a local directory (never the hub: `local_files_only`), in
the spec's dtype (fp32 or bf16), attention implementation (eager or sdpa) and torch device (cpu, the default, or
cuda / cuda:N: the trainer a GPU framework runs), and it scores exactly the token ids the server returned: nothing
is re-tokenized. `logits` gives, per sequence, the raw logits at each response position in float64 on the host
(widened exactly from the model's output), so a probe can test every hypothesis about what distribution the
server's logprobs belong to. `check_tokenizer` compares the trainer's tokenizer with the server's (/tokenize,
/detokenize) before any probe: vocabulary, special tokens, a text round trip and BOS added twice; the first
disagreement is one line naming the token.
"""

from __future__ import annotations

import hashlib
import random
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch

from .http_client import ServerError

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
ATTN = ("eager", "sdpa")
SPEC_DOC = f"hf=DIR[,dtype={'|'.join(DTYPES)}][,attn={'|'.join(ATTN)}][,device=cpu|cuda|cuda:N]"
ROUND_TRIP = ("The gate scores 12+34=46.\n", "  leading spaces, (brackets) and ~tildes~", "a")
"""Texts the tokenizers must split alike: printable ASCII (every vocabulary has it), with digits, spaces, a
newline."""
DETOKENIZE_IDS = 512
"""How many token ids are detokenized on both sides when the vocabulary is larger (a seeded sample plus the
special tokens); a smaller vocabulary is compared whole."""


@dataclass(frozen=True)
class HfSpec:
    dir: Path
    dtype: str = "fp32"
    attn: str = "eager"
    device: str = "cpu"

    def __str__(self):
        # device only when off the default: a CPU run's spec (and gate.json's identity) reads as before the key
        on = "" if self.device == "cpu" else f",device={self.device}"
        return f"hf={self.dir},dtype={self.dtype},attn={self.attn}{on}"


def parse_hf_spec(text: str) -> HfSpec:
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts or not parts[0].startswith("hf="):
        raise ValueError(f"trainer spec {text!r}: an HF trainer is {SPEC_DOC}")
    d = Path(parts[0].removeprefix("hf=")).expanduser()
    if not (d / "config.json").is_file():
        raise FileNotFoundError(f"trainer spec: {d} is not a Hugging Face checkpoint directory (no config.json)")
    kw = {}
    for part in parts[1:]:
        key, _, value = part.partition("=")
        if key == "device":
            kw[key] = _device(value)
            continue
        valid = {"dtype": tuple(DTYPES), "attn": ATTN}.get(key)
        if valid is None or value not in valid:
            raise ValueError(f"trainer spec: {part!r} is not valid; {SPEC_DOC}")
        kw[key] = value
    return HfSpec(d.resolve(), **kw)


def _device(value: str) -> str:
    """A device name the engine spec's `device` key accepts, and one this torch can reach (a one-line error)."""
    from ..engine.device import resolve_device
    from ..spec.keys import _device as device_name

    try:
        device_name(value)
    except ValueError:
        raise ValueError(f"trainer spec: device={value!r} is not valid; valid: cpu, cuda, cuda:N") from None
    resolve_device(value, "trainer spec")
    return value


def checkpoint_hash(d: Path) -> str:
    """sha256 (16 hex digits) over the checkpoint's weight and config files, names and bytes, in name order."""
    h = hashlib.sha256()
    for p in sorted(d.iterdir()):
        if p.is_file() and (p.suffix in (".safetensors", ".json", ".bin") or p.name == "tokenizer.model"):
            h.update(p.name.encode() + b"\0")
            with p.open("rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    h.update(block)
    return h.hexdigest()[:16]


def load_tokenizer(spec: HfSpec):
    """The checkpoint's tokenizer, from the local directory only (never the hub, no remote code)."""
    from transformers import AutoTokenizer  # deferred: transformers is heavy

    try:
        return AutoTokenizer.from_pretrained(spec.dir, local_files_only=True, trust_remote_code=False)
    except (OSError, ValueError, KeyError) as e:
        raise _cannot_load(spec, e) from None


def _cannot_load(spec: HfSpec, e: Exception) -> ValueError:
    """The one-line error for a checkpoint directory transformers cannot load (model or tokenizer)."""
    return ValueError(f"trainer spec: transformers cannot load {spec.dir}: {' '.join(str(e).split())[:300]}")


class HfTrainer:
    def __init__(self, spec: HfSpec):
        from transformers import AutoModelForCausalLM  # deferred: transformers is heavy
        from transformers.utils import logging as hf_logging  # deferred: transformers is heavy

        self.spec = spec
        bar = hf_logging.is_progress_bar_enabled()
        hf_logging.disable_progress_bar()  # the gate prints its own progress lines on stderr
        try:
            self.model = (
                AutoModelForCausalLM.from_pretrained(
                    spec.dir,
                    dtype=DTYPES[spec.dtype],
                    attn_implementation=spec.attn,
                    local_files_only=True,
                    trust_remote_code=False,
                )
                .to(spec.device)
                .eval()
            )
        except (OSError, ValueError, KeyError) as e:
            raise _cannot_load(spec, e) from None
        finally:
            if bar:
                hf_logging.enable_progress_bar()
        self.tokenizer = load_tokenizer(spec)
        self.vocab_size = int(self.model.config.vocab_size)
        self.max_len = int(getattr(self.model.config, "max_position_embeddings", 4096))

    def logits(self, seqs, batch: int = 16) -> list[torch.Tensor]:
        """Per (prompt_ids, response_ids): the raw logits [R, V] (float64) that score each response token,
        mini-batched with right padding (a causal model's real tokens never attend to the pads after them)."""
        out = []
        with torch.no_grad():
            for i in range(0, len(seqs), batch):
                chunk = [list(p) + list(r) for p, r in seqs[i : i + batch]]
                width = max(map(len, chunk))
                ids = torch.zeros(len(chunk), width, dtype=torch.long)
                mask = torch.zeros(len(chunk), width, dtype=torch.long)
                for j, s in enumerate(chunk):
                    ids[j, : len(s)], mask[j, : len(s)] = torch.tensor(s), 1
                dev = self.spec.device
                z = self.model(input_ids=ids.to(dev), attention_mask=mask.to(dev)).logits
                for j, (p, r) in enumerate(seqs[i : i + batch]):
                    out.append(z[j, len(p) - 1 : len(p) + len(r) - 1, : self.vocab_size].to("cpu", torch.float64))
        return out


def log_softmax_at(z: torch.Tensor, temperature: float) -> torch.Tensor:
    """The tempered log-distribution of raw logits rows [R, V], in float64 (temperature 0 is read as 1)."""
    return torch.log_softmax(z / (temperature or 1.0), dim=-1)


def check_tokenizer(trainer: HfTrainer, client, model: str, id_prompts: bool = True) -> list[str]:
    """Compare the trainer's tokenizer with the server's; return what was compared (lines), or raise a one-line
    ValueError naming the first differing token. The server must have /tokenize and /detokenize (vLLM's). Where it
    takes prompts only as text (`id_prompts` False), where its vocabulary ends is not asked (no prompt names an id)."""
    tok = trainer.tokenizer
    size = len(tok)
    if size > trainer.vocab_size:
        raise ValueError(
            f"tokenizer disagreement: the trainer's tokenizer has {size} tokens but its model's "
            f"vocabulary is {trainer.vocab_size}"
        )
    for i, accept in ((size - 1, True), (size, False)) if id_prompts else ():  # the vocabulary ends alike
        try:
            client.post("/v1/completions", {"model": model, "prompt": [i], "max_tokens": 1})
            took = True
        except ServerError as e:
            if "HTTP 4" not in str(e):
                raise
            took = False
        if took != accept:
            raise ValueError(
                f"tokenizer disagreement: the server {'refuses' if accept else 'accepts'} token id {i}; "
                f"the trainer's tokenizer has {size} tokens (ids 0..{size - 1})"
            )
    # Special tokens are compared through /tokenize below (a server may decode them to nothing).
    specials = set(tok.all_special_ids)
    ids = (
        [i for i in range(size) if i not in specials]
        if size <= DETOKENIZE_IDS
        else sorted(set(random.Random("gate:tok").sample(range(size), DETOKENIZE_IDS)) - specials)
    )

    def server_text(i):
        return client.post("/detokenize", {"model": model, "tokens": [i]}).get("prompt")

    with ThreadPoolExecutor(max_workers=16) as pool:
        theirs = list(pool.map(server_text, ids))
    for i, text in zip(ids, theirs):
        mine = tok.decode([i])
        if text != mine:
            raise ValueError(
                f"tokenizer disagreement: token id {i} is {text!r} on the server, {mine!r} in the "
                f"trainer's tokenizer ({trainer.spec.dir})"
            )
    for name, i in sorted(zip(tok.all_special_tokens, tok.all_special_ids)):
        got = client.post("/tokenize", {"model": model, "prompt": name, "add_special_tokens": False}).get("tokens")
        if got != [i]:
            raise ValueError(
                f"tokenizer disagreement: special token {name!r} is {got} on the server, [{i}] in the "
                "trainer's tokenizer"
            )
    for text in ROUND_TRIP:
        got = client.post("/tokenize", {"model": model, "prompt": text, "add_special_tokens": True}).get("tokens")
        mine = tok(text, add_special_tokens=True)["input_ids"]
        if got != mine:
            k = next((j for j, (a, b) in enumerate(zip(got or [], mine)) if a != b), min(len(got or []), len(mine)))
            at = lambda xs: f"{xs[k]} ({tok.decode([xs[k]])!r})" if k < len(xs) else "nothing"  # noqa: E731
            raise ValueError(
                f"tokenizer disagreement: {text!r} tokenizes differently at token {k}: server "
                f"{at(got or [])}, trainer {at(mine)}"
            )
        if tok.bos_token_id is not None and mine[:2] == [tok.bos_token_id] * 2:
            raise ValueError(f"tokenizer disagreement: BOS {tok.bos_token!r} is added twice to {text!r}")
    return [
        f"tokenizer agreement: vocabulary {size} on both sides; {len(ids)} token ids detokenize alike, "
        f"{len(specials)} special tokens and {len(ROUND_TRIP)} texts tokenize alike"
    ]
