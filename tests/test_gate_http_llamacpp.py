"""The HTTP gate against a second server implementation: llama.cpp's, through llama-cpp-python 0.3.16's OpenAI
server, started as users start it on an F32 GGUF of the shipped tiny dense checkpoint, gated with `--trainer hf=`
the same checkpoint (`make test-llamacpp`, which builds the server's venv and the GGUF first:
bench/gates/llamacpp_gate.sh --setup-only).

The server lives in its own venv (build/venv-llamacpp, or TIMBENCH_LLAMACPP_PYTHON), not timbench's: this file is
skipped when that venv cannot import llama_cpp.server or the GGUF is missing, unless TIMBENCH_REQUIRE_LLAMACPP=1
(make test-llamacpp), where that fails instead. The server runs on 127.0.0.1, a free port and a generated key
(API_KEY in its environment), and is torn down whatever happens.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
from procgroup import stop_group

ROOT = Path(__file__).resolve().parents[1]
PYTHON = Path(os.environ.get("TIMBENCH_LLAMACPP_PYTHON", ROOT / "build/venv-llamacpp/bin/python"))
GGUF = ROOT / "build/llamacpp/add-4d-v1-tiny-dense-f32.gguf"


def _unavailable() -> str | None:
    if not PYTHON.is_file():
        return f"no llama-cpp-python venv at {PYTHON} (make test-llamacpp builds it)"
    r = subprocess.run([str(PYTHON), "-c", "import llama_cpp.server"], capture_output=True, text=True)
    if r.returncode:
        return f"{PYTHON} cannot import llama_cpp.server: {(r.stderr.strip().splitlines() or ['?'])[-1]}"
    if not GGUF.is_file():
        return f"no GGUF at {GGUF} (bash bench/gates/llamacpp_gate.sh --setup-only converts it)"
    return None


if (why := _unavailable()) is not None:
    if os.environ.get("TIMBENCH_REQUIRE_LLAMACPP") == "1":
        pytest.fail(f"TIMBENCH_REQUIRE_LLAMACPP=1 but {why}", pytrace=False)
    pytest.skip(why, allow_module_level=True)

from timbench.cli import main  # noqa: E402 - after the skip: the module is skipped before timbench loads
from timbench.util.shipped import default_checkpoint  # noqa: E402

pytestmark = pytest.mark.llamacpp
START_S = 300


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _post(url, key, body) -> dict:
    req = urllib.request.Request(
        url + "/v1/completions",
        json.dumps(body).encode(),
        {"Content-Type": "application/json", "Authorization": f"Bearer {key}"},
    )
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.load(r)


@contextlib.contextmanager
def _serve(logs: Path, *flags: str):
    port, key = _free_port(), secrets.token_hex(16)
    log = logs / "server.log"
    cmd = [str(PYTHON), "-m", "llama_cpp.server", "--model", str(GGUF), "--host", "127.0.0.1", "--port", str(port)]
    with log.open("w") as out:
        proc = subprocess.Popen(
            [*cmd, "--n_ctx", "256", *flags],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "API_KEY": key},
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_S
        while True:  # no /health: ready when /v1/models answers
            if proc.poll() is not None:
                pytest.fail(f"the llama.cpp server exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
            try:
                req = urllib.request.Request(url + "/v1/models", headers={"Authorization": f"Bearer {key}"})
                with urllib.request.urlopen(req, timeout=5):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail(f"the llama.cpp server did not answer within {START_S}s:\n{log.read_text()[-3000:]}")
                time.sleep(1)
        yield url, key
    finally:
        stop_group(proc)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with _serve(tmp_path_factory.mktemp("llamacpp")) as s:
        yield s


def test_gate_llama_cpp_python_with_the_hf_trainer(server, tmp_path, capsys, monkeypatch):
    """What the gate finds on llama-cpp-python 0.3.16 (docs/gate-your-stack.md, "Second server: llama.cpp")."""
    url, key = server
    monkeypatch.setenv("OPENAI_API_KEY", key)
    ckpt = default_checkpoint("add-4d-v1", "tiny-dense")
    rc = main(
        ["gate", "run", "--engine", f"openai={url}", "--trainer", f"hf={ckpt}", "--suite", "smoke"]
        + ["--out", str(tmp_path)]
    )
    out = capsys.readouterr()
    assert rc == 1, out.out + out.err
    assert "text: prompts as text (token-id prompts refused); tokens as text, each naming one id" in out.err
    assert key not in out.out + out.err + (tmp_path / "gate.json").read_text()
    doc = json.loads((tmp_path / "gate.json").read_text())
    rows = {r["probe"]: r for r in doc["probes"]}
    assert not any(r["error"] for r in rows.values()), rows
    # its logprobs are a log-softmax of the raw logits (temperature not applied), of the full distribution at top_p
    sem = rows["logprob_semantics"]["numbers"]
    assert not rows["logprob_semantics"]["passed"] and sem["fits"] == "raw" and sem["top_p_fits"] == "full"
    # F32 weights but an F16 KV cache by default: near the trainer's raw logprobs, not equal to them
    assert 1e-6 < sem["mean_abs_diff_raw"] < 1e-3 < 1e-2 < sem["mean_abs_diff_processed"]
    # echo's prompt logprobs are shifted by one position (a prompt without a leading BOS): far from decode's
    assert not rows["prefill_vs_decode"]["passed"] and rows["prefill_vs_decode"]["numbers"]["max_abs_diff"] > 1.0
    assert not rows["sampling_semantics"]["passed"]
    a = rows["alignment"]["numbers"]  # within the smoke bound, most of it the raw-vs-tempered gap
    assert rows["alignment"]["passed"] and 1e-2 < a["mean_abs_diff"] < 0.1 and a["argmax_flips"] == 0
    assert "lists none of" in rows["weight_sync"]["not_tested"] and not rows["weight_sync"]["passed"]
    offers = doc["identity"]["offers"]
    assert offers["prompt_text"] and offers["token_text"] and not offers["token_ids"] and not offers["tokenize"]
    assert (doc["identity"]["engine_package"], doc["identity"]["engine_version"]) == ("me", "not reported")


def test_echo_logprobs_are_shifted_by_one(server):
    """The echoed logprob of the last prompt token is the next (generated) token's: llama-cpp-python pairs echoed
    token k with the logits that predict token k + 1 when the prompt does not start with BOS."""
    url, key = server
    body = {"prompt": "12+34=", "max_tokens": 1, "logprobs": 1, "temperature": 0.0}
    decode = _post(url, key, body)["choices"][0]["logprobs"]
    echo = _post(url, key, {**body, "echo": True})["choices"][0]["logprobs"]
    token, lp = decode["tokens"][0], decode["token_logprobs"][0]
    assert echo["tokens"] == list("12+34=")  # the prompt echoed, not the generated token
    assert echo["top_logprobs"][-1][token] == pytest.approx(lp, abs=1e-6)  # under "=": the answer's logprob
    assert abs(echo["token_logprobs"][-1] - lp) > 1.0  # "=" scored by the distribution that predicts the answer
