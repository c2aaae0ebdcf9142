"""A loopback fault proxy between the gate and an OpenAI-compatible server: the HTTP path's fault library.

`FaultProxy(upstream, fault)` listens on 127.0.0.1 and forwards every request to `upstream` (headers such as the
API key pass through untouched), injecting one semantic bug class into /v1/completions, as a broken serving
layer or client library would:

- `zero_logprobs`: every sampled token's logprob returned as 0.0 (NeMo-RL #4218 / SkyRL #1870: never populated);
- `shifted_logprobs`: each sampled token gets the next token's logprob (an off-by-one in the logprob path);
- `temperature_twice`: the temperature applied twice (a logits processor and the sampler both divide by T): the
  request reaches the server with T^2, so its tokens and logprobs are of the T^2 distribution;
- `bf16_logprobs`: the returned logprobs rounded to bf16 on the way out (a dtype regression in the output path).

Prompt logprobs (teacher forcing) pass untouched: the faults are on the rollout path. `none` forwards only (the
clean reruns). Loopback only; the upstream's answer is parsed as JSON, never executed.
"""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler

from .fake_server import LoopbackServer


def _bf16(x: float) -> float:
    import torch
    return float(torch.tensor(x, dtype=torch.float32).to(torch.bfloat16).float())


def _zero(lp: dict) -> None:
    lp["token_logprobs"] = [0.0 for _ in lp["token_logprobs"]]


def _shift(lp: dict) -> None:
    xs = lp["token_logprobs"]
    lp["token_logprobs"] = xs[1:] + xs[-1:]


def _round(lp: dict) -> None:
    lp["token_logprobs"] = [_bf16(x) for x in lp["token_logprobs"]]


FAULTS = {
    "none": (None, None),
    "zero_logprobs": (None, _zero),
    "shifted_logprobs": (None, _shift),
    "temperature_twice": (lambda body: {**body, "temperature": float(body.get("temperature", 1.0)) ** 2}, None),
    "bf16_logprobs": (None, _round),
}
"""fault -> (what it does to a /v1/completions request body, what it does to each choice's `logprobs`)."""
EXPECTED_PROBE = {"zero_logprobs": "logprob_semantics", "shifted_logprobs": "logprob_semantics",
                  "temperature_twice": "logprob_semantics", "bf16_logprobs": "logprob_semantics"}
"""The probe that must name each fault (others may fail too: zero and shifted logprobs also fail alignment)."""


class FaultProxy:
    def __init__(self, upstream: str, fault: str = "none", timeout: float = 120.0):
        if fault not in FAULTS:
            raise ValueError(f"unknown HTTP fault {fault!r}; valid: {', '.join(FAULTS)}")
        self.upstream, self.fault, self.timeout = upstream.rstrip("/"), fault, timeout
        self.httpd = LoopbackServer(_handler(self))
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()

    def forward(self, method: str, path: str, headers: dict, body: bytes | None) -> tuple[int, bytes]:
        on_request, on_logprobs = FAULTS[self.fault]
        completions = path == "/v1/completions" and method == "POST"
        if completions and on_request and body:
            body = json.dumps(on_request(json.loads(body))).encode()
        req = urllib.request.Request(self.upstream + path, data=body, headers=headers, method=method)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as r:
                code, raw = r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()
        if completions and on_logprobs and code == 200:
            doc = json.loads(raw)
            for ch in doc.get("choices") or []:
                if isinstance(ch.get("logprobs"), dict) and ch["logprobs"].get("token_logprobs"):
                    on_logprobs(ch["logprobs"])
            raw = json.dumps(doc).encode()
        return code, raw


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
