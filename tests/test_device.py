"""The engine spec's `device` key: what it accepts, the one-line errors, and that device=cpu changes no byte."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import torch

from timbench.engine import Request, SamplingParams, make_engine
from timbench.engine.device import describe, resolve_device
from timbench.gate.shapes import load_model
from timbench.spec.keys import SpecError, parse_spec

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    "text, needle",
    [
        ("kernels=torch,device=tpu", "invalid value 'tpu' for device; valid: cpu|cuda|cuda:N"),
        ("kernels=torch,device=cpu:0", "invalid value 'cpu:0' for device"),
        ("kernels=torch,device=cuda:x", "invalid value 'cuda:x' for device"),
        ("device=cuda", "device=cuda needs kernels=torch"),
        ("kernels=torch,device=cuda,weight_quant=fp8", "weight_quant=fp8 is host-only"),
        ("kernels=torch,device=cuda,noise=gaussian:0.1", "noise=gaussian:0.1 is host-only"),
    ],
)
def test_bad_device_specs_are_one_line_errors(text, needle):
    with pytest.raises(SpecError) as e:
        parse_spec(text, "engine spec", side="engine")
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_device_is_an_engine_key_and_cpu_prints_as_before():
    with pytest.raises(SpecError, match="engine-only key"):
        parse_spec("kernels=torch,device=cuda", "trainer spec", side="trainer")
    spec = parse_spec("kernels=torch,device=cpu", side="engine")
    assert spec == parse_spec("kernels=torch", side="engine") and str(spec) == "kernels=torch,dtype=fp32"
    assert str(parse_spec("kernels=torch,dtype=bf16,device=cuda:1")) == "kernels=torch,dtype=bf16,device=cuda:1"


def test_cuda_without_a_gpu_is_a_one_line_error(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match=r"device=cuda but this torch .* sees no CUDA device; valid here: device=cpu"):
        resolve_device("cuda")
    assert resolve_device("cpu") == torch.device("cpu") and describe(torch.device("cpu")) == {}


@pytest.mark.parametrize("model", ["tiny-dense", "tiny-moe"])
def test_explicit_cpu_device_changes_no_byte(model):
    """The device plumbing (tensors made on the engine's device, logprobs brought to the host) is the identity on
    the CPU: generate and teacher-forced scoring give the same bits as before the key existed."""
    m = load_model(model)
    params = SamplingParams(temperature=0.8, seed=3)
    reqs = [Request(list(range(1, 2 + i)), 5, i) for i in range(4)]
    outs = []
    for spec in ("kernels=torch", "kernels=torch,device=cpu"):
        engine = make_engine(m.config, spec, max_num_seqs=8, weights=m)
        comps = engine.generate(reqs, params)
        scores = engine.score([(c.prompt_ids, c.token_ids) for c in comps], params)
        outs.append((comps, scores))
    (a, sa), (b, sb) = outs
    for x, y in zip(a, b):
        assert x.token_ids == y.token_ids and torch.equal(x.logprobs, y.logprobs)
        assert (x.routing is None) == (y.routing is None) and (x.routing is None or torch.equal(x.routing, y.routing))
    assert all(torch.equal(x, y) for x, y in zip(sa.logprobs, sb.logprobs))


def test_gate_identity_on_cpu_has_no_accelerator_entry():
    from timbench.gate.run import identity
    from timbench.gate.suite import load_suite

    ident = identity(parse_spec("kernels=torch", side="engine"), load_suite("smoke"))
    assert "accelerator" not in ident and ident["engine_spec"] == "kernels=torch,dtype=fp32"


def test_gpu_gate_script_parses():
    """bench/device/gpu_gate.sh runs only where a GPU is lent; here at least bash must accept it."""
    r = subprocess.run(["bash", "-n", str(ROOT / "bench/device/gpu_gate.sh")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_gpu_gate_script_runs_only_the_steps_asked_for(tmp_path):
    """STEPS=http on a venv without vLLM: no engine or fingerprint row, the HTTP step skipped with the reason,
    no server left behind (the script exits 0 with only the runs.tsv header)."""
    import os
    import sys

    out = tmp_path / "dry"
    env = {**os.environ, "DEVICE": "cpu", "SUITES": "smoke", "DTYPES": "fp32", "STEPS": "http"}
    env.update(PYTHON=sys.executable, HTTP_VENV=str(tmp_path / "no-venv"))
    r = subprocess.run(
        ["bash", str(ROOT / "bench/device/gpu_gate.sh"), str(out)], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr
    assert (out / "runs.tsv").read_text() == "step\texit\tseconds\n"
    assert "HTTP: skipped: no vLLM" in (out / "http.txt").read_text()
    assert "vLLM: skipped" in (out / "vllm.txt").read_text()
