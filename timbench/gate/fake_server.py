"""A small OpenAI-compatible completions server backed by timbench's exact engine (tests and `bench/`, no vLLM).

It speaks the subset of vLLM's OpenAI server the HTTP gate uses, in vLLM's shapes: /v1/models, /version, /health,
/v1/completions with token-id prompts, `logprobs` (processed: after temperature and top-k / top-p, as the exact
engine reports them), `return_tokens_as_token_ids`, `prompt_logprobs` (raw, temperature 1), `seed`, top-k / top-p,
and /tokenize, /detokenize. Each request is its own `generate` call (the exact engine is batch-invariant, so the
batching a real server does would change nothing); the engine is used under one lock. Loopback only.

Knobs make it a broken server for the gate's bad-input tests: `logprobs=False` (it returns none), `api_key`
(requests without it get 401), `delay` (seconds before each completion answer), `swap_tokens` (its tokenizer
swaps two token ids' texts), `logprobs_mode="raw"` (the sampled tokens' logprobs of the raw distribution, vLLM's
default `raw_logprobs`), `prompt_scoring` ("prompt_logprobs", "echo": prompt logprobs only through `echo` with
`logprobs`, as OpenAI's legacy API, or "none"), `top_p_logprobs="full"` (with top-k / top-p the sampled tokens'
logprobs of the full tempered distribution, not renormalised over the kept set), `routes` (the paths its
/openapi.json lists, as a FastAPI server's; None: no /openapi.json), `text_only` (the OpenAI API's text shapes, as
llama-cpp-python's server: a token-id prompt refused with 422, the prompt a string it tokenizes, every token
returned as its text).

Weight sync as vLLM's dev mode offers it: POST /collective_rpc with the method `reload_weights` (optional kwarg
`weights_path`; else the checkpoint it was started on) loads that checkpoint into the engine, and
/reset_prefix_cache answers success (the exact engine keeps no prefix cache); /v1/models reports the checkpoint
directory as `root`. `reload="ignored"` makes it a server whose reload answers 200 and loads nothing.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


class LoopbackServer(ThreadingHTTPServer):
    """A threaded HTTP server on 127.0.0.1 whose clients may hang up mid-answer (a gate's timeout) without a
    traceback on stderr."""

    daemon_threads = True
    request_queue_size = 256  # socketserver's default listen backlog of 5 resets a gate's 64 concurrent connections

    def __init__(self, handler):
        super().__init__(("127.0.0.1", 0), handler)

    def handle_error(self, request, client_address):
        if not isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
            super().handle_error(request, client_address)


class LoopbackService:
    """A loopback HTTP service run on a daemon thread while its `with` block lasts (the fake server and the fault
    proxy both): `_listen(handler)` binds a free port and sets `url`."""

    def _listen(self, handler) -> None:
        self.httpd = LoopbackServer(handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


class _Unprocessable(ValueError):
    """A request body the server's schema refuses (FastAPI's 422)."""


class FakeServer(LoopbackService):
    def __init__(
        self,
        checkpoint,
        name: str = "fake-model",
        logprobs: bool = True,
        api_key: str | None = None,
        delay: float = 0.0,
        swap_tokens: tuple[int, int] | None = None,
        logprobs_mode: str = "processed",
        prompt_scoring: str = "prompt_logprobs",
        top_p_logprobs: str = "renormalised",
        routes: tuple[str, ...] | None = None,
        reload: str = "loads",
        text_only: bool = False,
    ):
        from tokenizers import Tokenizer  # deferred: tokenizers is heavy

        from ..engine import Engine  # deferred: torch is heavy
        from ..model import load_checkpoint  # deferred: torch is heavy

        self.dir = Path(checkpoint)
        self.model = load_checkpoint(self.dir)
        self.engine = Engine(self.model.config, "kernels=exact,dtype=fp32", max_num_seqs=4)
        self.engine.load_weights(self.model)
        self.tok = Tokenizer.from_file(str(self.dir / "tokenizer.json"))
        self.name, self.logprobs, self.api_key, self.delay = name, logprobs, api_key, delay
        self.swap, self.logprobs_mode, self.prompt_scoring = swap_tokens, logprobs_mode, prompt_scoring
        self.top_p_logprobs, self.routes, self.reload = top_p_logprobs, routes, reload
        self.text_only = text_only
        self.lock = threading.Lock()
        self.requests = 0
        self._listen(_handler(self))

    # --- answers -----------------------------------------------------------------------------
    def models(self) -> dict:
        return {
            "object": "list",
            "data": [
                {
                    "id": self.name,
                    "object": "model",
                    "owned_by": "timbench-fake",
                    "root": str(self.dir),
                    "max_model_len": self.engine.max_len,
                }
            ],
        }

    def completion(self, body: dict) -> dict:
        from ..engine import Request, SamplingParams  # deferred: torch is heavy

        prompt = body["prompt"]
        if self.text_only:  # pydantic's answer to a list of ints where `prompt: str | list[str]`
            if not isinstance(prompt, str):
                raise _Unprocessable("prompt: Input should be a valid string")
            prompt = self.tok.encode(prompt, add_special_tokens=False).ids
            body = {**body, "return_tokens_as_token_ids": False}
        if not isinstance(prompt, list) or not prompt or not all(isinstance(t, int) for t in prompt):
            raise ValueError("prompt must be a non-empty list of token ids")
        bad = next((t for t in prompt if not 0 <= t < self.model.config.vocab_size), None)
        if bad is not None:
            raise ValueError(f"Token id {bad} is out of vocabulary")
        if body.get("model") != self.name:
            raise LookupError(f"The model `{body.get('model')}` does not exist.")
        params = SamplingParams(
            temperature=float(body.get("temperature", 1.0)),
            top_p=float(body.get("top_p", 1.0)),
            top_k=max(0, int(body.get("top_k") or 0)),
            seed=int(body.get("seed") or 0),
            full_logprobs=True,
        )
        time.sleep(self.delay)
        with self.lock:
            self.requests += 1
            c = self.engine.generate([Request(tuple(prompt), int(body.get("max_tokens", 16)), 0)], params)[0]
            want = (
                "prompt_logprobs" if body.get("prompt_logprobs") is not None else "echo" if body.get("echo") else None
            )
            rows = self._prompt_rows(prompt) if want and want == self.prompt_scoring else None
            lps = [float(x) for x in c.logprobs]
            full_t = (
                1.0
                if self.logprobs_mode == "raw"
                else params.temperature
                if (params.truncates and self.top_p_logprobs == "full")
                else None
            )
            if full_t is not None:  # raw: vLLM's raw_logprobs (temperature 1, before any processing)
                from ..diagnose.forward import score  # deferred: torch is heavy

                seqs = [(prompt, c.token_ids)]
                lps = [float(x) for x in score(self.model, self.engine.spec, seqs, full_t).logprobs[0]]
        ids = [f"token_id:{t}" if body.get("return_tokens_as_token_ids") else self._text([t]) for t in c.token_ids]
        choice = {"index": 0, "text": self._text(c.token_ids), "finish_reason": c.finish_reason, "stop_reason": None}
        if self.logprobs and body.get("logprobs") is not None:
            tops = None
            if not params.truncates:  # the top-1 of the processed distribution (the raw tempered one here)
                tops = [
                    {
                        ids[i]: lps[i],
                        f"token_id:{int(row.argmax())}"
                        if body.get("return_tokens_as_token_ids")
                        else self._text([int(row.argmax())]): float(row.max()),
                    }
                    for i, row in enumerate(c.full_logprobs)
                ]
            choice["logprobs"] = {
                "tokens": ids,
                "token_logprobs": lps,
                "top_logprobs": tops,
                "text_offset": list(range(len(ids))),
            }
        else:
            choice["logprobs"] = None
        if rows is not None and want == "echo" and choice["logprobs"]:  # the prompt's tokens and logprobs first
            lp, key = (
                choice["logprobs"],
                (lambda t: f"token_id:{t}" if body.get("return_tokens_as_token_ids") else self._text([t])),
            )
            lp["tokens"] = [key(t) for t in prompt] + lp["tokens"]
            lp["token_logprobs"] = (
                [None] + [r[str(t)]["logprob"] for r, t in zip(rows[1:], prompt[1:])] + lp["token_logprobs"]
            )
            tops = [None] + [{key(int(k)): v["logprob"] for k, v in r.items()} for r in rows[1:]]
            lp["top_logprobs"] = tops + lp["top_logprobs"] if lp["top_logprobs"] else None
        elif rows is not None:
            choice["prompt_logprobs"] = rows
        return {
            "id": f"cmpl-{self.requests}",
            "object": "text_completion",
            "model": self.name,
            "choices": [choice],
            "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(c.token_ids)},
        }

    def collective_rpc(self, body: dict) -> dict:
        """vLLM's dev-mode /collective_rpc, for the one worker method the gate calls (reload_weights)."""
        from ..model import load_checkpoint

        if body.get("method") != "reload_weights":
            raise ValueError(f"method {body.get('method')!r}: this server runs reload_weights only")
        where = (body.get("kwargs") or {}).get("weights_path") or self.dir
        if self.reload == "loads":
            model = load_checkpoint(Path(where))
            with self.lock:
                self.engine.load_weights(model)
                self.model = model
        return {"results": [None]}

    def _prompt_rows(self, prompt: list[int]) -> list:
        """vLLM's prompt_logprobs: None, then per prompt token k >= 1 its raw logprob, rank and the top-1."""
        import torch  # deferred: torch is heavy

        from ..kernels.logprobs import token_logprobs_all  # deferred: torch is heavy

        c = self.engine.compute
        with torch.inference_mode():
            logits, _ = self.engine.model(torch.tensor([prompt]), c)
            full = token_logprobs_all(logits[0, :-1], 1.0, c.kernels).cpu()
        rows = [None]
        for k, t in enumerate(prompt[1:]):
            row = full[k]
            rank = int((row > row[t]).sum()) + 1
            top = int(row.argmax())
            rows.append(
                {
                    str(t): {"logprob": float(row[t]), "rank": rank, "decoded_token": self._text([t])},
                    str(top): {"logprob": float(row[top]), "rank": 1, "decoded_token": self._text([top])},
                }
            )
        return rows

    def _text(self, ids: list[int]) -> str:
        if self.swap:
            a, b = self.swap
            ids = [b if i == a else a if i == b else i for i in ids]
        return self.tok.decode(ids, skip_special_tokens=False)

    def tokenize(self, body: dict) -> dict:
        ids = self.tok.encode(body["prompt"], add_special_tokens=bool(body.get("add_special_tokens", True))).ids
        if self.swap:
            a, b = self.swap
            ids = [b if i == a else a if i == b else i for i in ids]
        return {"count": len(ids), "max_model_len": self.engine.max_len, "tokens": ids, "token_strs": None}


