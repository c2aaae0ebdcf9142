"""The trainer's update is bitwise identical under emulated CPUs and thread counts.

Two subprocesses run `determinism_worker.py` (forward + loss + backward + clip
+ AdamW step; dense and MoE checkpoints; fp32 and bf16): one on the host as it
is with one thread, one emulating an older CPU with two threads. The emulation
lowers every library's instruction set at once: PyTorch's ATen dispatch
(ATEN_CPU_CAPABILITY), MKL (MKL_ENABLE_INSTRUCTIONS), oneDNN
(ONEDNN_MAX_CPU_ISA), numba's code generation (NUMBA_CPU_NAME with
NUMBA_CPU_FEATURES empty, i.e. that CPU's own features; a fresh NUMBA_CACHE_DIR
per variant so nothing compiled for the host is reused), the C matmuls' build (TIMBENCH_NATIVE_ISA=generic:
SSE2 code instead of AVX-512 or AVX2 + FMA) and glibc's ifunc
choice (GLIBC_TUNABLES hwcaps, on an AVX-512 host only: see below). Besides two updates per case, each variant runs
the golden fingerprint's short RL runs (`timbench.fingerprint.RUNS`: noise +
remedy + bypass + twin, bf16, MoE with routing replay, NVFP4 with unified
precision) and their metrics.jsonl and eval.jsonl must match byte for byte. The older CPU is AVX2 (Haswell) on an
AVX-512 host, and the no-SIMD floor (x86-64) on an AVX2 host, so the two variants differ
on any machine. The host variant runs the C kernels' best build, forced (TIMBENCH_NATIVE_ISA=avx512 or avx2),
the emulated one the SSE2 build; on an AVX-512 host a third variant emulates the same AVX2 CPU running the
AVX2 build (what a real Haswell runs), so all three builds log the same bytes. Negative controls prove the
emulation bites: the same update with plain PyTorch kernels/AdamW/clipping must change, and so must the machine
code numba generates for the forward matmul.

The AVX2 host's floor keeps glibc's libm as it is. glibc 2.36 picks its exp/log/sin/cos
by ifunc: an FMA+AVX2 build or a plain SSE2 one, and the two round differently on a few inputs
in ten thousand (measured here: exp 220, log 28, cos 203 of 300k). The exact kernels' softmax
and `fexp` call that libm, so a CPU without FMA would log different last bits (it did: the
NVFP4 run's drift/diff_mean at step 0). Every CPU timbench promises bytes on (Intel Xeon, AMD
EPYC, AVX2 or AVX-512) has FMA and AVX2 and so runs the same variant;
tests/test_fingerprint.py pins that premise (host has FMA+AVX2) and shows the boundary.

What emulation cannot cover: a real other microarchitecture's libm or microcode
(the variants share this CPU's instructions below the emulated level), AVX-512
features this host lacks, and libraries that dispatch on the CPU vendor: MKL's
vector math (behind torch.sqrt/exp/log on CPU) ignores MKL_ENABLE_INSTRUCTIONS
on AMD, which is how a non-IEEE torch.sqrt in the GRPO std and the clip norm
passed this test and still split Intel from AMD. Real machines are
checked by tests/test_fingerprint.py against committed golden hashes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from timbench.fingerprint import CASES, RUNS

WORKER = Path(__file__).with_name("determinism_worker.py")
LD_SO = Path("/lib64/ld-linux-x86-64.so.2")
NO_AVX512 = "glibc.cpu.hwcaps=-AVX512F,-AVX512VL,-AVX512BW,-AVX512DQ,-AVX512CD"
EMULATED = {  # host ATen level -> the lower level the second variant emulates
    "AVX512": {
        "ATEN_CPU_CAPABILITY": "avx2",
        "MKL_ENABLE_INSTRUCTIONS": "AVX2",
        "ONEDNN_MAX_CPU_ISA": "AVX2",
        "NUMBA_CPU_NAME": "haswell",
        "NUMBA_CPU_FEATURES": "",
        "GLIBC_TUNABLES": NO_AVX512,
        "TIMBENCH_NATIVE_ISA": "generic",
    },
    "AVX2": {
        "ATEN_CPU_CAPABILITY": "default",
        "MKL_ENABLE_INSTRUCTIONS": "SSE4_2",
        "ONEDNN_MAX_CPU_ISA": "SSE41",
        "NUMBA_CPU_NAME": "x86-64",
        "NUMBA_CPU_FEATURES": "",
        "TIMBENCH_NATIVE_ISA": "generic",
    },
}
HOST_BUILD = {"AVX512": "avx512", "AVX2": "avx2"}  # host ATen level -> the C kernels' build its variant forces
ALL_KEYS = {k for env in EMULATED.values() for k in env} | {
    "NUMBA_CACHE_DIR",
    "NUMBA_NUM_THREADS",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
}


def _run(extra: dict, threads: int, cache: Path, runs: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ALL_KEYS}
    env.update(
        extra,
        NUMBA_CACHE_DIR=str(cache),
        NUMBA_NUM_THREADS=str(threads),
        OMP_NUM_THREADS=str(threads),
        MKL_NUM_THREADS=str(threads),
    )
    proc = subprocess.run(
        [sys.executable, str(WORKER), str(threads), str(runs)], env=env, capture_output=True, text=True, timeout=900
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _hwcaps_active(env: dict) -> str | None:
    """glibc's active hwcaps subdirectory mask under `env` (None where ld.so cannot tell)."""
    if not LD_SO.exists():
        return None
    proc = subprocess.run([str(LD_SO), "--list-diagnostics"], env=os.environ | env, capture_output=True, text=True)
    for line in proc.stdout.splitlines():
        if line.startswith("dl_hwcaps_subdirs_active="):
            return line.split("=", 1)[1]
    return None


