"""A loopback fault proxy between the gate and an OpenAI-compatible server: the HTTP path's fault library.

`FaultProxy(upstream, fault)` listens on 127.0.0.1 and forwards every request to `upstream` (headers such as the
API key pass through untouched), injecting one semantic bug class into /v1/completions, as a broken serving
layer or client library would:

- `zero_logprobs`: every sampled token's logprob returned as 0.0 (NeMo-RL #4218 / SkyRL #1870: never populated);
- `shifted_logprobs`: each sampled token gets the next token's logprob (an off-by-one in the logprob path);
- `temperature_twice`: the temperature applied twice (a logits processor and the sampler both divide by T): the
  request reaches the server with T^2, so its tokens and logprobs are of the T^2 distribution;
- `bf16_logprobs`: the returned logprobs rounded to bf16 on the way out (a dtype regression in the output path);
- `raw_logprobs`: raw and processed swapped: each sampled token's logprob replaced by its raw one (temperature 1,
  no top-k / top-p), read from the upstream's prompt logprobs of prompt + response (vLLM's `raw_logprobs` mode);
- `stale_checkpoint`: /v1/completions forwarded to `stale=URL`, a server holding other weights (a weight sync
  that never reached the server), under the model name that server serves (vLLM names a model by its path);
  discovery and /tokenize still go to the upstream;
- `bos_twice`: a changed tokenizer or template: every completion prompt reaches the server with one more BOS
  (`bos_id`) in front, as a chat template that adds BOS to an already tokenized prompt does; the prompt
  logprobs are trimmed back to the prompt the client sent, so the server stays consistent with itself and
  only a comparison with the trainer can see it;
- `kept_prefix_cache`: a weight sync that does not flush the prefix cache: /reset_prefix_cache is answered
  `{"success": true}` and never reaches the server, so prompts prefilled before a sync are served from KV blocks
  of the old weights (SkyRL #2246). Only the weight-sync probe (`sync_dir=`) can see it.

Prompt logprobs (teacher forcing) pass untouched by the other faults: they are on the rollout path. `none`
forwards only (the clean reruns). Loopback only; the upstream's answer is parsed as JSON, never executed.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler

from ..util.registry import Registry
from .fake_server import LoopbackService


def _bf16(x: float) -> float:
    import torch  # deferred: torch is heavy

    return float(torch.tensor(x, dtype=torch.float32).to(torch.bfloat16).float())


def _zero(lp: dict) -> None:
    lp["token_logprobs"] = [0.0 for _ in lp["token_logprobs"]]


def _shift(lp: dict) -> None:
    xs = lp["token_logprobs"]
    lp["token_logprobs"] = xs[1:] + xs[-1:]


def _round(lp: dict) -> None:
    lp["token_logprobs"] = [_bf16(x) for x in lp["token_logprobs"]]


def _bos_twice(bos_id: int):
    return lambda body: (
        {**body, "prompt": [bos_id] + list(body["prompt"])} if isinstance(body.get("prompt"), list) else body
    )


def _trim_bos(ch: dict, echo: bool) -> None:
    """The server's answer for [BOS] + prompt as an answer for prompt: its first prompt logprob row dropped."""
    rows = ch.get("prompt_logprobs")
    if isinstance(rows, list) and len(rows) > 1:
        ch["prompt_logprobs"] = [None] + rows[2:]
    lp = ch.get("logprobs")
    if echo and isinstance(lp, dict):  # the echoed prompt starts with the BOS the proxy added
        for k in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
            if isinstance(lp.get(k), list) and lp[k]:
                lp[k] = lp[k][1:]
        if lp.get("token_logprobs"):
            lp["token_logprobs"][0] = None


FAULTS: Registry[tuple] = Registry(
    "HTTP fault",
    {
        "none": (None, None),
        "zero_logprobs": (None, _zero),
        "shifted_logprobs": (None, _shift),
        "temperature_twice": (lambda body: {**body, "temperature": float(body.get("temperature", 1.0)) ** 2}, None),
        "bf16_logprobs": (None, _round),
        "raw_logprobs": (None, None),  # FaultProxy._raw: it needs the upstream
        "stale_checkpoint": (None, None),  # FaultProxy.forward: another upstream
        "bos_twice": (None, None),  # FaultProxy.forward: the prompt and its prompt logprobs
        "kept_prefix_cache": (None, None),  # FaultProxy.forward: /reset_prefix_cache
    },
)
"""fault -> (what it does to a /v1/completions request body, what it does to each choice's `logprobs`)."""
EXPECTED_PROBE = {
    "zero_logprobs": "logprob_semantics",
    "shifted_logprobs": "logprob_semantics",
    "temperature_twice": "logprob_semantics",
    "bf16_logprobs": "logprob_semantics",
    "raw_logprobs": "logprob_semantics",
    "stale_checkpoint": "alignment",
    "bos_twice": "alignment",
    "kept_prefix_cache": "weight_sync",
}
"""The probe that must name each fault (others may fail too: zero and shifted logprobs also fail alignment)."""
SYNC_FAULTS = ("kept_prefix_cache",)
"""Faults on the weight-sync path: seen only by a run with `sync_dir=` against a server that keeps a prefix cache."""


