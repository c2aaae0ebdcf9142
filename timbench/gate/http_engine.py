"""An OpenAI-compatible completions server as a timbench rollout engine (`--engine openai=URL`).

`HttpEngine` has the interface the gate's probes drive (`generate`, `score`, `config.vocab_size`, `max_len`):
token-id prompts to /v1/completions with `logprobs` (and vLLM's `return_tokens_as_token_ids`, so the sampled
tokens come back as ids, never re-tokenized text), a per-request `seed`, temperature / top-p / top-k, and one
call's requests sent concurrently (a server batches what arrives together, so the batch-invariance probe puts
load on it). `score` is teacher forcing through prompt logprobs (vLLM's `prompt_logprobs`, or `echo` with
`logprobs`): the response appended to the prompt, each token's logprob read back from one prefill.

`discover` asks the server what it offers (/v1/models, /version, one probe request, the routes /openapi.json
lists) before any probe runs; a capability that is missing makes the probes that need it raise `NotTested`,
reported with the reason, never passed.

Weight sync over HTTP is driven only on request (`sync_dir=DIR`, timbench.gate.http_weight_sync), through vLLM's
dev-mode routes (`VLLM_SERVER_DEV_MODE=1`: /collective_rpc `reload_weights`, /reset_prefix_cache); `discover`
records which of WEIGHT_ROUTES /openapi.json lists (vLLM dev mode, SGLang, RL frameworks' extensions), and
`weight_sync_reason` names them when the probe is not tested.

A server that takes prompts only as text, or returns tokens only as text (the OpenAI API's own shapes: the
legacy completions API, llama-cpp-python's server), is driven through the trainer's tokenizer (`TextVocab`) where
that is exact: a prompt goes as text only when the tokenizer turns the text back into exactly its ids, and every
answer's prompt-token count must then be the number of ids; a returned token's text maps back to its id only when
no two ids of the vocabulary share a text. Nothing is re-tokenized; where that is not exact, the probes are not
tested.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import torch

from ..engine import Completion, Request, SamplingParams
from ..engine.score import EngineScores
from .http_client import Client, ServerError

TOKEN_ID_PREFIX = "token_id:"
"""How vLLM spells a token with `return_tokens_as_token_ids` (`token_id:42`)."""


WEIGHT_ROUTES = (
    "/collective_rpc",
    "/update_weights",
    "/update_weights_from_disk",
    "/reload_weights",
    "/v1/load_lora_adapter",
    "/sleep",
    "/wake_up",
    "/reset_prefix_cache",
)
"""Routes looked for in /openapi.json that load or refresh a running server's weights (vLLM dev mode, SGLang,
RL frameworks' extensions)."""


class NotTested(Exception):
    """A probe needs a capability the server does not offer: its row says so with this reason."""


@dataclass(frozen=True)
class TextVocab:
    """The trainer's tokenizer, for a server that takes or returns tokens only as text: `text` of a prompt's ids
    (only where the tokenizer turns it back into exactly those ids), and `pieces`, each id's text -> the id, or None
    when two ids share a text (a returned token's text would then not name one id)."""

    decode: Callable[[list[int]], str]
    encode: Callable[[str], list[int]]
    pieces: dict[str, int] | None

    @classmethod
    def of(cls, tokenizer) -> TextVocab:
        """From a Hugging Face tokenizer: special tokens decoded as their text, nothing added or cleaned up."""

        def decode(ids):
            return tokenizer.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)

        def encode(text):
            return list(tokenizer.encode(text, add_special_tokens=False))

        texts = [decode([i]) for i in range(len(tokenizer))]
        unique = all(texts) and len(set(texts)) == len(texts)
        return cls(decode, encode, {t: i for i, t in enumerate(texts)} if unique else None)

    def text(self, ids) -> str:
        text = self.decode(list(ids))
        if self.encode(text) != list(ids):
            raise NotTested(
                "the server takes prompts only as text, and the trainer's tokenizer does not turn the text of "
                f"prompt {list(ids)[:8]}... back into those ids"
            )
        return text

    def ids(self, tokens: list) -> list[int]:
        """Returned token texts -> ids through `pieces`; NotTested where the vocabulary cannot say which id."""
        if self.pieces is None:
            raise NotTested(
                "the server returns tokens as text, and the trainer's vocabulary has ids that share a text (or an "
                "empty one): a token's text does not name its id"
            )
        try:
            return [self.pieces[str(t)] for t in tokens]
        except KeyError as e:
            raise ServerError(f"the server returned a token {e.args[0]!r} that is no token of the vocabulary") from None


