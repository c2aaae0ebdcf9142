"""Golden fingerprints: this machine must reproduce the committed hashes of the exact trainer, bit for bit.

Every machine that runs the suite (each developer's, each CI run) is a real-hardware
cross-check of "the same bytes on any x86-64 CPU and thread count": the golden file
was made on one CPU with one thread, this test recomputes it with two threads and
names the first tensor that differs. The emulation test (test_determinism.py) stays:
it covers ISA levels this machine has; this one covers the CPUs we actually run on.
"""

from __future__ import annotations

import ast
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from timbench.fingerprint import CASES, GOLDEN, RUNS, fingerprint, first_difference, load_golden, machine
from timbench.kernels.pointwise import fsqrt

ROOT = Path(__file__).resolve().parents[1]


# ~55 s: CI's `slow` stage runs it, and again after vLLM is installed (stage 4 names this file).
@pytest.mark.slow
def test_this_machine_reproduces_the_golden_fingerprints():
    golden = load_golden()
    assert len(golden) > 100 and sum(k.startswith("run/") for k in golden) == 2 * len(RUNS)
    assert all(any(k.startswith(f"{c}/grad/") for k in golden) for c in CASES)
    got = fingerprint(threads=2)  # the golden file was written with one thread
    diff = first_difference(golden, got)
    assert diff is None, (
        f"{machine()} does not reproduce {GOLDEN.name}; first differing value: {diff}. "
        "Something whose result depends on the CPU reaches training."
    )


def test_first_difference_names_the_earliest_key_in_computation_order():
    want = {"a/forward": "1", "a/grad/w": "2", "a/adamw": "3"}
    assert first_difference(want, dict(want)) is None
    assert first_difference(want, {**want, "a/grad/w": "x", "a/adamw": "y"}) == "a/grad/w: expected 2, got x"
    assert first_difference(want, {"a/forward": "1"}).startswith("a/grad/w: expected 2, got None")
    assert first_difference(want, {**want, "b/new": "4"}) == "b/new: not in the golden file"


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_fsqrt_is_the_correctly_rounded_ieee_sqrt(dtype):
    rng = np.random.default_rng(0)
    # Values over many binades, their neighbours one ulp away, and the special values.
    x = np.concatenate(
        [
            rng.random(200_000) * 10,
            np.exp2(rng.integers(-60, 60, 50_000)) * rng.random(50_000),
            [0.0, -0.0, 1.0, 2.0**-7, np.inf, 2.0 / 7],
        ]
    ).astype(dtype)
    x = np.concatenate([x, np.nextafter(x, dtype(np.inf)), np.nextafter(x, dtype(0))])
    got = fsqrt(torch.from_numpy(x)).numpy()
    if dtype is np.float64:
        want = np.array([math.sqrt(v) for v in x.tolist()])  # C sqrt: IEEE 754 correctly rounded
    else:  # float64 sqrt of a float32, rounded once to float32, is the correctly rounded float32 sqrt
        want = np.array([math.sqrt(v) for v in x.astype(np.float64).tolist()]).astype(np.float32)
    assert got.dtype == dtype and np.array_equal(got.view(np.uint8), want.view(np.uint8))
    assert math.isnan(float(fsqrt(torch.tensor(-1.0, dtype=torch.from_numpy(x).dtype))))


def test_fsqrt_gradient_and_bad_dtype():
    x = torch.tensor([4.0, 9.0, 0.25], requires_grad=True)
    fsqrt(x).sum().backward()
    assert x.grad.tolist() == [0.25, float(np.float32(1) / np.float32(6)), 1.0]
    with pytest.raises(TypeError, match="float32 or float64"):
        fsqrt(torch.tensor([4], dtype=torch.int64))


def test_std_and_clip_use_the_ieee_sqrt():
    """A group of 4/8 successes: its fp32 variance 0.28571430 is one input whose torch.sqrt (MKL VML) is
    not correctly rounded on some CPUs; fstd and the clip norm must give the IEEE value there."""
    from timbench.kernels.reduce import fstd
    from timbench.trainer.optim import clip_grad_norm

    g = torch.tensor([1.0, 1, 1, 1, 0, 0, 0, 0])
    var = float(((g - 0.5) ** 2).sum() / 7)
    assert float(fstd(g)) == float(np.float32(math.sqrt(np.float32(var))))
    p = torch.nn.Parameter(torch.zeros(3))
    p.grad = torch.tensor([0.5, 0.25, 0.125])
    norm = clip_grad_norm([p], 1e-3)
    assert float(norm) == float(np.float32(math.sqrt(0.5**2 + 0.25**2 + 0.125**2)))


