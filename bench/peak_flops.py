"""How far each matmul kernel runs from this machine's limit: GFLOP/s of the main shapes against a measured peak.

    python bench/peak_flops.py [--threads 2] [--out results/bench/peak_flops]

The peak is a microbenchmark, the best loop this file can write: AVX2 intrinsics in C (compiled with gcc
at first use), per thread 12 independent 8-lane accumulator chains held in registers (no memory traffic),
once as fused multiply-add (the ceiling of MKL's sgemm) and once as a separate multiply and add (the
arithmetic the exact forward is allowed: an unfused mul+add rounds twice, FMA once, and the forward's
bytes must not depend on which). The matmul rows are the tiny-dense shapes of one trainer mini-batch (256 sequences x 28 tokens =
7,168 rows): the exact forward matmul (mul+add, k ascending), the backward's dX and dW (FMA), each as the C
register tile that runs (`timbench.kernels.native`) and as the numba loop it replaced (the same bits), and
torch's `F.linear` (MKL). Medians of --repeats calls after one warm-up.
Writes PREFIX.md and PREFIX.json. Measure on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

PEAK_C = r"""
#include <immintrin.h>
#include <omp.h>
/* 12 independent 8-lane chains per thread, all in registers: enough to cover the mul+add latency (6 cycles)
   at 2 multiplies + 2 adds per cycle, and the FMA latency (4) at 2 FMAs per cycle. Returns GFLOP/s. */
