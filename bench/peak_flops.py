"""How far each matmul kernel runs from this machine's limit: GFLOP/s of the main shapes against a measured peak.

    python bench/peak_flops.py [--threads 2] [--out results/bench/peak_flops]

The peak is a microbenchmark, the best loop this file can write: intrinsics in C (compiled with gcc at first
use), per thread 12 independent accumulator chains held in registers (no memory traffic), for each vector ISA
this CPU has (SSE2: 4 lanes, AVX2: 8, AVX-512: 16), once as fused multiply-add (the ceiling of MKL's sgemm)
and once as a separate multiply and add (the arithmetic the exact forward is allowed: an unfused mul+add
rounds twice, FMA once, and the forward's bytes must not depend on which). The matmul rows are the tiny-dense
shapes of one trainer mini-batch (256 sequences x 28 tokens = 7,168 rows): the exact forward matmul (mul+add,
k ascending), the backward's dX and dW (FMA), each as the C register tile (`timbench.kernels.native`) of every
build this CPU runs (AVX-512, AVX2 + FMA, SSE2: the same bits) and as the numba loop they replaced (the same
bits), and torch's `F.linear` (MKL). Each row's percentages: of its own ISA's peak (C tiles) and of the
machine's (the best ISA's). Medians of --repeats calls after one warm-up.
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
/* 12 independent chains per thread, all in registers: enough to cover the mul+add latency (6-8 cycles) at
   2 multiplies + 2 adds per cycle, and the FMA latency (4) at 2 FMAs per cycle. Returns GFLOP/s. One body per
   ISA: V the vector type, L its lanes, P the intrinsics' prefix, ATTR the target. */
#define PEAK(NAME, V, L, SET1, MUL, ADD, FMA_, STORE, ATTR)                                                 \
  ATTR double NAME(long iters, int threads, int fused) {                                                  \
    float sink = 0.0f;                                                                                    \
    double t0 = omp_get_wtime();                                                                          \
    _Pragma("omp parallel num_threads(threads) reduction(+:sink)")                                        \
    {                                                                                                     \
      V a = SET1(0.999999f), b = SET1(1e-7f);                                                             \
      V x0 = SET1(1.0f), x1 = SET1(2.0f), x2 = SET1(3.0f), x3 = SET1(4.0f), x4 = SET1(5.0f);              \
      V x5 = SET1(6.0f), x6 = SET1(7.0f), x7 = SET1(8.0f), x8 = SET1(9.0f), x9 = SET1(10.0f);             \
      V x10 = SET1(11.0f), x11 = SET1(12.0f);                                                             \
      if (fused) {                                                                                        \
        for (long n = 0; n < iters; n++) {                                                                \
          x0 = FMA_(x0, a, b); x1 = FMA_(x1, a, b); x2 = FMA_(x2, a, b); x3 = FMA_(x3, a, b);             \
          x4 = FMA_(x4, a, b); x5 = FMA_(x5, a, b); x6 = FMA_(x6, a, b); x7 = FMA_(x7, a, b);             \
          x8 = FMA_(x8, a, b); x9 = FMA_(x9, a, b); x10 = FMA_(x10, a, b); x11 = FMA_(x11, a, b);         \
        }                                                                                                 \
      } else {                                                                                            \
        for (long n = 0; n < iters; n++) {                                                                \
          x0 = ADD(MUL(x0, a), b); x1 = ADD(MUL(x1, a), b); x2 = ADD(MUL(x2, a), b);                      \
          x3 = ADD(MUL(x3, a), b); x4 = ADD(MUL(x4, a), b); x5 = ADD(MUL(x5, a), b);                      \
          x6 = ADD(MUL(x6, a), b); x7 = ADD(MUL(x7, a), b); x8 = ADD(MUL(x8, a), b);                      \
          x9 = ADD(MUL(x9, a), b); x10 = ADD(MUL(x10, a), b); x11 = ADD(MUL(x11, a), b);                  \
        }                                                                                                 \
      }                                                                                                   \
      float out[L];                                                                                       \
      V xs[12] = {x0, x1, x2, x3, x4, x5, x6, x7, x8, x9, x10, x11};                                      \
      for (int i = 0; i < 12; i++) { STORE(out, xs[i]); for (int k = 0; k < L; k++) sink += out[k]; }     \
    }                                                                                                     \
    double s = omp_get_wtime() - t0;                                                                      \
    return sink == 12345.0f ? 0.0 : 2.0 * 12 * L * (double)iters * threads / s / 1e9;                     \
  }
/* SSE2 has no FMA: its "fused" loop is the mul+add one (the SSE2 build's FMA steps call libm's fmaf). */
#define SSE_FMA(x, a, b) _mm_add_ps(_mm_mul_ps(x, a), b)
PEAK(peak_sse2, __m128, 4, _mm_set1_ps, _mm_mul_ps, _mm_add_ps, SSE_FMA, _mm_storeu_ps, )
PEAK(peak_avx2, __m256, 8, _mm256_set1_ps, _mm256_mul_ps, _mm256_add_ps, _mm256_fmadd_ps, _mm256_storeu_ps,
     __attribute__((target("avx2,fma"))))
PEAK(peak_avx512, __m512, 16, _mm512_set1_ps, _mm512_mul_ps, _mm512_add_ps, _mm512_fmadd_ps, _mm512_storeu_ps,
     __attribute__((target("avx512f"))))
"""
PEAK_ISAS = {"generic": "peak_sse2", "avx2": "peak_avx2", "avx512": "peak_avx512"}  # native.ISAS -> its loop