@dataclass
class Offer:
    """What the server offers, as discovered."""

    model: str
    models: list[str]
    server: str = "unknown"
    version: str = "not reported"
    max_model_len: int | None = None
    root: str | None = None
    """The served model's path as /v1/models reports it (vLLM's `root`: its --model), or None."""
    token_ids: bool = False
    """Sampled tokens come back as ids (vLLM's return_tokens_as_token_ids)."""
    prompt_text: bool = False
    """The server refuses token-id prompts: prompts go as their text (`vocab.text`)."""
    token_text: bool = False
    """Sampled tokens come back as text, each naming one id of the vocabulary (`vocab.ids`)."""
    vocab: TextVocab | None = None
    """The trainer's tokenizer, where prompts or tokens go as text."""
    prompt_logprobs: str | None = None
    """How prompt tokens are scored: "prompt_logprobs" (vLLM), "echo" (echo + logprobs), or None."""
    top_k: bool = False
    tokenize: bool = False
    """/tokenize and /detokenize exist (vLLM): the tokenizer agreement check can run."""
    weight_routes: list[str] | None = None
    """Which of WEIGHT_ROUTES /openapi.json lists; None when the server lists no routes."""
    notes: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        yes = lambda b: "yes" if b else "no"  # noqa: E731
        return [
            f"server: {self.server} {self.version}; model {self.model} (served: {', '.join(self.models)}); "
            f"max_model_len {self.max_model_len or 'not reported'}",
            f"offers: logprobs yes; token ids {yes(self.token_ids)}; prompt logprobs "
            f"{self.prompt_logprobs or 'no'}; seed yes; top_k {yes(self.top_k)}; /tokenize {yes(self.tokenize)}",
        ] + (
            [
                f"text: prompts as {'text (token-id prompts refused)' if self.prompt_text else 'token ids'}; "
                f"tokens as {'text, each naming one id' if self.token_text else 'ids' if self.token_ids else 'text'}"
            ]
            if self.vocab
            else []
        )


def request_seed(seed: int, request_id: int) -> int:
    """A request's sampling seed: a 31-bit hash of (the suite's seed, request id), so a request samples the same
    stream whatever else the server batches with it, and fits every server's seed type."""
    h = hashlib.blake2b(f"timbench-http:{seed}:{request_id}".encode(), digest_size=4).digest()
    return int.from_bytes(h, "little") & 0x7FFFFFFF


def _ids(tokens: list) -> list[int]:
    """Tokens as ids: JSON integers, or strings spelled as vLLM spells an id (a bare digit is a token's text)."""
    try:
        if not all(_is_id(t) for t in tokens):
            raise ValueError("a token as text")
        return [t if isinstance(t, int) else int(t.removeprefix(TOKEN_ID_PREFIX)) for t in tokens]
    except ValueError:
        raise NotTested(
            "the server returns tokens as text, not ids (vLLM's return_tokens_as_token_ids); "
            "re-tokenizing text is not the server's token ids"
        ) from None


def _is_id(t) -> bool:
    return (isinstance(t, int) and not isinstance(t, bool)) or (isinstance(t, str) and t.startswith(TOKEN_ID_PREFIX))


