"""An OpenAI-compatible server as the gate sees it: the `openai=URL` spec, safe requests, and discovery.

Safe by default: a URL whose host is not a loopback address is refused unless the caller allows remote hosts
(`--allow-remote`); the API key is read from the environment (OPENAI_API_KEY, or the variable the spec's
`api_key_env=` names) and is never printed, stored or put in an error message; every request has a timeout and a
bounded number of retries (connection errors and 5xx / 429 answers only: a 4xx is the server's verdict on the
request); a response is parsed as JSON and nothing else (never executed, never unpickled). Standard library
only (urllib), so the gate needs no HTTP client dependency.
"""

from __future__ import annotations

import http.client
import ipaddress
import json
import os
import socket
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

DEFAULT_KEY_ENV = "OPENAI_API_KEY"
SPEC_DOC = "openai=URL[,model=NAME][,api_key_env=VAR][,timeout=SECONDS][,retries=N][,concurrency=N][,sync_dir=DIR]"


class ServerError(ValueError):
    """The server could not be reached or refused a request: one line naming the URL and what went wrong."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status
        """The HTTP status of the server's answer (a 4xx is its verdict on the request; a 5xx after the retries),
        or None where no answer came (unreachable, timed out)."""


@dataclass(frozen=True)
class OpenAISpec:
    url: str
    """Base URL without a trailing slash or /v1 (http://127.0.0.1:8000)."""
    model: str | None = None
    """The served model id to request; None: the one /v1/models lists (refused when it lists several)."""
    api_key_env: str = DEFAULT_KEY_ENV
    timeout: float = 60.0
    retries: int = 2
    concurrency: int = 64
    sync_dir: Path | None = None
    """The opt-in to the weight-sync probe: the checkpoint directory the server was started with (`--model DIR`),
    where the gate may write a perturbed copy of its weights and have the server reload from it
    (timbench.gate.http_weight_sync); None: the probe is not tested."""

    def __str__(self):  # what gate.json records: never the key, only where it came from
        parts = [f"openai={self.url}"] + ([f"model={self.model}"] if self.model else [])
        return ",".join(
            parts
            + [
                f"api_key_env={self.api_key_env}",
                f"timeout={self.timeout:g}",
                f"retries={self.retries}",
                f"concurrency={self.concurrency}",
            ]
            + ([f"sync_dir={self.sync_dir}"] if self.sync_dir else [])
        )


def parse_openai_spec(text: str, allow_remote: bool = False) -> OpenAISpec:
    """`openai=URL,key=value,...` -> OpenAISpec; a one-line ValueError naming the bad part and what is valid."""
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts or not parts[0].startswith("openai="):
        raise ValueError(f"engine spec {text!r}: an HTTP engine is {SPEC_DOC}")
    url = parts[0].removeprefix("openai=").rstrip("/")
    u = urllib.parse.urlsplit(url)
    if u.scheme not in ("http", "https") or not u.hostname:
        raise ValueError(f"engine spec: {url!r} is not an http(s) URL with a host, e.g. openai=http://127.0.0.1:8000")
    if u.username or u.password:
        raise ValueError(
            "engine spec: the URL carries credentials; give the API key through the environment "
            f"({DEFAULT_KEY_ENV} or api_key_env=VAR), never in the URL"
        )
    if not allow_remote and not is_loopback(u.hostname):
        raise ValueError(
            f"engine spec: {u.hostname} is not a loopback address; the gate talks to 127.0.0.1, ::1 "
            "or localhost unless run with --allow-remote"
        )
    url = url.removesuffix("/v1")
    kw = {}
    casts = {
        "model": str,
        "api_key_env": str,
        "timeout": float,
        "retries": int,
        "concurrency": int,
        "sync_dir": sync_dir,
    }
    for part in parts[1:]:
        key, sep, value = part.partition("=")
        if not sep or key not in casts:
            raise ValueError(f"engine spec: {part!r} is not one of the keys of {SPEC_DOC}")
        try:
            kw[key] = casts[key](value)
        except ValueError:
            if key == "sync_dir":
                raise
            raise ValueError(f"engine spec: {key}={value!r} is not a {casts[key].__name__}") from None
    spec = OpenAISpec(url, **kw)
    if spec.timeout <= 0 or spec.retries < 0 or spec.concurrency < 1:
        raise ValueError(
            f"engine spec: timeout must be > 0, retries >= 0 and concurrency >= 1 (got timeout="
            f"{spec.timeout:g}, retries={spec.retries}, concurrency={spec.concurrency})"
        )
    return spec


def sync_dir(text: str) -> Path:
    """`sync_dir=DIR`: an existing, writable checkpoint directory with safetensors weights (whether it is the one
    the server serves is checked against the server's answer, `http_weight_sync.check_sync_dir`)."""
    d = Path(text).expanduser()
    if not d.is_dir():
        raise ValueError(
            f"engine spec: sync_dir={text!r} is not a directory; it is the checkpoint directory the server was "
            "started with (--model DIR)"
        )
    if not any(d.glob("*.safetensors")):
        raise ValueError(
            f"engine spec: sync_dir={text!r} holds no *.safetensors weights; the weight-sync probe writes and "
            "reloads safetensors checkpoints only"
        )
    if not os.access(d, os.W_OK | os.X_OK):
        raise ValueError(
            f"engine spec: sync_dir={text!r} is not writable; the weight-sync probe writes its perturbed copy of "
            "the weights under it"
        )
    return d.resolve()


def is_loopback(host: str) -> bool:
    """Whether `host` names this machine only: a loopback IP literal, or `localhost` (resolved, every address)."""
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        pass
    if host.lower() != "localhost":
        return False  # another name could resolve anywhere, and a resolver may change its answer later
    try:
        return all(ipaddress.ip_address(a[4][0]).is_loopback for a in socket.getaddrinfo(host, None))
    except OSError:
        return False


class Client:
    """JSON over HTTP to one server, with the spec's timeout and retries; the key is sent, never shown."""

    def __init__(self, spec: OpenAISpec):
        self.spec = spec
        self._key = os.environ.get(spec.api_key_env) or None  # unset or empty: no Authorization header

    def get(self, path: str) -> dict:
        return self._call("GET", path, None)

    def post(self, path: str, body: dict) -> dict:
        return self._call("POST", path, body)

    def _call(self, method: str, path: str, body: dict | None) -> dict:
        url = self.spec.url + path
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self._key:
            headers["Authorization"] = f"Bearer {self._key}"
        last, status = "", None
        for attempt in range(self.spec.retries + 1):
            if attempt:
                time.sleep(min(0.2 * 2**attempt, 2.0))
            req = urllib.request.Request(url, data=data, headers=headers, method=method)
            try:
                with urllib.request.urlopen(req, timeout=self.spec.timeout) as r:
                    raw = r.read()
                break
            except urllib.error.HTTPError as e:
                last, status = f"HTTP {e.code} {_reason(e)}", e.code
                if e.code < 500 and e.code != 429:
                    raise ServerError(f"{method} {url}: {last}", e.code) from None
            except (urllib.error.URLError, OSError, http.client.HTTPException) as e:  # timeouts, refusals, hang-ups
                why, status = getattr(e, "reason", e), None
                last = "timed out" if isinstance(why, (TimeoutError, socket.timeout)) else f"unreachable ({why})"
                if "timed out" in str(why):
                    last = "timed out"
        else:
            raise ServerError(
                f"{method} {url}: {last} after {self.spec.retries + 1} attempt(s) with a "
                f"{self.spec.timeout:g}s timeout each (engine spec keys timeout=, retries=)",
                status,
            )
        try:
            doc = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise ServerError(f"{method} {url}: the answer is not JSON ({len(raw)} bytes)") from None
        if not isinstance(doc, dict):
            raise ServerError(f"{method} {url}: the answer is a JSON {type(doc).__name__}, not an object")
        return doc


def _reason(e: urllib.error.HTTPError) -> str:
    """The server's own message of an error answer (OpenAI's {"error": {"message"}} or vLLM's), one line, short."""
    try:
        doc = json.loads(e.read() or b"{}")
        msg = doc.get("error", doc.get("message", doc.get("detail", "")))
        msg = msg.get("message", "") if isinstance(msg, dict) else msg
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError, OSError):
        msg = ""
    msg = " ".join(str(msg or e.reason).split())
    return msg[:200] + ("..." if len(msg) > 200 else "")