def peak_lib():
    """The peak loops compiled with gcc (each ISA's loop under its target attribute) into build/, loaded."""
    import ctypes
    import hashlib
    import subprocess

    build = Path("build/bench")
    build.mkdir(parents=True, exist_ok=True)
    # -ffp-contract=off: gcc would otherwise fuse the mul+add loop's _mm*_mul_ps + _mm*_add_ps into FMAs (it did,
    # before: the "mul+add" peak was the FMA one), as it would the exact forward's.
    flags = ["-O2", "-ffp-contract=off", "-fopenmp", "-shared", "-fPIC"]
    so = build / f"peak_{hashlib.sha256((PEAK_C + ' '.join(flags)).encode()).hexdigest()[:12]}.so"
    if not so.is_file():
        src = so.with_suffix(".c")
        src.write_text(PEAK_C)
        try:
            subprocess.run(["gcc", *flags, str(src), "-o", str(so)], check=True, capture_output=True, text=True)
        except (OSError, subprocess.CalledProcessError) as e:
            raise SystemExit(f"peak_flops: cannot compile the peak loop with gcc ({e}); install gcc") from None
    lib = ctypes.CDLL(str(so))
    for name in PEAK_ISAS.values():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = ctypes.c_double, [ctypes.c_long, ctypes.c_int, ctypes.c_int]
    return lib