class FaultProxy(LoopbackService):
    def __init__(
        self, upstream: str, fault: str = "none", timeout: float = 120.0, stale: str | None = None, bos_id: int = 1
    ):
        FAULTS.lookup(fault)
        if (fault == "stale_checkpoint") != (stale is not None):
            raise ValueError("the stale_checkpoint fault takes stale=URL (a server holding other weights), and only it")
        self.upstream, self.fault, self.timeout = upstream.rstrip("/"), fault, timeout
        self.stale, self.bos_id = stale.rstrip("/") if stale else None, bos_id
        self._listen(_handler(self))

    def _send(self, url: str, method: str, headers: dict, body: bytes | None) -> tuple[int, bytes]:
        req = urllib.request.Request(url, data=body, headers=headers, method=method)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    def forward(self, method: str, path: str, headers: dict, body: bytes | None) -> tuple[int, bytes]:
        on_request, on_logprobs = FAULTS[self.fault]
        completions = path == "/v1/completions" and method == "POST"
        if self.fault == "kept_prefix_cache" and path.split("?")[0] == "/reset_prefix_cache":
            return 200, json.dumps({"success": True}).encode()
        if self.fault == "bos_twice":
            on_request = _bos_twice(self.bos_id)
        if completions and on_request and body:
            body = json.dumps(on_request(json.loads(body))).encode()
        to = self.stale if completions and self.stale else self.upstream
        if to == self.stale and body:
            body = json.dumps({**json.loads(body), "model": self._stale_model(headers)}).encode()
        code, raw = self._send(to + path, method, headers, body)
        if not completions or code != 200 or self.fault not in ("bos_twice", "raw_logprobs") and not on_logprobs:
            return code, raw
        doc, sent = json.loads(raw), json.loads(body)
        for ch in doc.get("choices") or []:
            if self.fault == "bos_twice":
                _trim_bos(ch, bool(sent.get("echo")))
            elif isinstance(ch.get("logprobs"), dict) and ch["logprobs"].get("token_logprobs"):
                if self.fault == "raw_logprobs":
                    self._raw(sent, ch["logprobs"], headers)
                else:
                    on_logprobs(ch["logprobs"])
        return code, json.dumps(doc).encode()

    def _stale_model(self, headers: dict) -> str:
        """The model id the stale server serves (the first /v1/models lists)."""
        code, raw = self._send(self.stale + "/v1/models", "GET", headers, None)
        data = json.loads(raw).get("data") if code == 200 else None
        if not data:
            raise OSError(f"stale_checkpoint: {self.stale}/v1/models lists no model (HTTP {code})")
        return str(data[0]["id"])

    def _raw(self, body: dict, lp: dict, headers: dict) -> None:
        """The sampled tokens' raw logprobs: one prefill of prompt + response at temperature 1 (prompt logprobs)."""
        if body.get("echo") or body.get("prompt_logprobs") is not None:
            return  # a scoring request: its prompt logprobs are raw already
        toks = [int(str(t).removeprefix("token_id:")) for t in lp.get("tokens") or []]
        n = len(body["prompt"])
        ask = {
            "model": body.get("model"),
            "prompt": list(body["prompt"]) + toks,
            "max_tokens": 1,
            "temperature": 1.0,
            "seed": 0,
            "logprobs": 1,
            "prompt_logprobs": 1,
            "return_tokens_as_token_ids": True,
        }
        code, raw = self._send(self.upstream + "/v1/completions", "POST", headers, json.dumps(ask).encode())
        rows = json.loads(raw)["choices"][0].get("prompt_logprobs") if code == 200 else None
        if not isinstance(rows, list):
            raise OSError(f"raw_logprobs: the upstream gave no prompt logprobs (HTTP {code})")
        lp["token_logprobs"] = [float(r[str(t)]["logprob"]) for r, t in zip(rows[n : n + len(toks)], toks)]


def _handler(proxy: FaultProxy):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def _relay(self, method: str):
            n = int(self.headers.get("Content-Length", 0))
            body = self.rfile.read(n) if n else None
            keep = {k: v for k, v in self.headers.items() if k.lower() in ("authorization", "content-type", "accept")}
            try:
                code, raw = proxy.forward(method, self.path, keep, body)
            except (urllib.error.URLError, OSError) as e:
                code, raw = 502, json.dumps({"error": {"message": f"proxy: upstream unreachable ({e})"}}).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def do_GET(self):
            self._relay("GET")

        def do_POST(self):
            self._relay("POST")

    return Handler
