"""Fixed-order float64 CPU kernels (numba): the `exact` kernel set's float64 reference path.

The same loop orders as the fp32 kernels in `numba_ops` (sums over k, j, t
ascending, two-pass softmax, HF RMSNorm order), but every value is float64 and
nothing is rounded to fp32 on the way. `timbench diagnose` uses them as the
reference both sides' logprobs are measured against: float64 rounding is ~2^29
times finer than fp32's, so its own error is negligible next to either side's.
Forward only; the fp32 kernels are untouched (a separate module, separate jit cache).
No fastmath, scalar libm exp/log, as in `numba_ops`.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

_JIT = dict(parallel=True, cache=True, fastmath=False, error_model="numpy", nogil=True)


@njit(**_JIT)
def matmul(x, wt):
    """out[i, j] = sum_k x[i, k] * wt[k, j], k ascending. x: [M, K], wt: [K, N], float64."""
    m, kdim = x.shape
    n = wt.shape[1]
    out = np.zeros((m, n), dtype=np.float64)
    for i in prange(m):
        row = out[i]
        for k in range(kdim):
            a = x[i, k]
            wk = wt[k]
            for j in range(n):
                row[j] += a * wk[j]
    return out


@njit(**_JIT)
def rmsnorm(x, w, eps):
    """HF Qwen3RMSNorm order: x * rsqrt(mean(x^2) + eps), then * weight."""
    m, d = x.shape
    out = np.empty((m, d), dtype=np.float64)
    for i in prange(m):
        ss = 0.0
        for j in range(d):
            ss += x[i, j] * x[i, j]
        r = 1.0 / math.sqrt(ss / d + eps)
        for j in range(d):
            out[i, j] = (x[i, j] * r) * w[j]
    return out


@njit(**_JIT)
def silu_mul(g, u):
    """silu(g) * u = g * sigmoid(g) * u, elementwise over [M, N]."""
    m, n = g.shape
    out = np.empty((m, n), dtype=np.float64)
    for i in prange(m):
        for j in range(n):
            a = g[i, j]
            out[i, j] = (a * (1.0 / (1.0 + math.exp(-a)))) * u[i, j]
    return out


@njit(**_JIT)
def log_softmax(x):
    """Row-wise x - logsumexp(x); the sum of exp runs left to right."""
    m, v = x.shape
    out = np.empty((m, v), dtype=np.float64)
    for i in prange(m):
        mx = x[i, 0]
        for j in range(1, v):
            if x[i, j] > mx:
                mx = x[i, j]
        s = 0.0
        for j in range(v):
            s += math.exp(x[i, j] - mx)
        lse = mx + math.log(s)
        for j in range(v):
            out[i, j] = x[i, j] - lse
    return out


@njit(**_JIT)
def softmax(x):
    """Row-wise softmax, left-to-right sum."""
    m, v = x.shape
    out = np.empty((m, v), dtype=np.float64)
    for i in prange(m):
        mx = x[i, 0]
        for j in range(1, v):
            if x[i, j] > mx:
                mx = x[i, j]
        s = 0.0
        for j in range(v):
            e = math.exp(x[i, j] - mx)
            out[i, j] = e
            s += e
        for j in range(v):
            out[i, j] = out[i, j] / s
    return out


@njit(**_JIT)
def attend(q, kc, vc, slot, nkeys, scale):
    """`numba_ops.attend` in float64: q[N,H,D] against keys 0..nkeys[n]-1 of cache slot slot[n].

    Per score s_t = (sum_j q[j] k[t, j], j ascending) * scale; two-pass softmax
    e_t = exp(s_t - max), p_t = e_t / sum_t e_t (t ascending); out[j] = sum_t p_t v[t, j].
    """
    n_q, n_h, d = q.shape
    n_kv = kc.shape[2]
    group = n_h // n_kv
    out = np.zeros((n_q, n_h, d), dtype=np.float64)
    for idx in prange(n_q * n_h):
        n = idx // n_h
        h = idx % n_h
        g = h // group
        s_ = slot[n]
        t_len = nkeys[n]
        sc = np.empty(t_len, dtype=np.float64)
        mx = -np.inf
        for t in range(t_len):
            acc = 0.0
            for j in range(d):
                acc += q[n, h, j] * kc[s_, t, g, j]
            acc = acc * scale
            sc[t] = acc
            if acc > mx:
                mx = acc
        tot = 0.0
        for t in range(t_len):
            e = math.exp(sc[t] - mx)
            sc[t] = e
            tot += e
        for t in range(t_len):
            p = sc[t] / tot
            for j in range(d):
                out[n, h, j] += p * vc[s_, t, g, j]
    return out