def _handler(server: FakeServer):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):  # quiet: the tests read the gate's output, not an access log
            pass

        def _send(self, code: int, doc: dict):
            raw = json.dumps(doc).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def _authorized(self) -> bool:
            if server.api_key and self.headers.get("Authorization") != f"Bearer {server.api_key}":
                self._send(401, {"error": {"message": "Unauthorized", "type": "invalid_request_error"}})
                return False
            return True

        def do_GET(self):
            if not self._authorized():
                return
            answers = {"/v1/models": server.models, "/version": lambda: {"version": "fake-0"}, "/health": dict}
            if server.routes is not None:
                answers["/openapi.json"] = lambda: {"openapi": "3.1.0", "paths": {r: {} for r in server.routes}}
            fn = answers.get(self.path)
            self._send(200, fn()) if fn else self._send(404, {"detail": "Not Found"})

        def do_POST(self):
            if not self._authorized():
                return
            try:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                if self.path == "/v1/completions":
                    doc = server.completion(body)
                elif self.path == "/tokenize":
                    doc = server.tokenize(body)
                elif self.path == "/detokenize":
                    doc = {"prompt": server._text(list(body["tokens"]))}
                elif self.path == "/collective_rpc":
                    doc = server.collective_rpc(body)
                elif self.path == "/reset_prefix_cache":
                    doc = {"success": True}
                else:
                    return self._send(404, {"detail": "Not Found"})
            except _Unprocessable as e:
                return self._send(422, {"detail": [{"type": "string_type", "loc": ["body", "prompt"], "msg": str(e)}]})
            except LookupError as e:
                return self._send(404, {"error": {"message": str(e), "type": "NotFoundError", "code": 404}})
            except (ValueError, KeyError, TypeError) as e:
                return self._send(400, {"error": {"message": str(e), "type": "BadRequestError", "code": 400}})
            self._send(200, doc)

    return Handler
