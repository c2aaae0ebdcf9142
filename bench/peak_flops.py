"""How far each matmul kernel runs from this machine's limit: GFLOP/s of the main shapes against a measured peak.

    python bench/peak_flops.py [--threads 2] [--out results/bench/peak_flops]

The peak is a microbenchmark, the best plain loop this file can write in numba: per thread, independent
accumulator chains over a register-resident block (no memory traffic), once as fused multiply-add
(fastmath, so LLVM contracts to FMA: the ceiling of MKL's sgemm) and once as a separate multiply and add
(no fastmath: the arithmetic the exact forward is allowed, since an unfused mul+add rounds twice and FMA
once). The matmul rows are the tiny-dense shapes of one trainer mini-batch (256 sequences x 28 tokens =
7,168 rows): the exact forward `matmul` (mul+add, k ascending), the backward's `matmul_fma` (dX) and
`matmul_tn` (dW), and torch's `F.linear` (MKL). Medians of --repeats calls after one warm-up.
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
from numba import njit, prange

LANES = 128  # accumulators per thread: 16 AVX2 vectors of 8 fp32, enough independent chains to hide latency
ITERS = 200_000


@njit(parallel=True, fastmath=True, cache=True)
def _fma_loop(acc, a, b, iters):
    for t in prange(acc.shape[0]):
        row = acc[t]
        for _ in range(iters):
            for j in range(LANES):
                row[j] = row[j] * a + b
    return acc


@njit(parallel=True, fastmath=False, cache=True)
def _muladd_loop(acc, a, b, iters):
    for t in prange(acc.shape[0]):
        row = acc[t]
        for _ in range(iters):
            for j in range(LANES):
                row[j] = row[j] * a + b
    return acc


def peak(threads: int, fn) -> float:
    acc = np.ones((threads, LANES), dtype=np.float32)
    a, b = np.float32(0.999999), np.float32(1e-7)
    fn(acc, a, b, 10)
    best = 0.0
    for _ in range(5):
        t0 = time.perf_counter()
        fn(acc, a, b, ITERS)
        best = max(best, 2.0 * threads * LANES * ITERS / (time.perf_counter() - t0) / 1e9)
    return best


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
    from timbench.kernels import numba_grad as ng
    from timbench.kernels.numba_ops import matmul
    from timbench.threads import set_threads
    set_threads(args.threads)
    peaks = {"fma": peak(args.threads, _fma_loop), "mul+add": peak(args.threads, _muladd_loop)}
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
        res = {"exact fwd matmul (mul+add)": timed(matmul, x, wt, repeats=args.repeats),
               "exact bwd matmul_fma (dX)": timed(ng.matmul_fma, g, w, repeats=args.repeats),
               "exact bwd matmul_tn (dW)": timed(ng.matmul_tn, g, x, repeats=args.repeats),
               "torch F.linear (MKL, FMA)": timed(torch.nn.functional.linear, tx, tw, repeats=args.repeats)}
        for kernel, s in res.items():
            rows.append({"shape": f"{m}x{k} @ {k}x{n}", "what": what, "kernel": kernel, "ms": s * 1e3,
                         "gflops": fl / s / 1e9})
    info = machine() | {"threads": args.threads}
    cmd = f"python bench/peak_flops.py --threads {args.threads} --out {args.out}"
    lines = ["# Matmul GFLOP/s against this machine's measured peak", "",
             f"`{cmd}` on {info['cpu']} ({', '.join(info['isa'])}), {args.threads} threads. Peak (register-resident "
             f"loop, {LANES} fp32 accumulators per thread): FMA {peaks['fma']:.0f} GFLOP/s, separate mul+add "
             f"{peaks['mul+add']:.0f} GFLOP/s. The exact forward may only use mul+add (its bytes must not depend "
             "on FMA contraction); the backward's fused steps use FMA explicitly.", "",
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
