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
"""

from __future__ import annotations

import hashlib
import math
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
        ]


def request_seed(seed: int, request_id: int) -> int:
    """A request's sampling seed: a 31-bit hash of (the suite's seed, request id), so a request samples the same
    stream whatever else the server batches with it, and fits every server's seed type."""
    h = hashlib.blake2b(f"timbench-http:{seed}:{request_id}".encode(), digest_size=4).digest()
    return int.from_bytes(h, "little") & 0x7FFFFFFF


def _ids(tokens: list) -> list[int]:
    try:
        return [int(str(t).removeprefix(TOKEN_ID_PREFIX)) for t in tokens]
    except ValueError:
        raise NotTested(
            "the server returns tokens as text, not ids (vLLM's return_tokens_as_token_ids); "
            "re-tokenizing text is not the server's token ids"
        ) from None


def discover(client: Client, probe_prompt=(5, 6, 7)) -> Offer:
    """The server's models, version and capabilities; a one-line ServerError when it serves no usable model or
    returns no logprobs (nothing could then be tested)."""
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
    choice = _choice(client.post("/v1/completions", base))
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
        if not self.offer.token_ids:
            raise NotTested("the server returns sampled tokens as text, not ids (vLLM's return_tokens_as_token_ids)")
        if params.top_k and not self.offer.top_k:
            raise NotTested("the server refuses top_k")
        return self._map(lambda r: self._one(r, params), list(requests))

    def _one(self, r: Request, params: SamplingParams) -> Completion:
        body = {
            "model": self.offer.model,
            "prompt": list(r.prompt_ids),
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
        counted = (doc.get("usage") or {}).get("prompt_tokens")
        if isinstance(counted, int) and counted != len(r.prompt_ids):
            self.prompt_counts[r.request_id] = (len(r.prompt_ids), counted)
        lp = ch.get("logprobs") or {}
        ids, lps = _ids(lp.get("tokens") or []), lp.get("token_logprobs") or []
        if len(ids) != len(lps) or not ids or any(not isinstance(x, (int, float)) for x in lps):
            raise ServerError(f"request {r.request_id}: {len(ids)} tokens but {len(lps)} logprobs came back")
        tops = lp.get("top_logprobs")
        if isinstance(tops, list) and len(tops) == len(ids) and all(isinstance(t, dict) and t for t in tops):
            self.top_ids[r.request_id] = [_ids([max(t, key=t.get)])[0] for t in tops]
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
            "prompt": prompt + response,
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
        ch = _choice(self.client.post("/v1/completions", {**body, "echo": True}))
        lp = ch["logprobs"]
        xs = lp["token_logprobs"][len(prompt) : n]
        tops = lp.get("top_logprobs") or []
        am = [_ids([max(t, key=t.get)])[0] if isinstance(t, dict) and t else -1 for t in tops[len(prompt) : n]]
        return torch.tensor([float(x) if x is not None else math.nan for x in xs], dtype=torch.float64), torch.tensor(
            am if len(am) == len(xs) else [-1] * len(xs)
        )
