"""Fixed-order backward kernels (numba) for the `exact` kernel set: gradients whose bits no CPU can change.

Each kernel mirrors a forward in `numba_ops` and obeys the same rules: every
output element is one loop nest in an order fixed by the tensor widths and its
own data (reductions over rows run in ascending row order, over columns in
ascending column order), rows or columns are split across threads with
`prange` (which changes who computes an element, not how), no fastmath (so no
implicit FMA contraction and no reassociation: FMA only where written), and
transcendentals are scalar libm calls. PyTorch/MKL/oneDNN instead pick SIMD widths and blockings per CPU, which
is why the trainer's update used to differ by ~1e-7 between machines.

Inputs are fp32 (the caller widens bf16/fp16 exactly). Matmul gradients
accumulate in fp32 in the forward's order, each step an explicit fused
multiply-add (`fma32`: one rounding, the same bits on every CPU, twice the
throughput of the forward's unfused mul + add); the row reductions of
the normalisations and softmaxes accumulate in float64 and round once to fp32.
The caller rounds each fp32 gradient once to its input's dtype.
"""

from __future__ import annotations

import math

import llvmlite.ir as llvm_ir
import numpy as np
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

_JIT = dict(parallel=True, cache=True, fastmath=False, error_model="numpy", nogil=True)


@intrinsic
def fma32(typingctx, a, b, c):
    """fp32 a * b + c with one rounding (llvm.fma.f32): an FMA instruction where the CPU has one
    (every AVX2/AVX-512 x86-64), a correctly rounded libm fmaf call otherwise; the same bits either way."""
    sig = types.float32(types.float32, types.float32, types.float32)

    def codegen(context, builder, signature, args):
        f32 = llvm_ir.FloatType()
        fn = cgutils.get_or_insert_function(builder.module, llvm_ir.FunctionType(f32, [f32, f32, f32]), "llvm.fma.f32")
        return builder.call(fn, args)

    return sig, codegen


_CHUNK = 16  # columns per task in column-parallel reductions: one 64-byte cache line of fp32