def discover(client: Client, probe_prompt=(5, 6, 7), vocab: Callable[[], TextVocab] | None = None) -> Offer:
    """The server's models, version and capabilities; a one-line ServerError when it serves no usable model or
    returns no logprobs (nothing could then be tested). `vocab` (the trainer's tokenizer, loaded when called) is
    used where the server refuses token-id prompts (an HTTP error answer) or returns tokens as text."""
    listed = client.get("/v1/models").get("data")
    if not isinstance(listed, list) or not listed:
        raise ServerError(f"GET {client.spec.url}/v1/models lists no model")
    models = [str(m.get("id")) for m in listed if isinstance(m, dict)]
    want = client.spec.model
    if want is None and len(models) > 1:
        raise ServerError(f"the server serves {len(models)} models ({', '.join(models)}): name one with model=NAME")
    model = want or models[0]
    if model not in models:
        raise ServerError(f"the server does not serve model {model!r}; it serves {', '.join(models)}")
    entry = listed[models.index(model)]
    offer = Offer(
        model,
        models,
        server=str(entry.get("owned_by") or "unknown"),
        max_model_len=entry.get("max_model_len"),
        root=entry.get("root") if isinstance(entry.get("root"), str) else None,
    )
    try:
        offer.version = str(client.get("/version").get("version", "not reported"))
    except ServerError:
        pass  # not every server has /version: gate.json says "not reported"
    base = {
        "model": model,
        "prompt": list(probe_prompt),
        "max_tokens": 2,
        "temperature": 1.0,
        "seed": 1,
        "logprobs": 1,
        "return_tokens_as_token_ids": True,
    }
    try:
        choice = _choice(client.post("/v1/completions", base))
    except ServerError as e:
        # refused with an HTTP answer (4xx; llama-cpp-python answers its schema's refusal with a 500): as text
        if vocab is None or e.status is None or e.status == 429:
            raise
        offer.vocab = vocab()
        try:
            base["prompt"] = offer.vocab.text(probe_prompt)
            choice = _choice(client.post("/v1/completions", base))
        except (ServerError, NotTested) as e2:
            raise ServerError(f"{e}; and as text: {e2}") from None
        offer.prompt_text = True
    lp = choice.get("logprobs")
    if not isinstance(lp, dict) or not _floats(lp.get("token_logprobs")):
        raise ServerError(
            f"{client.spec.url} returns no logprobs for `logprobs: 1` on /v1/completions; the gate "
            "needs each sampled token's logprob"
        )
    try:
        offer.token_ids = len(_ids(lp.get("tokens") or [])) > 0
    except NotTested:
        offer.notes.append("tokens come back as text")
        if vocab is not None:
            offer.vocab = offer.vocab or vocab()
            try:
                offer.token_text = len(offer.vocab.ids(lp.get("tokens") or [])) > 0
            except (NotTested, ServerError) as e:
                offer.notes.append(str(e))
    offer.top_k = _accepted(client, {**base, "top_k": 5})
    if _prompt_lps(_try(client, {**base, "prompt_logprobs": 1}), len(probe_prompt)) is not None:
        offer.prompt_logprobs = "prompt_logprobs"
    elif _echo_lps(_try(client, {**base, "echo": True, "max_tokens": 1}), len(probe_prompt)) is not None:
        offer.prompt_logprobs = "echo"
    try:
        client.post("/tokenize", {"model": model, "prompt": "a"})
        offer.tokenize = True
    except ServerError:
        pass
    try:
        paths = client.get("/openapi.json").get("paths")
        if isinstance(paths, dict):
            offer.weight_routes = [r for r in WEIGHT_ROUTES if r in paths]
    except ServerError:
        pass  # not a FastAPI server, or its schema is off: the weight-sync reason says the routes are unknown
    return offer


def weight_sync_reason(offer: Offer) -> str:
    """Why the weight-sync probe is not tested without the opt-in, naming the weight-load routes the server lists."""
    why = "weight sync changes the weights a running server serves, so the gate drives it only when asked"
    if offer.weight_routes is None:
        return f"{why}; the server lists no routes (/openapi.json), so its weight-load routes are unknown"
    if not offer.weight_routes:
        return (
            f"{why}; the server lists none of {', '.join(WEIGHT_ROUTES)} (vLLM exposes /collective_rpc, "
            "/sleep, /wake_up and /reset_prefix_cache with VLLM_SERVER_DEV_MODE=1)"
        )
    return f"{why}; the server lists {', '.join(offer.weight_routes)}"


def _choice(doc: dict) -> dict:
    ch = doc.get("choices")
    if not isinstance(ch, list) or not ch or not isinstance(ch[0], dict):
        raise ServerError("a /v1/completions answer has no choices")
    return ch[0]


def _floats(xs) -> bool:
    return isinstance(xs, list) and len(xs) > 0 and all(isinstance(x, (int, float)) or x is None for x in xs)


def _try(client: Client, body: dict) -> dict | None:
    try:
        return _choice(client.post("/v1/completions", body))
    except ServerError:
        return None


def _accepted(client: Client, body: dict) -> bool:
    return _try(client, body) is not None


