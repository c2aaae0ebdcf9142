"""Fixed-order kernels in C (`native_mm.c`, `native_attn.c`), compiled with gcc at first use; numba where gcc is not.

The three matmuls of every exact linear (forward `matmul`, backward `matmul_fma` for dX and
`matmul_tn` for dW) hold most of an RL step's time. Their numba loops (`numba_ops.matmul`,
`numba_grad.matmul_fma/matmul_tn`) keep the accumulators in memory, a load and a store every four
k-steps, and run at a quarter to a half of this machine's peak; numba's LLVM will not turn the plain
loop into a register tile. The C kernels hold a tile of outputs in vector registers over all of k (AVX2:
4x16 mul + add, 6x16 FMA; AVX-512: 8x32 and 12x32). Every output still runs exactly the numba kernel's sequence,
acc = acc + x[i, k] * w[k, j] (or acc = fma(x, w, acc)) for k ascending from zero, each step an IEEE
fp32 operation, so the two agree bit for bit (tests/test_native.py) and either may serve. The
trainer's causal attention (`attend_causal`, `attend_causal_bwd`) is `numba_ops.attend` and
`numba_grad.attend_causal_bwd` the same way: each sum in its own vector lane, in its own order.

Bits do not depend on the CPU: the same source is compiled three times into one library, for AVX-512
(avx512f, 512-bit vectors), AVX2 + FMA and plain SSE2, and a vector lane is an IEEE operation in each (gcc
with -ffp-contract=off and no fast-math: no contraction, no reassociation; the SSE2 build's FMA is libm's
correctly rounded fmaf; exp is glibc's scalar `exp`, the function numba's math.exp calls). The one thing
not pinned is which NaN a sum of two NaNs keeps (sign and payload): x86 keeps the first operand's, and gcc
and LLVM order a commutative add as they like; where NaNs are, is pinned.
The best build this CPU runs serves; `TIMBENCH_NATIVE_ISA=avx512|avx2|generic` picks one (generic, SSE2: the
determinism test's emulated older CPU; asking for one this CPU cannot run is an error);
`TIMBENCH_NATIVE=0` uses the numba kernels (the before/after benchmarks). The library is cached by
the hash of its sources and flags under $TIMBENCH_CACHE_DIR (default ~/.cache/timbench).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import subprocess
import tempfile
import warnings
from pathlib import Path

import numba
import numpy as np

from . import numba_grad as ng
from . import numba_ops as nb


def no_hugepage_arrays() -> None:
    """Stop numpy from asking for transparent huge pages (madvise MADV_HUGEPAGE) on arrays of 4 MiB and more.

    The exact kernels' outputs and what a forward keeps for its backward are numpy arrays, fresh each call.
    Where the kernel defragments on demand for madvised regions (transparent_hugepage/defrag = madvise, a
    common default), the first touch of such an array stalled for direct compaction: measured 15-22 ms
    inside a 1.8 ms matmul, several times per RL step. Speed only; no value changes.
    """
    try:
        from numpy._core import multiarray  # deferred: optional (may be absent)
    except ImportError:  # numpy 1.x
        from numpy.core import multiarray  # deferred: optional (may be absent)
    setter = getattr(multiarray, "_set_madvise_hugepage", None)
    if setter is not None:
        setter(False)


no_hugepage_arrays()
SOURCES = (Path(__file__).with_name("native_mm.c"), Path(__file__).with_name("native_attn.c"))
CFLAGS = ["-O3", "-ffp-contract=off", "-fno-fast-math", "-fopenmp", "-fPIC", "-shared", "-Wall", "-Wno-psabi"]
# The builds, by native_mm.c's timbench_isa() index (a CPU that runs one runs those before it too), and the CPU
# features each needs.
ISAS = ("generic", "avx2", "avx512")
ISA_NEEDS = {"generic": "sse2", "avx2": "avx2 + fma", "avx512": "avx512f"}
_PACK_ROWS = 2048


def cache_dir() -> Path:
    root = os.environ.get("TIMBENCH_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "timbench"
    )
    return Path(root) / "native"


def build(sources: tuple[Path, ...] = SOURCES) -> Path:
    """The compiled library of `sources` (compiled now unless cached); raises RuntimeError naming the cause."""
    text = b"".join(src.read_bytes() for src in sources)
    key = hashlib.sha256(text + " ".join(CFLAGS).encode()).hexdigest()[:16]
    out = cache_dir() / f"native-{key}.so"
    if out.is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    # Compile to a private name and rename: processes racing to build the same library never see half a file.
    fd, tmp = tempfile.mkstemp(dir=out.parent, suffix=".so.tmp")
    os.close(fd)
    names = ", ".join(src.name for src in sources)
    try:
        proc = subprocess.run(
            ["gcc", *CFLAGS, *map(str, sources), "-o", tmp], capture_output=True, text=True, timeout=300
        )
        if proc.returncode != 0:
            raise RuntimeError(f"gcc failed on {names}: {proc.stderr.strip().splitlines()[-1:]}")
        os.replace(tmp, out)
    except OSError as e:
        raise RuntimeError(f"cannot run gcc to build {names}: {e}") from None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return out


class _Lib:
    """The loaded library and the ISA it runs on this CPU."""

    def __init__(self, path: Path):
        lib = ctypes.CDLL(str(path))
        p, i, l_ = ctypes.c_void_p, ctypes.c_int, ctypes.c_long
        self.mm = lib.timbench_mm
        self.mm.restype = None
        self.mm.argtypes = [p, l_, l_, p, l_, p, l_, l_, l_, l_, i, i, p, i, i]
        d_ = ctypes.c_double
        self.mm_grouped = lib.timbench_mm_grouped
        self.mm_grouped.restype = None
        self.mm_grouped.argtypes = [l_, p, l_, l_, p, l_, p, l_, p, p, l_, i, i, p, p, i]
        self.attn = lib.timbench_attend_causal
        self.attn.restype = None
        self.attn.argtypes = [p, p, p, p, p, l_, l_, l_, l_, l_, d_, i, i, i]
        self.attn_bwd = lib.timbench_attend_causal_bwd
        self.attn_bwd.restype = None
        self.attn_bwd.argtypes = [p, p, p, p, p, p, p, p, p, l_, l_, l_, l_, l_, d_, i, i]
        lib.timbench_isa.restype = i
        lib.timbench_nr.restype, lib.timbench_nr.argtypes = i, [i]
        # host_isa: the best build this CPU runs (an index into ISAS); isa: the build these calls use.
        self.host_isa = host = int(lib.timbench_isa())
        self.nr = [int(lib.timbench_nr(b)) for b in range(len(ISAS))]
        self.isa = pick_isa(os.environ.get("TIMBENCH_NATIVE_ISA", "auto"), host)


def pick_isa(want: str, host: int) -> int:
    """The build TIMBENCH_NATIVE_ISA=`want` names on a CPU whose best build is ISAS[host]; ValueError if none."""
    if want == "auto":
        return host
    if want not in ISAS:
        raise ValueError(f"TIMBENCH_NATIVE_ISA={want!r}; valid: auto, {', '.join(reversed(ISAS))}")
    if ISAS.index(want) > host:
        raise ValueError(
            f"TIMBENCH_NATIVE_ISA={want!r}: this CPU lacks {ISA_NEEDS[want]}; it runs "
            f"{', '.join(reversed(ISAS[: host + 1]))}"
        )
    return ISAS.index(want)


_lib: _Lib | None | bool = None  # None: not tried yet; False: unavailable (numba serves)


def open_library(make, unavailable: str):
    """`make()` (a loaded library) unless `TIMBENCH_NATIVE=0`; False where it cannot be built, with one
    RuntimeWarning: "timbench: " + `unavailable` formatted with the cause as {e}. Callers keep the result (None:
    not tried yet) and fall back to code that gives the same bits."""
    if os.environ.get("TIMBENCH_NATIVE", "1") == "0":
        return False
    try:
        return make()
    except (RuntimeError, OSError) as e:
        warnings.warn("timbench: " + unavailable.format(e=e), RuntimeWarning, stacklevel=3)
        return False


def library() -> _Lib | None:
    """The native library, or None where it is switched off or cannot be built (numba serves, same bits)."""
    global _lib
    if _lib is None:
        _lib = open_library(
            lambda: _Lib(build()),
            "native matmuls unavailable ({e}); using the numba kernels (the same bits, about half the speed)",
        )
    return _lib or None


def isa() -> str:
    """Which code computes the exact matmuls here: 'avx512', 'avx2', 'generic' (SSE2) or 'numba'."""
    lib = library()
    return "numba" if lib is None else ISAS[lib.isa]


def _c32(a: np.ndarray) -> np.ndarray:
    return a if a.flags.c_contiguous and a.dtype == np.float32 else np.ascontiguousarray(a, dtype=np.float32)


def _run(lib: _Lib, x, xr, xk, w, lw, m, kdim, n, fused: bool) -> np.ndarray:
    out = np.empty((m, n), dtype=np.float32)
    # Pack W where enough row blocks reuse each panel to repay the copy and the threads' barrier: measured on
    # the tiny models' shapes (K 128-256, N 64-256), packing lost below ~2,000 rows (decode: 256 rows, 1.5-2x
    # slower) and won above (a training mini-batch, ~4,000+ rows: 1.2-1.35x faster). dW's m is the layer
    # width, so its W (the whole [tokens, K] activation) is always read in place.
    pack = m >= _PACK_ROWS
    nr = lib.nr[lib.isa]  # the tile's columns: the packing scratch comes in panels of nr
    panels = -(-n // nr) if pack else (1 if n % nr else 0)
    pan = np.empty(max(panels * nr * kdim, 1), dtype=np.float32)
    lib.mm(
        x.ctypes.data,
        xr,
        xk,
        w.ctypes.data,
        lw,
        out.ctypes.data,
        n,
        m,
        kdim,
        n,
        int(fused),
        lib.isa,
        pan.ctypes.data,
        int(pack),
        numba.get_num_threads(),
    )
    return out


def _nn(x: np.ndarray, w: np.ndarray, fused: bool) -> np.ndarray:
    """x [M, K] @ w [K, N], k ascending, by the C tile (or the numba kernel with the same bits)."""
    lib = library()
    if lib is None:
        return (ng.matmul_fma if fused else nb.matmul)(x, w)
    x, w = _c32(x), _c32(w)
    (m, k), n = x.shape, w.shape[1]
    return _run(lib, x, k, 1, w, n, m, k, n, fused=fused)


def matmul(x: np.ndarray, wt: np.ndarray) -> np.ndarray:
    """x [M, K] @ wt [K, N], acc = acc + x * w, k ascending: `numba_ops.matmul`'s bits."""
    return _nn(x, wt, fused=False)


