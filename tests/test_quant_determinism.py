"""Every quantizer gives the same bits on an emulated older CPU and another thread count.

The quantizers use only IEEE-exact elementwise ops and amax (order-independent), so their bits
cannot depend on the SIMD path ATen picks or on the thread count. This checks it the way
tests/test_determinism.py does for the trainer: a subprocess with ATen's dispatch lowered to
`default` (no SIMD) and two threads must hash every scheme's output the same as the host with one
thread. The inputs are built from torch.randint by exact ops, because torch.randn itself changes
under the emulation. Negative controls, each must change: torch.randn (proves the lowered dispatch
takes effect; measured here, torch 2.13's exp/log/tanh/sum gave the same bits at avx512, avx2 and
default with one thread) and a full-tensor sum (proves the thread count matters).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import torch

WORKER = r"""
import hashlib, json, torch
from timbench.quant import (ACT_QUANT, KV_CACHE, WEIGHT_QUANT, quantize_act, quantize_kv,
                            quantize_weight, round_to_format)
g = torch.Generator().manual_seed(0)
# inputs from integers by exact ops: torch.randn itself is CPU-dependent (vectorized Box-Muller)
def r(*shape):
    a = torch.randint(-2**23, 2**23, shape, generator=g).float() / 2**23
    b = torch.randint(1, 2**12, shape, generator=g).float() / 2**12
    return a * b * b  # heavier tails than uniform, many binades
w = r(300, 520) * 0.05
x = r(37, 520) * (torch.arange(37).float()[:, None] + 1)
kv = r(5, 9, 4, 64) * 600
h = lambda t: hashlib.sha256(t.contiguous().numpy().tobytes()).hexdigest()
out = {f"w/{n}": h(quantize_weight(w, n)) for n in WEIGHT_QUANT}
out.update({f"a/{n}": h(quantize_act(x, n)) for n in ACT_QUANT})
out.update({f"kv/{n}": h(quantize_kv(kv, n)) for n in KV_CACHE})
out.update({f"fmt/{f}": h(round_to_format(x * 100, f)) for f in ("e4m3", "e5m2", "e2m1")})
big = r(64, 4099)
out["control/randn"] = h(torch.randn(1000, generator=g))
out["control/sum"] = h(big.sum())  # one reduction split across threads
print(json.dumps(out))
"""


def _run(env_extra: dict, threads: int) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("ATEN_CPU_CAPABILITY", "OMP_NUM_THREADS")}
    env.update(env_extra, OMP_NUM_THREADS=str(threads))
    proc = subprocess.run([sys.executable, "-c", WORKER], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_quantizers_bitwise_under_emulated_cpu():
    assert torch.backends.cpu.get_cpu_capability() != "DEFAULT", "host runs without SIMD already"
    host = _run({}, 1)
    emulated = _run({"ATEN_CPU_CAPABILITY": "default"}, 2)
    for control in ("control/randn", "control/sum"):
        assert host.pop(control) != emulated.pop(control), f"{control} unchanged: the emulation does not bite"
    differ = [k for k in host if host[k] != emulated[k]]
    assert not differ, differ