def _prompt_lps(choice: dict | None, n: int) -> list[dict] | None:
    """vLLM's prompt_logprobs of a choice: entry k scores prompt token k ({id: {"logprob", "rank"}}); entry 0 None."""
    rows = (choice or {}).get("prompt_logprobs") or (choice or {}).get("prompt_logprobs_list")
    return rows if isinstance(rows, list) and len(rows) >= n and all(isinstance(r, dict) for r in rows[1:n]) else None


def _echo_lps(choice: dict | None, n: int) -> list | None:
    lp = (choice or {}).get("logprobs") or {}
    xs = lp.get("token_logprobs")
    return xs if isinstance(xs, list) and len(xs) >= n and _floats(xs[1:n]) else None


@dataclass
class _Config:
    vocab_size: int
    max_position_embeddings: int


class HttpEngine:
    """`Engine`'s generate / score over HTTP, against the model `offer` names."""

    def __init__(self, client: Client, offer: Offer, vocab_size: int, max_len: int):
        self.client, self.offer = client, offer
        self.config = _Config(vocab_size, max_len)
        self.max_len, self.max_num_seqs = max_len, client.spec.concurrency
        self.spec = client.spec  # what the probes print; an OpenAISpec, never a timbench Spec
        self.top_ids: dict[int, list[int]] = {}
        """request id -> the server's top-1 token id at each sampled position (argmax flips), when it gave one."""
        self.prompt_counts: dict[int, tuple[int, int]] = {}
        """request id -> (prompt tokens sent, prompt tokens the server's usage counted), where the two differ."""

    def _map(self, fn, items):
        with ThreadPoolExecutor(max_workers=max(1, min(self.client.spec.concurrency, len(items)))) as pool:
            return list(pool.map(fn, items))

    def generate(self, requests, params: SamplingParams = SamplingParams()) -> list[Completion]:
        if not (self.offer.token_ids or self.offer.token_text):
            why = f": {self.offer.notes[-1]}" if self.offer.token_text is False and self.offer.vocab else ""
            raise NotTested(
                f"the server returns sampled tokens as text, not ids (vLLM's return_tokens_as_token_ids){why}"
            )
        if params.top_k and not self.offer.top_k:
            raise NotTested("the server refuses top_k")
        return self._map(lambda r: self._one(r, params), list(requests))

    def _prompt(self, ids: list[int]):
        """What a request's `prompt` carries: the ids, or their text where the server refuses token-id prompts."""
        return self.offer.vocab.text(ids) if self.offer.prompt_text else list(ids)

    def _ids(self, tokens: list) -> list[int]:
        return self.offer.vocab.ids(tokens) if self.offer.token_text else _ids(tokens)

    def _counted(self, doc: dict, sent: int, request_id) -> None:
        """Record a prompt-token count that is not the number sent; for a prompt sent as text, refuse the answer
        (the server split the text into other tokens than the ids it stands for)."""
        counted = (doc.get("usage") or {}).get("prompt_tokens")
        if self.offer.prompt_text and counted != sent:
            raise ServerError(
                f"request {request_id}: its prompt went as the text of {sent} token ids and the server counted "
                f"{counted} prompt tokens (usage.prompt_tokens): it tokenizes the text otherwise"
            )
        if isinstance(counted, int) and counted != sent and request_id is not None:
            self.prompt_counts[request_id] = (sent, counted)

    def _one(self, r: Request, params: SamplingParams) -> Completion:
        body = {
            "model": self.offer.model,
            "prompt": self._prompt(r.prompt_ids),
            "temperature": params.temperature,
            "top_p": params.top_p,
            "seed": request_seed(params.seed, r.request_id),
            "logprobs": 1,
            "max_tokens": min(r.max_new_tokens, self.max_len - len(r.prompt_ids)),
            "return_tokens_as_token_ids": True,
            **({"top_k": params.top_k} if params.top_k else {}),
        }
        doc = self.client.post("/v1/completions", body)
        ch = _choice(doc)
        self._counted(doc, len(r.prompt_ids), r.request_id)
        lp = ch.get("logprobs") or {}
        ids, lps = self._ids(lp.get("tokens") or []), lp.get("token_logprobs") or []
        stopped = ch.get("finish_reason") == "stop"  # a server may end at a stop token it does not list: no tokens
        if len(ids) != len(lps) or not (ids or stopped) or any(not isinstance(x, (int, float)) for x in lps):
            raise ServerError(f"request {r.request_id}: {len(ids)} tokens but {len(lps)} logprobs came back")
        tops = lp.get("top_logprobs")
        self.top_ids.pop(r.request_id, None)  # request ids recur across calls: never keep another call's tops
        if isinstance(tops, list) and len(tops) == len(ids) and all(isinstance(t, dict) and t for t in tops):
            with contextlib.suppress(NotTested, ServerError):  # argmax flips only: a top token may have no id
                self.top_ids[r.request_id] = self._ids([max(t, key=t.get) for t in tops])
        return Completion(
            r.request_id,
            list(r.prompt_ids),
            ids,
            torch.tensor(lps, dtype=torch.float32),
            ch.get("finish_reason") or "length",
        )

    def score(self, seqs, params: SamplingParams = SamplingParams(), request_ids=None) -> EngineScores:
        """Teacher-forced logprobs and argmax of each response token, read from one prefill's prompt logprobs
        (raw distribution: temperature 1 without top-k / top-p only, as `VllmEngine.score`)."""
        if self.offer.prompt_logprobs is None:
            raise NotTested("the server offers neither prompt_logprobs nor echo with logprobs (no prefill scoring)")
        if params.temperature != 1.0 or params.top_p != 1.0 or params.top_k:
            raise ValueError("HttpEngine.score: prompt logprobs are of the raw distribution; score at temperature 1")
        rows = self._map(lambda s: self._prefill(list(s[0]), list(s[1])), list(seqs))
        return EngineScores([lp for lp, _ in rows], [am for _, am in rows], None)

    def _prefill(self, prompt: list[int], response: list[int]):
        body = {
            "model": self.offer.model,
            "prompt": self._prompt(prompt + response),
            "max_tokens": 1,
            "temperature": 1.0,
            "seed": 0,
            "logprobs": 1,
            "return_tokens_as_token_ids": True,
        }
        n = len(prompt) + len(response)
        if self.offer.prompt_logprobs == "prompt_logprobs":
            rows = _prompt_lps(_choice(self.client.post("/v1/completions", {**body, "prompt_logprobs": 1})), n)
            if rows is None:
                raise ServerError("an answer with prompt_logprobs requested carries none")
            steps = rows[len(prompt) : n]
            lps = [float(s[str(t)]["logprob"] if str(t) in s else s[t]["logprob"]) for s, t in zip(steps, response)]
            am = [int(next(k for k, v in s.items() if v.get("rank") == 1)) for s in steps]
            return torch.tensor(lps, dtype=torch.float64), torch.tensor(am)
        doc = self.client.post("/v1/completions", {**body, "echo": True})
        self._counted(doc, n, None)
        lp = _choice(doc)["logprobs"]
        start = self._echo_start(lp.get("tokens") or [], prompt + response)
        xs = lp["token_logprobs"][start + len(prompt) : start + n]
        tops = (lp.get("top_logprobs") or [])[start + len(prompt) : start + n]
        am = []
        for t in tops:
            try:
                am.append(self._ids([max(t, key=t.get)])[0] if isinstance(t, dict) and t else -1)
            except (NotTested, ServerError):
                am.append(-1)  # a top token with no id: no argmax for that position
        return torch.tensor([float(x) if x is not None else math.nan for x in xs], dtype=torch.float64), torch.tensor(
            am if len(am) == len(xs) else [-1] * len(xs)
        )

    def _echo_start(self, tokens: list, seq: list[int]) -> int:
        """Where the echoed sequence starts in an echo answer's token list: 0, or -1 for a server that leaves the
        first prompt token out of the echo (llama-cpp-python drops a leading BOS); checked against the ids sent
        where the tokens name ids, else by the count (the sequence and at most one generated token)."""
        try:
            got = self._ids(tokens)
        except (NotTested, ServerError):
            if len(tokens) in (len(seq), len(seq) + 1):
                return 0
            raise ServerError(f"an echo answer has {len(tokens)} tokens for a {len(seq)}-token prompt") from None
        for start in (0, -1):
            if got[: len(seq) + start] == seq[-start:]:
                return start
        raise ServerError(f"an echo answer's tokens {got[:8]}... are not the prompt's {seq[:8]}...")