#define CHAINS(OP) OP(0) OP(1) OP(2) OP(3) OP(4) OP(5) OP(6) OP(7) OP(8) OP(9) OP(10) OP(11)
double peak(long iters, int threads, int fused) {
  float sink = 0.0f;
  double t0 = omp_get_wtime();
  #pragma omp parallel num_threads(threads) reduction(+:sink)
  {
    __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-7f);
#define INIT(i) __m256 x##i = _mm256_set1_ps(1.0f + i);
    CHAINS(INIT)
    if (fused) {
#define FMA(i) x##i = _mm256_fmadd_ps(x##i, a, b);
      for (long n = 0; n < iters; n++) { CHAINS(FMA) }
    } else {
#define MULADD(i) x##i = _mm256_add_ps(_mm256_mul_ps(x##i, a), b);
      for (long n = 0; n < iters; n++) { CHAINS(MULADD) }
    }
    float out[8];
#define SUM(i) _mm256_storeu_ps(out, x##i); for (int k = 0; k < 8; k++) sink += out[k];
    CHAINS(SUM)
  }
  double s = omp_get_wtime() - t0;
  return sink == 12345.0f ? 0.0 : 2.0 * 12 * 8 * (double)iters * threads / s / 1e9;
}
"""


def peak_lib():
    """The peak loop compiled with gcc (-O2 -mavx2 -mfma -fopenmp) into build/, loaded with ctypes."""
    import ctypes
    import hashlib
    import subprocess
    build = Path("build/bench")
    build.mkdir(parents=True, exist_ok=True)
    so = build / f"peak_{hashlib.sha256(PEAK_C.encode()).hexdigest()[:12]}.so"
    if not so.is_file():
        src = so.with_suffix(".c")
        src.write_text(PEAK_C)
        try:
            subprocess.run(["gcc", "-O2", "-mavx2", "-mfma", "-fopenmp", "-shared", "-fPIC", str(src), "-o", str(so)],
                           check=True, capture_output=True, text=True)
        except (OSError, subprocess.CalledProcessError) as e:
            raise SystemExit(f"peak_flops: cannot compile the peak loop with gcc ({e}); install gcc") from None
    lib = ctypes.CDLL(str(so))
    lib.peak.restype, lib.peak.argtypes = ctypes.c_double, [ctypes.c_long, ctypes.c_int, ctypes.c_int]
    return lib


def peak(threads: int, fused: bool) -> float:
    lib = peak_lib()
    lib.peak(1000, threads, int(fused))
    return max(lib.peak(20_000_000, threads, int(fused)) for _ in range(5))


def timed(fn, *args, repeats: int) -> float:
    fn(*args)
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn(*args)
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2, help="torch and numba threads")
    ap.add_argument("--repeats", type=int, default=7, help="timed calls per kernel and shape")
    ap.add_argument("--out", default="build/bench/peak_flops", help="output prefix (.md and .json)")
    args = ap.parse_args(argv)
    import torch

    from timbench.fingerprint import machine
    from timbench.kernels import native
    from timbench.kernels import numba_grad as ng
    from timbench.kernels.numba_ops import matmul
    from timbench.threads import set_threads
    set_threads(args.threads)
    peaks = {"fma": peak(args.threads, True), "mul+add": peak(args.threads, False)}
    rng = np.random.default_rng(0)
    rows = []
    m = 256 * 28
    for k, n, what in [(128, 128, "q/o proj"), (128, 64, "k/v proj"), (128, 256, "gate/up"), (256, 128, "down"),
                       (128, 99, "lm head")]:
        x = rng.standard_normal((m, k), dtype=np.float32)
        wt = rng.standard_normal((k, n), dtype=np.float32)
        g = rng.standard_normal((m, n), dtype=np.float32)
        w = np.ascontiguousarray(wt.T)
        fl = 2.0 * m * k * n
        tx, tw = torch.from_numpy(x), torch.from_numpy(w)
        res = {"exact fwd, C tile (mul+add)": timed(native.matmul, x, wt, repeats=args.repeats),
               "exact fwd, numba loop (mul+add)": timed(matmul, x, wt, repeats=args.repeats),
               "exact dX, C tile (FMA)": timed(native.matmul_fma, g, w, repeats=args.repeats),
               "exact dX, numba loop (FMA)": timed(ng.matmul_fma, g, w, repeats=args.repeats),
               "exact dW, C tile (FMA)": timed(native.matmul_tn, g, x, repeats=args.repeats),
               "exact dW, numba loop (FMA)": timed(ng.matmul_tn, g, x, repeats=args.repeats),
               "torch F.linear (MKL, FMA)": timed(torch.nn.functional.linear, tx, tw, repeats=args.repeats)}
        for kernel, s in res.items():
            rows.append({"shape": f"{m}x{k} @ {k}x{n}", "what": what, "kernel": kernel, "ms": s * 1e3,
                         "gflops": fl / s / 1e9})
    info = machine() | {"threads": args.threads}
    cmd = f"python bench/peak_flops.py --threads {args.threads} --out {args.out}"
    lines = ["# Matmul GFLOP/s against this machine's measured peak", "",
             f"`{cmd}` on {info['cpu']} ({', '.join(info['isa'])}), {args.threads} threads. Peak (register-resident "
             f"AVX2 loop, 12 x 8 fp32 chains per thread): FMA {peaks['fma']:.0f} GFLOP/s, separate mul+add "
             f"{peaks['mul+add']:.0f} GFLOP/s. The exact forward may only use mul+add (its bytes must not depend "
             f"on FMA contraction); the backward's fused steps use FMA explicitly. Native matmuls: {native.isa()}.",
             "",
             "| shape | layer | kernel | ms | GFLOP/s | % of its peak |", "|---|---|---|---:|---:|---:|"]
    for r in rows:
        ref = peaks["mul+add"] if "mul+add" in r["kernel"] else peaks["fma"]
        lines.append(f"| {r['shape']} | {r['what']} | {r['kernel']} | {r['ms']:.1f} | {r['gflops']:.0f} | "
                     f"{100 * r['gflops'] / ref:.0f}% |")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    out.with_suffix(".json").write_text(json.dumps({"command": cmd, "machine": info, "peak_gflops": peaks,
                                                    "rows": rows}, indent=1) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