# Library routines whose result may depend on the CPU (vendor-dispatched vector math, SIMD-width
# reductions): none may be called on the path from rollout logprobs to the update and its metrics.
FORBIDDEN = {
    "sqrt",
    "rsqrt",
    "exp",
    "exp2",
    "expm1",
    "log",
    "log2",
    "log10",
    "log1p",
    "tanh",
    "sigmoid",
    "softmax",
    "log_softmax",
    "logsumexp",
    "erf",
    "erfinv",
    "sin",
    "cos",
    "std",
    "var",
    "norm",
    "var_mean",
    "std_mean",
    "cumsum",
    "cumprod",
    "logcumsumexp",
}
TRAINING_PATH = [
    "timbench/rl",
    "timbench/trainer",
    "timbench/remedies",
    "timbench/metrics/ratios.py",
    "timbench/metrics/mismatch.py",
    "timbench/metrics/dist.py",
    "timbench/kernels/reduce.py",
    "timbench/kernels/pointwise.py",
    "timbench/kernels/logprobs.py",
    "timbench/kernels/exact_kernels.py",
    "timbench/kernels/noise_ops.py",
    "timbench/kernels/tensor_parallel.py",
    "timbench/quant",
]


# Names whose methods are not torch's: libm via numba, the fixed-order numba kernel modules, a KernelSet.
KERNEL_NAMESPACES = {"math", "np", "numpy", "nb", "nb64", "ng", "exact64", "kernels"}


def _torch_calls(path: Path):
    """(line, name) of every torch.X(...) / tensor.X(...) call whose X is a CPU-dependent routine."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in FORBIDDEN:
            base = node.func.value
            if isinstance(base, ast.Name) and base.id in KERNEL_NAMESPACES:
                continue  # scalar libm / numba kernels / a kernel set's method: the value alone decides the bits
            yield node.lineno, ast.unparse(node.func)


def test_no_cpu_dependent_torch_routine_on_the_training_path():
    files = [f for p in TRAINING_PATH for f in ((ROOT / p).rglob("*.py") if (ROOT / p).is_dir() else [ROOT / p])]
    assert len(files) > 20
    found = [f"{f.relative_to(ROOT)}:{line} {call}" for f in files for line, call in _torch_calls(f)]
    assert not found, "CPU-dependent torch routines on the training path (use fexp/fsqrt/fsum):\n" + "\n".join(found)


def test_the_scan_would_see_torch_sqrt(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import torch\ndef f(x):\n    return x.sqrt() + torch.exp(x) + math.sqrt(2)\n")
    assert sorted(c for _, c in _torch_calls(bad)) == ["torch.exp", "x.sqrt"]


LIBM_PROBE = (
    "import math, random, sys\n"
    "rng = random.Random(0)\n"
    "xs = [rng.uniform(-30.0, 5.0) for _ in range(100000)]\n"
    "sys.stdout.write(' '.join(math.exp(x).hex() for x in xs))\n"
)


def test_in_scope_cpus_share_the_fma_libm_variant():
    """The premise behind the golden file's reach: glibc's exp (called by the softmax and fexp) has an FMA
    variant and an SSE2 one that round differently on a few inputs; every promised CPU runs the FMA one."""
    import os
    import subprocess
    import sys

    isa = machine()["isa"]
    assert {"fma", "avx2"} <= set(isa), (
        f"{machine()['cpu']} lacks FMA/AVX2 ({isa}): glibc's libm runs its SSE2 "
        "variant here, whose exp/log differ from the golden machine's in the last bit"
    )

    def probe(env: dict) -> list[str]:
        return subprocess.run(
            [sys.executable, "-c", LIBM_PROBE], env=os.environ | env, capture_output=True, text=True, check=True
        ).stdout.split()

    host, sse2 = probe({}), probe({"GLIBC_TUNABLES": "glibc.cpu.hwcaps=-AVX2,-FMA,-AVX"})
    assert len(host) == len(sse2) == 100000
    differ = sum(a != b for a, b in zip(host, sse2))
    # The boundary is real (measured: 220 of 300k exp inputs on glibc 2.36); were it 0, glibc's exp would be
    # CPU-independent and test_determinism could emulate the no-FMA floor again.
    assert differ > 0, "glibc's SSE2 and FMA exp now agree on every probe: drop the FMA premise"