def matmul_fma(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """x [M, K] @ w [K, N], acc = fma(x, w, acc), k ascending: `numba_grad.matmul_fma`'s bits (dX = dY W)."""
    return _nn(x, w, fused=True)


def matmul_tn(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a [M, N]^T @ b [M, K], acc = fma, m ascending: `numba_grad.matmul_tn`'s bits (dW = dY^T X)."""
    lib = library()
    if lib is None:
        return ng.matmul_tn(a, b)
    a, b = _c32(a), _c32(b)
    (mdim, n), k = a.shape, b.shape[1]
    return _run(lib, a, 1, n, b, k, n, mdim, k, fused=True)


def _grouped(lib: _Lib, xs, xr, xk, ws, lw, outs, lo, ms, ks, n, fused: bool) -> None:
    """timbench_mm over segments (x, w, out, m, k) in one call; packing decided per segment as `_run` does."""
    nr = lib.nr[lib.isa]
    pan = np.empty(max(-(-n // nr) * nr * max(ks), 1), dtype=np.float32)
    ptrs = [np.array([a.ctypes.data for a in arrs], dtype=np.int64) for arrs in (xs, ws, outs)]
    sizes = [np.array(v, dtype=np.int64) for v in (ms, ks)]
    packs = np.array([m >= _PACK_ROWS for m in ms], dtype=np.int32)
    lib.mm_grouped(
        len(ms),
        ptrs[0].ctypes.data,
        xr,
        xk,
        ptrs[1].ctypes.data,
        lw,
        ptrs[2].ctypes.data,
        lo,
        sizes[0].ctypes.data,
        sizes[1].ctypes.data,
        n,
        int(fused),
        lib.isa,
        pan.ctypes.data,
        packs.ctypes.data,
        numba.get_num_threads(),
    )


def matmul_grouped(x: np.ndarray, ws: list[np.ndarray], starts: list[int], fused: bool) -> np.ndarray:
    """Rows starts[s]:starts[s+1] of x [M, K] times ws[s] [K, N] (every segment non-empty), in one call.

    Each segment's rows get `matmul`'s bits (`matmul_fma`'s with `fused`) for that segment and weight alone.
    """
    x, ws = _c32(x), [_c32(w) for w in ws]
    k, n = x.shape[1], ws[0].shape[1]
    out = np.empty((x.shape[0], n), dtype=np.float32)
    segs = list(zip(starts[:-1], starts[1:], strict=True))
    lib = library()
    if lib is None:
        for (a, b), w in zip(segs, ws, strict=True):
            out[a:b] = (ng.matmul_fma if fused else nb.matmul)(x[a:b], w)
        return out
    rows = [b - a for a, b in segs]
    _grouped(lib, [x[a:] for a, _ in segs], k, 1, ws, n, [out[a:] for a, _ in segs], n, rows, [k] * len(segs), n, fused)
    return out


def matmul_tn_grouped(a: np.ndarray, b: np.ndarray, starts: list[int]) -> list[np.ndarray]:
    """a[rows]^T @ b[rows] for each segment's rows starts[s]:starts[s+1] (non-empty), in one call: `matmul_tn`'s bits.

    a [M, N], b [M, K] -> one [N, K] per segment (dW of each expert, its rows summed ascending).
    """
    a, b = _c32(a), _c32(b)
    n, k = a.shape[1], b.shape[1]
    segs = list(zip(starts[:-1], starts[1:], strict=True))
    lib = library()
    if lib is None:
        return [ng.matmul_tn(a[s:e], b[s:e]) for s, e in segs]
    outs = [np.empty((n, k), dtype=np.float32) for _ in segs]
    rows = [e - s for s, e in segs]
    _grouped(lib, [a[s:] for s, _ in segs], 1, n, [b[s:] for s, _ in segs], k, outs, k, [n] * len(segs), rows, k, True)
    return outs


def attend_causal(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float, keep: bool):
    """Causal GQA attention of q [B, T, H, D] against k, v [B, T, Hkv, D]: (out [B, T, H, D], probs or None).

    `numba_ops.attend`'s bits with query i of row b against keys 0..i of row b; probs [B, T, H, T] (what
    the backward reads; entries past a query's own keys are unset) when `keep`.
    """
    q, k, v = _c32(q), _c32(k), _c32(v)
    b, t, h, d = q.shape
    lib = library()
    if lib is None:
        slots = np.repeat(np.arange(b), t)
        nkeys = np.tile(np.arange(1, t + 1), b)
        probs = np.empty((b * t, h, t), dtype=np.float32) if keep else nb.NO_PROBS
        out = nb.attend(q.reshape(b * t, h, d), k, v, slots, nkeys, scale, probs)
        return out.reshape(b, t, h, d), (probs.reshape(b, t, h, t) if keep else None)
    out = np.empty((b, t, h, d), dtype=np.float32)
    probs = np.empty((b, t, h, t) if keep else (1,), dtype=np.float32)
    lib.attn(
        q.ctypes.data,
        k.ctypes.data,
        v.ctypes.data,
        out.ctypes.data,
        probs.ctypes.data,
        b,
        t,
        h,
        k.shape[2],
        d,
        float(scale),
        int(keep),
        lib.isa,
        numba.get_num_threads(),
    )
    return out, (probs if keep else None)


def attend_causal_bwd(q, k, v, dout, probs, scale: float):
    """(dq, dk, dv) of `attend_causal` from the probabilities it kept: `numba_grad.attend_causal_bwd`'s bits."""
    lib = library()
    if lib is None:
        return ng.attend_causal_bwd(q, k, v, dout, probs, scale)
    q, k, v, dout, probs = _c32(q), _c32(k), _c32(v), _c32(dout), _c32(probs)
    b, t, h, d = q.shape
    kv = k.shape[2]
    dq = np.empty_like(q)
    dk = np.empty((b, t, kv, d), dtype=np.float32)
    dv = np.empty((b, t, kv, d), dtype=np.float32)
    scratch = np.empty((b, t, h, t), dtype=np.float32)
    lib.attn_bwd(
        q.ctypes.data,
        k.ctypes.data,
        v.ctypes.data,
        dout.ctypes.data,
        probs.ctypes.data,
        scratch.ctypes.data,
        dq.ctypes.data,
        dk.ctypes.data,
        dv.ctypes.data,
        b,
        t,
        h,
        kv,
        d,
        float(scale),
        lib.isa,
        numba.get_num_threads(),
    )
    return dq, dk, dv


__all__ = [
    "attend_causal",
    "attend_causal_bwd",
    "build",
    "isa",
    "library",
    "matmul",
    "matmul_fma",
    "matmul_grouped",
    "matmul_tn",
    "matmul_tn_grouped",
]