def peak(isa: str, threads: int, fused: bool) -> float:
    """GFLOP/s of `isa`'s loop (a native.ISAS name; only one this CPU runs): the best of five runs."""
    fn = getattr(peak_lib(), PEAK_ISAS[isa])
    fn(1000, threads, int(fused))
    return max(fn(20_000_000, threads, int(fused)) for _ in range(5))


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
    from timbench.util.threads import set_threads

    set_threads(args.threads)
    lib = native.library()
    builds = list(native.ISAS[: lib.host_isa + 1])[::-1] if lib else []  # best first
    default = lib.isa if lib else None
    best = builds[0] if builds else ("avx2" if "avx2" in machine()["isa"] else "generic")
    peaks = {
        isa: {"fma": peak(isa, args.threads, True), "mul+add": peak(isa, args.threads, False)}
        for isa in (builds or [best])
    }
    rng = np.random.default_rng(0)
    rows = []
    m = 256 * 28
    for k, n, what in [
        (128, 128, "q/o proj"),
        (128, 64, "k/v proj"),
        (128, 256, "gate/up"),
        (256, 128, "down"),
        (128, 99, "lm head"),
    ]:
        x = rng.standard_normal((m, k), dtype=np.float32)
        wt = rng.standard_normal((k, n), dtype=np.float32)
        g = rng.standard_normal((m, n), dtype=np.float32)
        w = np.ascontiguousarray(wt.T)
        fl = 2.0 * m * k * n
        tx, tw = torch.from_numpy(x), torch.from_numpy(w)
        res = []  # (kernel, its ISA or None, step, seconds)
        for step, c_fn, numba_fn, a in (
            ("fwd", native.matmul, matmul, (x, wt)),
            ("dX", native.matmul_fma, ng.matmul_fma, (g, w)),
            ("dW", native.matmul_tn, ng.matmul_tn, (g, x)),
        ):
            op = "mul+add" if step == "fwd" else "FMA"
            for isa in builds:
                lib.isa = native.ISAS.index(isa)
                res.append((f"exact {step}, C tile {isa} ({op})", isa, op, timed(c_fn, *a, repeats=args.repeats)))
            if lib:
                lib.isa = default
            res.append((f"exact {step}, numba loop ({op})", None, op, timed(numba_fn, *a, repeats=args.repeats)))
        res.append(
            ("torch F.linear (MKL, FMA)", None, "FMA", timed(torch.nn.functional.linear, tx, tw, repeats=args.repeats))
        )
        for kernel, isa, op, s in res:
            rows.append(
                {
                    "shape": f"{m}x{k} @ {k}x{n}",
                    "what": what,
                    "kernel": kernel,
                    "isa": isa,
                    "op": op,
                    "ms": s * 1e3,
                    "gflops": fl / s / 1e9,
                }
            )
    info = machine() | {"threads": args.threads}
    cmd = f"python bench/peak_flops.py --threads {args.threads} --out {args.out}"
    lanes = {"generic": "4 (SSE2)", "avx2": "8 (AVX2)", "avx512": "16 (AVX-512)"}
    peak_text = "; ".join(f"{lanes[i]}: FMA {p['fma']:.0f}, mul+add {p['mul+add']:.0f}" for i, p in peaks.items())
    lines = [
        "# Matmul GFLOP/s against this machine's measured peak",
        "",
        f"`{cmd}` on {info['cpu']} ({', '.join(info['isa'])}), {args.threads} threads. Peak GFLOP/s "
        f"(register-resident loop, 12 fp32 chains per thread, lanes per vector) {peak_text}; SSE2 has no FMA "
        f"(its build's FMA steps call libm's fmaf). The exact forward may only use mul+add (its bytes must "
        f"not depend on FMA contraction); the backward's fused steps use FMA explicitly. Native builds this "
        f"CPU runs: {', '.join(builds) or 'none (numba)'} (default {native.isa()}); every build gives the "
        f'same bits. "% of ISA": of the C tile\'s own ISA\'s peak; "% of machine": of the best ISA\'s '
        f"({best}).",
        "",
        "| shape | layer | kernel | ms | GFLOP/s | % of ISA | % of machine |",
        "|---|---|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        key = "mul+add" if r["op"] == "mul+add" else "fma"
        own = f"{100 * r['gflops'] / peaks[r['isa']][key]:.0f}%" if r["isa"] else ""
        lines.append(
            f"| {r['shape']} | {r['what']} | {r['kernel']} | {r['ms']:.1f} | {r['gflops']:.0f} | {own} | "
            f"{100 * r['gflops'] / peaks[best][key]:.0f}% |"
        )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    out.with_suffix(".json").write_text(
        json.dumps({"command": cmd, "machine": info, "peak_gflops": peaks, "rows": rows}, indent=1) + "\n"
    )
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