# ~110 s on 2 cores (five child interpreters under emulated CPUs): CI runs it in its own `slow` stage (make test-slow).
@pytest.mark.slow
def test_update_is_bitwise_identical_across_emulated_cpus_and_threads(tmp_path):
    host = torch.backends.cpu.get_cpu_capability()
    if host not in EMULATED:
        pytest.skip(f"host ATen capability {host} has no lower level defined here")
    low = EMULATED[host]
    # glibc's tunable really drops the hwcaps level (AVX-512 -> x86-64-v4 is bit 0 of the mask).
    before = _hwcaps_active({})
    after = _hwcaps_active({"GLIBC_TUNABLES": low["GLIBC_TUNABLES"]}) if "GLIBC_TUNABLES" in low else before
    if before is not None and "GLIBC_TUNABLES" in low:
        assert before != after, f"GLIBC_TUNABLES had no effect on ld.so ({before})"

    variants = {"host": ({"TIMBENCH_NATIVE_ISA": HOST_BUILD[host]}, 1), "low": (low, 2)}
    if host == "AVX512":  # the emulated AVX2 CPU with the C kernels' AVX2 build
        variants["avx2"] = (low | {"TIMBENCH_NATIVE_ISA": "avx2"}, 2)
    # Two at a time (the third starts when the 1-thread host variant ends): three at once oversubscribed 2 cores
    # with 5 threads, and OpenMP's spinning barriers stretched the 2-thread variants past the timeout.
    with ThreadPoolExecutor(2) as pool:
        futs = {
            name: pool.submit(_run, env, threads, tmp_path / name, tmp_path / f"runs-{name}")
            for name, (env, threads) in variants.items()
        }
        outs = {name: f.result() for name, f in futs.items()}
    host_out, low_out = outs["host"], outs["low"]

    assert host_out["_env"]["aten_capability"] == host
    assert low_out["_env"]["aten_capability"] == low["ATEN_CPU_CAPABILITY"].upper()
    assert low_out["_env"]["numba_cpu"] == low["NUMBA_CPU_NAME"]
    # Which C build ran in each: the host's best (forced), SSE2, and (AVX-512 host) AVX2.
    assert {name: out["_env"]["native_isa"] for name, out in outs.items()} == {
        name: env["TIMBENCH_NATIVE_ISA"] for name, (env, _) in variants.items()
    }
    for name, (_, threads) in variants.items():
        assert (outs[name]["_env"]["torch_threads"], outs[name]["_env"]["numba_threads"]) == (threads, threads)
    # Negative controls: the emulation changes ordinary kernels' bits ...
    assert host_out["control/torch-update"]["params"] != low_out["control/torch-update"]["params"]
    assert host_out["control/numba-asm"] != low_out["control/numba-asm"]
    assert not low_out["control/numba-asm-zmm"]  # no AVX-512 register in the emulated target's code
    # ... and not the exact trainer's: parameters, loss and grad norm, bit for bit; nor a whole RL run's
    # logged files (metrics.jsonl, eval.jsonl), byte for byte.
    cases = sorted(k for k in host_out if not k.startswith(("_", "control/")))
    assert len(cases) == len(CASES) + len(RUNS) and sum(c.startswith("run/") for c in cases) == len(RUNS)
    for name, out in outs.items():
        for case in cases:
            assert host_out[case] == out[case], f"{case}: {name} variant ({out['_env']['native_isa']} build)"