@njit(**_JIT)
def matmul_fma(x, wt):
    """out[i, j] = sum_k x[i, k] * wt[k, j], k ascending, acc = fma(x, w, acc) in fp32: dX = dY W.

    The forward's loop (`numba_ops.matmul`: rows in fours, k in fours, j innermost) with each
    step fused, one rounding instead of two: a different but equally fixed sequence, and twice
    the arithmetic per instruction (the unfused loop is bound by mul + add issue). Forward bits
    are untouched; only gradients use it.
    """
    m, kdim = x.shape
    n = wt.shape[1]
    out = np.zeros((m, n), dtype=np.float32)
    k4 = kdim - kdim % 4
    for b in prange((m + 3) // 4):
        i0 = b * 4
        if i0 + 4 <= m:
            r0 = out[i0]
            r1 = out[i0 + 1]
            r2 = out[i0 + 2]
            r3 = out[i0 + 3]
            for k in range(0, k4, 4):
                a00, a01, a02, a03 = x[i0, k], x[i0, k + 1], x[i0, k + 2], x[i0, k + 3]
                a10, a11, a12, a13 = x[i0 + 1, k], x[i0 + 1, k + 1], x[i0 + 1, k + 2], x[i0 + 1, k + 3]
                a20, a21, a22, a23 = x[i0 + 2, k], x[i0 + 2, k + 1], x[i0 + 2, k + 2], x[i0 + 2, k + 3]
                a30, a31, a32, a33 = x[i0 + 3, k], x[i0 + 3, k + 1], x[i0 + 3, k + 2], x[i0 + 3, k + 3]
                w0 = wt[k]
                w1 = wt[k + 1]
                w2 = wt[k + 2]
                w3 = wt[k + 3]
                for j in range(n):
                    v0, v1, v2, v3 = w0[j], w1[j], w2[j], w3[j]
                    r0[j] = fma32(a03, v3, fma32(a02, v2, fma32(a01, v1, fma32(a00, v0, r0[j]))))
                    r1[j] = fma32(a13, v3, fma32(a12, v2, fma32(a11, v1, fma32(a10, v0, r1[j]))))
                    r2[j] = fma32(a23, v3, fma32(a22, v2, fma32(a21, v1, fma32(a20, v0, r2[j]))))
                    r3[j] = fma32(a33, v3, fma32(a32, v2, fma32(a31, v1, fma32(a30, v0, r3[j]))))
            for k in range(k4, kdim):
                a0 = x[i0, k]
                a1 = x[i0 + 1, k]
                a2 = x[i0 + 2, k]
                a3 = x[i0 + 3, k]
                wk = wt[k]
                for j in range(n):
                    w = wk[j]
                    r0[j] = fma32(a0, w, r0[j])
                    r1[j] = fma32(a1, w, r1[j])
                    r2[j] = fma32(a2, w, r2[j])
                    r3[j] = fma32(a3, w, r3[j])
        else:
            for i in range(i0, m):
                row = out[i]
                for k in range(kdim):
                    a = x[i, k]
                    wk = wt[k]
                    for j in range(n):
                        row[j] = fma32(a, wk[j], row[j])
    return out


@njit(**_JIT)
def matmul_tn(a, b):
    """out[i, j] = sum_m a[m, i] * b[m, j], m ascending, acc = fma(a, b, acc) in fp32: dW = dY^T X.

    a: [M, N], b: [M, K] -> [N, K]: `matmul_fma` applied to a.T, reading a's columns in place.
    """
    mdim, n = a.shape
    k = b.shape[1]
    out = np.zeros((n, k), dtype=np.float32)
    m4 = mdim - mdim % 4
    for blk in prange((n + 3) // 4):
        i0 = blk * 4
        if i0 + 4 <= n:
            r0 = out[i0]
            r1 = out[i0 + 1]
            r2 = out[i0 + 2]
            r3 = out[i0 + 3]
            for m in range(0, m4, 4):
                a00, a01, a02, a03 = a[m, i0], a[m + 1, i0], a[m + 2, i0], a[m + 3, i0]
                a10, a11, a12, a13 = a[m, i0 + 1], a[m + 1, i0 + 1], a[m + 2, i0 + 1], a[m + 3, i0 + 1]
                a20, a21, a22, a23 = a[m, i0 + 2], a[m + 1, i0 + 2], a[m + 2, i0 + 2], a[m + 3, i0 + 2]
                a30, a31, a32, a33 = a[m, i0 + 3], a[m + 1, i0 + 3], a[m + 2, i0 + 3], a[m + 3, i0 + 3]
                b0 = b[m]
                b1 = b[m + 1]
                b2 = b[m + 2]
                b3 = b[m + 3]
                for j in range(k):
                    v0, v1, v2, v3 = b0[j], b1[j], b2[j], b3[j]
                    r0[j] = fma32(a03, v3, fma32(a02, v2, fma32(a01, v1, fma32(a00, v0, r0[j]))))
                    r1[j] = fma32(a13, v3, fma32(a12, v2, fma32(a11, v1, fma32(a10, v0, r1[j]))))
                    r2[j] = fma32(a23, v3, fma32(a22, v2, fma32(a21, v1, fma32(a20, v0, r2[j]))))
                    r3[j] = fma32(a33, v3, fma32(a32, v2, fma32(a31, v1, fma32(a30, v0, r3[j]))))
            for m in range(m4, mdim):
                a0 = a[m, i0]
                a1 = a[m, i0 + 1]
                a2 = a[m, i0 + 2]
                a3 = a[m, i0 + 3]
                bm = b[m]
                for j in range(k):
                    w = bm[j]
                    r0[j] = fma32(a0, w, r0[j])
                    r1[j] = fma32(a1, w, r1[j])
                    r2[j] = fma32(a2, w, r2[j])
                    r3[j] = fma32(a3, w, r3[j])
        else:
            for i in range(i0, n):
                row = out[i]
                for m in range(mdim):
                    am = a[m, i]
                    bm = b[m]
                    for j in range(k):
                        row[j] = fma32(am, bm[j], row[j])
    return out


@njit(**_JIT)
def rmsnorm_bwd(x, w, r, dy, need_dx, need_dw):
    """Gradients of y = (x * r) * w, r = 1 / sqrt(mean(x^2) + eps), as the forward kept it (`numba_ops.rmsnorm`).

    dx_k = r w_k dy_k - x_k r^3 / d * sum_j dy_j w_j x_j (float64 per row, j ascending);
    dw_j = sum_i dy_ij * fp32(x_ij * r_i) (float64, rows ascending). Returns (dx, dw), fp32.
    A row whose fp32 sum of squares overflowed (r = 0) or was NaN gets a NaN dx.
    """
    m, d = x.shape
    dx = np.empty((m, d) if need_dx else (0, d), dtype=np.float32)
    if need_dx:
        for i in prange(m):
            ri = r[i]
            if not ri > 0:
                # The forward's fp32 sum of squares overflowed (r = 0, output zeroed) or was NaN: the gradient
                # is undefined, and NaN (as PyTorch's backward gives) lets the trainer's non-finite check stop.
                # (r > 0 for every finite sum: mean + eps > 0 and its sqrt is finite.)
                for j in range(d):
                    dx[i, j] = np.float32(np.nan)
            else:
                dot = 0.0
                for j in range(d):
                    dot += np.float64(dy[i, j]) * np.float64(w[j]) * np.float64(x[i, j])
                r64 = np.float64(ri)
                coef = r64 * r64 * r64 / d * dot
                for j in range(d):
                    dx[i, j] = np.float32(r64 * (np.float64(w[j]) * np.float64(dy[i, j])) - np.float64(x[i, j]) * coef)
    dw = np.zeros(d if need_dw else 0, dtype=np.float32)
    if need_dw:
        for c in prange((d + _CHUNK - 1) // _CHUNK):
            j0 = c * _CHUNK
            j1 = min(j0 + _CHUNK, d)
            acc = np.zeros(_CHUNK, dtype=np.float64)
            if j1 - j0 == _CHUNK:  # speed only: fixed-width row slices, which LLVM vectorises (2.4x)
                for i in range(m):
                    ri = r[i]
                    xi = x[i, j0 : j0 + _CHUNK]
                    di = dy[i, j0 : j0 + _CHUNK]
                    for jj in range(_CHUNK):
                        acc[jj] += np.float64(di[jj]) * np.float64(xi[jj] * ri)
            else:
                for i in range(m):
                    ri = r[i]
                    for j in range(j0, j1):
                        acc[j - j0] += np.float64(dy[i, j]) * np.float64(x[i, j] * ri)
            for j in range(j0, j1):
                dw[j] = np.float32(acc[j - j0])
    return dx, dw


@njit(**_JIT)
def silu_mul_bwd(g, u, s, dy):
    """Gradients of out = silu(g) * u with the sigmoid s = 1 / (1 + exp(-g)) the forward kept, fp32 elementwise.

    dg = dy * u * (s * (1 + g * (1 - s))), du = dy * (g * s).
    """
    m, n = g.shape
    dg = np.empty((m, n), dtype=np.float32)
    du = np.empty((m, n), dtype=np.float32)
    one = np.float32(1.0)
    for i in prange(m):
        for j in range(n):
            a = g[i, j]
            si = s[i, j]
            dg[i, j] = (dy[i, j] * u[i, j]) * (si * (one + a * (one - si)))
            du[i, j] = dy[i, j] * (a * si)
    return dg, du


@njit(**_JIT)
def log_softmax_bwd(out, dy):
    """dx_j = dy_j - exp(out_j) * sum_k dy_k, from the saved output; float64 per row, k ascending."""
    m, v = out.shape
    dx = np.empty((m, v), dtype=np.float32)
    for i in prange(m):
        s = 0.0
        for j in range(v):
            s += np.float64(dy[i, j])
        for j in range(v):
            dx[i, j] = np.float32(np.float64(dy[i, j]) - math.exp(np.float64(out[i, j])) * s)
    return dx


@njit(**_JIT)
def softmax_bwd(p, dy):
    """dx_j = p_j * (dy_j - sum_k p_k dy_k), from the saved probabilities; float64 per row, k ascending."""
    m, v = p.shape
    dx = np.empty((m, v), dtype=np.float32)
    for i in prange(m):
        s = 0.0
        for j in range(v):
            s += np.float64(p[i, j]) * np.float64(dy[i, j])
        for j in range(v):
            dx[i, j] = np.float32(np.float64(p[i, j]) * (np.float64(dy[i, j]) - s))
    return dx


@njit(**_JIT)
def rowdot(a, b):
    """out[i] = sum_j a[i, j] * b[i, j], float64, j ascending, rounded once to fp32 (a broadcast's gradient)."""
    m, n = a.shape
    out = np.empty(m, dtype=np.float32)
    for i in prange(m):
        s = 0.0
        for j in range(n):
            s += np.float64(a[i, j]) * np.float64(b[i, j])
        out[i] = np.float32(s)
    return out


@njit(**_JIT)
def embedding_bwd(ids, dy, vocab):
    """dW[v] = sum of dy[p] over positions p with ids[p] == v, p ascending (fp32, as an index_put accumulate).

    Columns are split across threads; within a column the positions run in order.
    """
    n, d = dy.shape
    dw = np.zeros((vocab, d), dtype=np.float32)
    for c in prange((d + _CHUNK - 1) // _CHUNK):
        j0 = c * _CHUNK
        j1 = min(j0 + _CHUNK, d)
        for p in range(n):
            row = ids[p]
            for j in range(j0, j1):
                dw[row, j] += dy[p, j]
    return dw


@njit(**_JIT)
def attend_causal_bwd(q, k, v, dout, P, scale):
    """Gradients of causal GQA attention (`numba_ops.attend` with query i of row b against keys 0..i of row b).

    q, dout: [B, T, H, D]; k, v: [B, T, Hkv, D]; P: [B, T, H, T], the probabilities the forward kept
    (`attend`'s probs: what recomputing them here in the forward's order gave, bit for bit, before the
    forward kept them). Pass 1 (one task per row and kv head, queries in turn): dp_t = dout . v_t
    (float64, j ascending), c = sum_t p_t dp_t, ds_t = fp32(p_t (dp_t - c)) (t ascending) and
    dq = scale * sum_t ds_t k_t (float64, t ascending per j). Pass 2 (one task per row and kv head,
    keys in turn) sums dk_t = scale * sum ds_it q_i and dv_t = sum p_it dout_i over queries i >= t
    ascending, and within a query over the group's heads ascending, in float64, rounded once.
    Speed only: dp runs four keys at a time (four independent sums, the same operations as one key
    at a time), and the dq, dk, dv sums are vectorised across j (each j's own order unchanged).
    """
    nb, nt, nh, d = q.shape
    n_kv = k.shape[2]
    group = nh // n_kv
    S = np.empty((nb, nt, nh, nt), dtype=np.float32)
    dq = np.empty((nb, nt, nh, d), dtype=np.float32)
    for idx in prange(nb * n_kv):  # one task per (row, kv head): scratch allocated once per task
        b = idx // n_kv
        g = idx % n_kv
        dp = np.empty(nt, dtype=np.float64)
        acc = np.empty(d, dtype=np.float64)
        kk = k[b, :, g, :]
        vv = v[b, :, g, :]
        for i in range(nt):
            t_len = i + 1
            for hh in range(group):
                h = g * group + hh
                oi = dout[b, i, h, :]
                t = 0
                while t + 4 <= t_len:
                    e0 = 0.0
                    e1 = 0.0
                    e2 = 0.0
                    e3 = 0.0
                    for j in range(d):
                        oj = np.float64(oi[j])
                        e0 += oj * np.float64(vv[t, j])
                        e1 += oj * np.float64(vv[t + 1, j])
                        e2 += oj * np.float64(vv[t + 2, j])
                        e3 += oj * np.float64(vv[t + 3, j])
                    dp[t] = e0
                    dp[t + 1] = e1
                    dp[t + 2] = e2
                    dp[t + 3] = e3
                    t += 4
                while t < t_len:
                    e = 0.0
                    for j in range(d):
                        e += np.float64(oi[j]) * np.float64(vv[t, j])
                    dp[t] = e
                    t += 1
                c = 0.0
                for t in range(t_len):
                    c += np.float64(P[b, i, h, t]) * dp[t]
                for j in range(d):
                    acc[j] = 0.0
                for t in range(t_len):
                    st = np.float32(np.float64(P[b, i, h, t]) * (dp[t] - c))
                    S[b, i, h, t] = st
                    s64 = np.float64(st)
                    for j in range(d):
                        acc[j] += s64 * np.float64(kk[t, j])
                for j in range(d):
                    dq[b, i, h, j] = np.float32(acc[j] * scale)
    dk = np.empty((nb, nt, n_kv, d), dtype=np.float32)
    dv = np.empty((nb, nt, n_kv, d), dtype=np.float32)
    for idx in prange(nb * n_kv):
        b = idx // n_kv
        g = idx % n_kv
        ak = np.empty(d, dtype=np.float64)
        av = np.empty(d, dtype=np.float64)
        for t in range(nt):
            for j in range(d):
                ak[j] = 0.0
                av[j] = 0.0
            for i in range(t, nt):
                for hh in range(group):
                    h = g * group + hh
                    s = np.float64(S[b, i, h, t])
                    p = np.float64(P[b, i, h, t])
                    qi = q[b, i, h, :]
                    oi = dout[b, i, h, :]
                    for j in range(d):
                        ak[j] += s * np.float64(qi[j])
                        av[j] += p * np.float64(oi[j])
            for j in range(d):
                dk[b, t, g, j] = np.float32(ak[j] * scale)
                dv[b, t, g, j] = np.float32(av[j])
    return dq, dk, dv
