"""The C matmuls (timbench.kernels.native) give the numba kernels' bits, on every build and any thread count.

The numba loops are the specification (k ascending from zero, mul + add in the forward, one FMA per
step in the backward); the C register tiles are only faster. Every shape class the driver treats
differently is here: ragged rows (m % 4, m % 6), ragged columns (n % 16 with and without a second
vector), k past one chunk (KC = 256), packed (m >= 2048) and in-place W, fewer row blocks than
threads, empty dimensions, and the special values (NaN, inf, -0.0, subnormals). Each test runs every build
(AVX-512, AVX2 + FMA, SSE2); a build this CPU cannot run is skipped, with the reason.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys

import numba
import numpy as np
import pytest
import torch

from timbench.kernels import native
from timbench.kernels import numba_grad as ng
from timbench.kernels import numba_ops as nb

pytestmark = pytest.mark.skipif(native.library() is None, reason="no gcc here: numba serves (nothing to compare)")

SHAPES = [
    (1, 1, 1),
    (1, 128, 128),
    (3, 7, 5),
    (5, 300, 40),
    (13, 37, 21),
    (64, 128, 99),
    (6, 16, 16),
    (7, 600, 33),
    (257, 129, 8),
    (2048, 64, 17),
    (2100, 40, 48),
]


def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).view(np.uint32)


HOST = native.library().host_isa if native.library() else -1  # the best build this CPU runs (native.ISAS)
ISA = pytest.mark.parametrize(
    "isa",
    [
        pytest.param(i, id=name, marks=pytest.mark.skipif(i > HOST, reason=f"this CPU lacks {native.ISA_NEEDS[name]}"))
        for i, name in enumerate(native.ISAS)
    ],
)


def _with(isa: int, threads: int, fn, *args):
    lib = native.library()
    old_isa, old_threads = lib.isa, numba.get_num_threads()
    lib.isa = isa
    numba.set_num_threads(threads)
    try:
        return fn(*args)
    finally:
        lib.isa = old_isa
        numba.set_num_threads(old_threads)


@ISA
@pytest.mark.parametrize("m,k,n", SHAPES)
def test_native_matmuls_equal_the_numba_kernels_bit_for_bit(m, k, n, isa):
    rng = np.random.default_rng(m * 1000 + k * 10 + n)
    x = rng.standard_normal((m, k), dtype=np.float32)
    wt = rng.standard_normal((k, n), dtype=np.float32)
    g = rng.standard_normal((m, n), dtype=np.float32)
    w = np.ascontiguousarray(wt.T)  # [n, k]: dX = g @ w
    want = (nb.matmul(x, wt), ng.matmul_fma(g, w), ng.matmul_tn(g, x))
    for threads in sorted({1, numba.config.NUMBA_NUM_THREADS}):
        got = (
            _with(isa, threads, native.matmul, x, wt),
            _with(isa, threads, native.matmul_fma, g, w),
            _with(isa, threads, native.matmul_tn, g, x),
        )
        for name, a, b in zip(("matmul", "matmul_fma", "matmul_tn"), want, got):
            assert a.shape == b.shape, name
            assert np.array_equal(_bits(a), _bits(b)), f"{name} isa={isa} threads={threads}"


@ISA
@pytest.mark.parametrize("rows", [[1], [5, 2100, 1, 13], [7, 64]])
def test_grouped_matmuls_equal_one_call_per_segment(rows, isa):
    # Segments of any size (one row; one past the packing threshold), each with its own weight.
    rng = np.random.default_rng(len(rows))
    k, n = 40, 35
    starts = np.cumsum([0, *rows]).tolist()
    x = rng.standard_normal((starts[-1], k), dtype=np.float32)
    g = rng.standard_normal((starts[-1], n), dtype=np.float32)
    wts = [rng.standard_normal((k, n), dtype=np.float32) for _ in rows]
    ws = [np.ascontiguousarray(w.T) for w in wts]
    segs = list(zip(starts[:-1], starts[1:]))
    want_fwd = np.concatenate([nb.matmul(x[a:b], w) for (a, b), w in zip(segs, wts)])
    want_dx = np.concatenate([ng.matmul_fma(g[a:b], w) for (a, b), w in zip(segs, ws)])
    want_dw = [ng.matmul_tn(g[a:b], x[a:b]) for a, b in segs]
    for threads in sorted({1, numba.config.NUMBA_NUM_THREADS}):
        fwd = _with(isa, threads, native.matmul_grouped, x, wts, starts, False)
        dx = _with(isa, threads, native.matmul_grouped, g, ws, starts, True)
        dw = _with(isa, threads, native.matmul_tn_grouped, g, x, starts)
        assert np.array_equal(_bits(fwd), _bits(want_fwd)), f"forward isa={isa} threads={threads}"
        assert np.array_equal(_bits(dx), _bits(want_dx)), f"dX isa={isa} threads={threads}"
        assert len(dw) == len(rows)
        for a, b in zip(dw, want_dw):
            assert np.array_equal(_bits(a), _bits(b)), f"dW isa={isa} threads={threads}"


@ISA
def test_special_values_propagate_as_in_numba(isa):
    rng = np.random.default_rng(7)
    x = rng.standard_normal((2100, 40), dtype=np.float32)
    wt = rng.standard_normal((40, 35), dtype=np.float32)
    x[0, 3], x[5, 0], x[9, 9], x[11, 1] = np.nan, np.inf, -0.0, np.float32(1e-42)  # 1e-42: subnormal
    wt[2, 4], wt[7, 34] = -np.inf, np.float32(3e38)
    x[100] = np.float32(-0.0)  # a whole row of -0.0: 0 + (-0 * w) must stay +0 as in numba
    assert np.array_equal(_bits(nb.matmul(x, wt)), _bits(_with(isa, 2, native.matmul, x, wt)))
    g = np.ascontiguousarray(x[:, :35])
    assert np.array_equal(_bits(ng.matmul_tn(g, x)), _bits(_with(isa, 2, native.matmul_tn, g, x)))


def test_non_contiguous_and_float64_inputs_are_converted_not_misread():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((40, 30), dtype=np.float32)
    wt = rng.standard_normal((20, 30), dtype=np.float32).T  # a transposed view: not C-contiguous
    assert np.array_equal(native.matmul(x, wt), nb.matmul(x, np.ascontiguousarray(wt)))
    assert np.array_equal(native.matmul(x.astype(np.float64), wt), nb.matmul(x, np.ascontiguousarray(wt)))


def test_empty_dimensions():
    x = np.zeros((0, 5), np.float32)
    assert native.matmul(x, np.ones((5, 3), np.float32)).shape == (0, 3)
    out = native.matmul(np.ones((4, 0), np.float32), np.ones((0, 3), np.float32))
    assert out.shape == (4, 3) and not out.any()  # an empty sum is +0.0


def test_the_build_is_cached_and_a_broken_source_names_gcc(tmp_path, monkeypatch):
    monkeypatch.setenv("TIMBENCH_CACHE_DIR", str(tmp_path))
    bad = tmp_path / "bad.c"
    bad.write_text("int f( { return 0; }\n")
    with pytest.raises(RuntimeError, match="gcc failed on bad.c"):
        native.build((bad,))
    assert not list((tmp_path / "native").glob("*.so*"))  # no half-built library left behind
    so = native.build()
    assert so.parent == tmp_path / "native" and so.is_file()
    assert native.build() == so  # cached: the same path, not rebuilt


def _child(env: dict, code: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code], env=os.environ | env, capture_output=True, text=True, timeout=300
    )


def test_switches_numba_fallback_and_each_build():
    code = "from timbench.kernels import native; print(native.isa())"
    assert _child({"TIMBENCH_NATIVE": "0"}, code).stdout.strip() == "numba"
    assert _child({}, code).stdout.strip() == native.ISAS[HOST]  # auto: the best build this CPU runs
    for name in native.ISAS[: HOST + 1]:
        assert _child({"TIMBENCH_NATIVE_ISA": name}, code).stdout.strip() == name
    bad = _child({"TIMBENCH_NATIVE_ISA": "avx9"}, code)
    assert bad.returncode != 0 and "TIMBENCH_NATIVE_ISA='avx9'; valid: auto, avx512, avx2, generic" in bad.stderr
    # No gcc on PATH and nothing cached: a warning, then numba serves, with the same bits.
    same = (
        "import hashlib, numpy as np\nr = np.random.default_rng(0)\n"
        "q, k = r.standard_normal((2, 9, 4, 8), dtype=np.float32), r.standard_normal((2, 9, 2, 8), dtype=np.float32)\n"
        "o, p = native.attend_causal(q, k, k, 0.3, True)\n"
        "g = native.attend_causal_bwd(q, k, k, q, p, 0.3)\n"
        "x = r.standard_normal((9, 5), dtype=np.float32)\n"
        "print(hashlib.sha256(b''.join(a.tobytes() for a in (o, *g, native.matmul(x, x.T.copy()), "
        "native.matmul_fma(x, x.T.copy()), native.matmul_tn(x, x)))).hexdigest())"
    )
    no_gcc = _child(
        {"PATH": "/nonexistent", "TIMBENCH_CACHE_DIR": "/nonexistent/cache"},
        "import warnings; warnings.simplefilter('always')\n" + code + "\n" + same,
    )
    assert no_gcc.stdout.split()[0] == "numba" and "native matmuls unavailable" in no_gcc.stderr
    assert no_gcc.stdout.split()[1] == _child({}, code + "\n" + same).stdout.split()[1]


def test_a_build_this_cpu_cannot_run_is_refused_in_one_line():
    assert [native.pick_isa(w, 2) for w in ("auto", "avx512", "avx2", "generic")] == [2, 2, 1, 0]
    assert native.pick_isa("auto", 0) == 0
    with pytest.raises(
        ValueError,
        match=r"^TIMBENCH_NATIVE_ISA='avx512': this CPU lacks avx512f; it runs avx2, "
        r"generic$",
    ):
        native.pick_isa("avx512", 1)
    with pytest.raises(ValueError, match=r"^TIMBENCH_NATIVE_ISA='avx2': this CPU lacks avx2 \+ fma; it runs generic$"):
        native.pick_isa("avx2", 0)
    if HOST < 2:  # the real thing, where this CPU has no AVX-512
        bad = _child({"TIMBENCH_NATIVE_ISA": "avx512"}, "from timbench.kernels import native; native.library()")
        assert bad.returncode != 0 and "this CPU lacks avx512f" in bad.stderr


def _specials(rng, shape, nan: bool) -> np.ndarray:
    """Normal values with -0.0, subnormals, huge values and (with `nan`) NaN, +-inf sprinkled in."""
    a = rng.standard_normal(shape, dtype=np.float32)
    flat = a.reshape(-1)
    picks = rng.choice(flat.size, size=min(flat.size, 24), replace=False)
    vals = [-0.0, 1e-42, -3e-41, 1e-39, 3e38, -2e38] + ([np.nan, np.inf, -np.inf] if nan else [])
    flat[picks] = np.resize(np.array(vals, np.float32), picks.size)
    return a


# Ragged against every tile: m % 4, % 6, % 8, % 12; n % 16 and % 32 (1, 15, 17, 31, 33); k past KC = 256.
RAGGED = [(1, 3, 1), (5, 17, 15), (7, 260, 17), (11, 31, 31), (13, 9, 33), (25, 300, 47), (2053, 19, 49)]


def _bits_nan(a: np.ndarray) -> np.ndarray:
    """The bits, with every NaN as the one quiet NaN: which NaN's sign and payload a sum of two NaNs keeps is the
    x86 rule "the first operand's", and compilers (gcc here, LLVM in numba) order a commutative add freely. Measured
    on 5x17x15 below: numba and SSE2 keep the product's NaN (0x7fc00000), the AVX2 and AVX-512 builds the sum's
    (0xffc00000, from inf - inf). Every other bit, and where the NaNs are, is pinned."""
    bits = _bits(a).copy()
    bits[np.isnan(a)] = 0x7FC00000
    return bits


def test_every_build_gives_the_same_bits_as_each_other_and_numba():
    """The three builds (those this CPU runs) and numba, on ragged shapes with NaN/inf/-0/subnormals, 1 and 2
    threads: every matmul and the causal attention, forward and backward, one set of bits (NaNs: `_bits_nan`)."""
    assert HOST == len(native.ISAS) - 1 or not _avx512_cpu(), "an AVX-512 CPU must run the AVX-512 build"
    rng = np.random.default_rng(43)
    nans = 0
    for m, k, n in RAGGED:
        x, wt, g = _specials(rng, (m, k), True), _specials(rng, (k, n), True), _specials(rng, (m, n), True)
        w = np.ascontiguousarray(wt.T)
        want = [_bits_nan(a) for a in (nb.matmul(x, wt), ng.matmul_fma(g, w), ng.matmul_tn(g, x))]
        nans += sum(int((a == 0x7FC00000).sum()) for a in want)
        for isa in range(HOST + 1):
            for threads in (1, 2):
                got = [
                    _bits_nan(_with(isa, threads, f, *a))
                    for f, a in ((native.matmul, (x, wt)), (native.matmul_fma, (g, w)), (native.matmul_tn, (g, x)))
                ]
                for name, a, c in zip(("matmul", "matmul_fma", "matmul_tn"), want, got):
                    assert np.array_equal(a, c), f"{name} {m}x{k}x{n} {native.ISAS[isa]} threads={threads}"
    assert nans > 100  # the special values did reach the outputs
    # Attention: -0, subnormals and huge values (an inf or NaN would make whole rows NaN and hide the rest).
    for b, t, h, hk, d in [(2, 37, 4, 2, 32), (1, 49, 2, 1, 20), (3, 5, 4, 4, 40)]:
        q, kk, v, dout = (
            _specials(rng, s, False) * np.float32(0.1)
            for s in ((b, t, h, d), (b, t, hk, d), (b, t, hk, d), (b, t, h, d))
        )
        scale = 1 / math.sqrt(d)
        with_numba = _with(0, 1, _attention_numba, q, kk, v, dout, scale)
        for isa in range(HOST + 1):
            for threads in (1, 2):
                o, p = _with(isa, threads, native.attend_causal, q, kk, v, scale, True)
                got = (o, *_with(isa, threads, native.attend_causal_bwd, q, kk, v, dout, p, scale))
                for name, a, c in zip(("out", "dq", "dk", "dv"), with_numba, got):
                    assert np.array_equal(_bits(a), _bits(c)), f"attention {name} {native.ISAS[isa]} t={threads}"


def _avx512_cpu() -> bool:
    flags = next((line.split(":", 1)[1].split() for line in open("/proc/cpuinfo") if line.startswith("flags")), [])
    return "avx512f" in flags


def _attention_numba(q, k, v, dout, scale):
    b, t, h, d = q.shape
    probs = np.zeros((b * t, h, t), np.float32)
    out = nb.attend(
        q.reshape(b * t, h, d), k, v, np.repeat(np.arange(b), t), np.tile(np.arange(1, t + 1), b), scale, probs
    ).reshape(b, t, h, d)
    return (out, *ng.attend_causal_bwd(q, k, v, dout, probs.reshape(b, t, h, t), scale))


def test_kept_intermediates_do_not_change_the_forward_and_match_their_definitions():
    rng = np.random.default_rng(11)
    b, t, h, hk, d = 3, 9, 4, 2, 8
    q = rng.standard_normal((b * t, h, d), dtype=np.float32)
    k = rng.standard_normal((b, t, hk, d), dtype=np.float32)
    v = rng.standard_normal((b, t, hk, d), dtype=np.float32)
    slots = np.repeat(np.arange(b), t)
    nkeys = np.tile(np.arange(1, t + 1), b)
    probs = np.full((b * t, h, t), np.nan, np.float32)
    scale = 1 / math.sqrt(d)
    out = nb.attend(q, k, v, slots, nkeys, scale, probs)
    assert np.array_equal(_bits(out), _bits(nb.attend(q, k, v, slots, nkeys, scale, nb.NO_PROBS)))
    kk = np.repeat(k, h // hk, axis=2)[slots, :, :, :]  # [N, T, H, D]
    ref = torch.softmax(
        torch.einsum("nhd,nthd->nht", torch.from_numpy(q), torch.from_numpy(kk)).double() * scale
        + torch.where(torch.arange(t)[None, None] < torch.from_numpy(nkeys)[:, None, None], 0.0, -math.inf),
        dim=-1,
    )
    for n in range(b * t):
        assert np.allclose(probs[n, :, : nkeys[n]], ref[n, :, : nkeys[n]].numpy(), atol=1e-6)
    x = rng.standard_normal((5, 16), dtype=np.float32)
    r = np.full(5, np.nan, np.float32)
    w = rng.standard_normal(16, dtype=np.float32)
    assert np.array_equal(nb.rmsnorm(x, w, 1e-6, r), nb.rmsnorm(x, w, 1e-6, nb.NO_ROWS))
    assert np.allclose(r, 1 / np.sqrt((x.astype(np.float64) ** 2).mean(1) + 1e-6), rtol=1e-6)
    s = np.full((5, 16), np.nan, np.float32)
    assert np.array_equal(nb.silu_mul(x, w[None] * x, s), nb.silu_mul(x, w[None] * x, nb.NO_ELEMS))
    assert np.allclose(s, 1 / (1 + np.exp(-x.astype(np.float64))), rtol=1e-6)


@ISA
@pytest.mark.parametrize(
    "b,t,h,hk,d,mult",
    [
        (3, 38, 4, 2, 32, 1.0),
        (2, 70, 4, 2, 32, 3.0),
        (2, 33, 4, 2, 24, 1.0),
        (2, 40, 2, 1, 17, 10.0),
        (1, 1, 2, 1, 8, 1.0),
        (3, 17, 4, 4, 36, 2.0),
    ],
)
def test_native_causal_attention_equals_the_numba_kernels_bit_for_bit(b, t, h, hk, d, mult, isa):
    """Forward (output and kept probabilities) and backward (dq, dk, dv) against `attend` / `attend_causal_bwd`:
    key blocks of 4, 2 and 1 vectors (8 or 16 keys; dp: 4 or 8 doubles), j blocks of 4 vectors (backward) or 1
    (forward) with scalar tails (d = 17, 24, 36)."""
    rng = np.random.default_rng(b * 100 + t)
    q = rng.standard_normal((b, t, h, d), dtype=np.float32) * np.float32(mult)
    k = rng.standard_normal((b, t, hk, d), dtype=np.float32) * np.float32(mult)
    v = rng.standard_normal((b, t, hk, d), dtype=np.float32)
    dout = rng.standard_normal((b, t, h, d), dtype=np.float32)
    scale = 1 / math.sqrt(d)
    probs = np.zeros((b * t, h, t), np.float32)
    out = nb.attend(
        q.reshape(b * t, h, d), k, v, np.repeat(np.arange(b), t), np.tile(np.arange(1, t + 1), b), scale, probs
    ).reshape(b, t, h, d)
    probs = probs.reshape(b, t, h, t)
    grads = ng.attend_causal_bwd(q, k, v, dout, probs, scale)
    seen = np.tril(np.ones((t, t), bool))[None, :, None, :].repeat(b, 0).repeat(h, 2)  # keys 0..i of query i
    for threads in sorted({1, numba.config.NUMBA_NUM_THREADS}):
        o, p = _with(isa, threads, native.attend_causal, q, k, v, scale, True)
        assert np.array_equal(_bits(o), _bits(out)) and np.array_equal(_bits(p)[seen], _bits(probs)[seen])
        assert _with(isa, threads, native.attend_causal, q, k, v, scale, False)[1] is None
        got = _with(isa, threads, native.attend_causal_bwd, q, k, v, dout, p, scale)
        for name, a, c in zip(("dq", "dk", "dv"), grads, got):
            assert np.array_equal(_bits(a), _bits(c)), f"{name} isa={isa} threads={threads}"
