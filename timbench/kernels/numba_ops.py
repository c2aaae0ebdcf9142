"""Fixed-order fp32 CPU kernels (numba), the arithmetic core of the `exact` kernel set.

Every output row is produced by one loop nest whose floating-point operations
run in an order fixed by the row's own data and the tensor widths (K, N, D, V),
never by the number of rows, their order, or which other rows share the call.
Rows are split across threads with `prange`, which changes who computes a row,
not how. No fastmath: LLVM may then neither reassociate reductions nor contract
mul+add into FMA, and transcendental calls stay scalar libm calls (no SVML), so
a value never depends on whether it landed in a vector body or a loop tail.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

_JIT = dict(parallel=True, cache=True, fastmath=False, error_model="numpy", nogil=True)


@njit(**_JIT)
def matmul(x, wt):
    """out[i, j] = sum_k x[i, k] * wt[k, j], k ascending. x: [M, K], wt: [K, N] (transposed weight).

    Rows go in blocks of four that share each load of wt[k]; a block's rows and
    the leftover rows run the same per-element sequence (acc += a * w, k
    ascending), so blocking changes speed, not bits.
    """
    m, kdim = x.shape
    n = wt.shape[1]
    out = np.zeros((m, n), dtype=np.float32)
    for b in prange((m + 3) // 4):
        i0 = b * 4
        if i0 + 4 <= m:
            r0 = out[i0]
            r1 = out[i0 + 1]
            r2 = out[i0 + 2]
            r3 = out[i0 + 3]
            for k in range(kdim):
                a0 = x[i0, k]
                a1 = x[i0 + 1, k]
                a2 = x[i0 + 2, k]
                a3 = x[i0 + 3, k]
                wk = wt[k]
                # j innermost: SIMD across output columns, each column's sum still k-ordered.
                for j in range(n):
                    w = wk[j]
                    r0[j] += a0 * w
                    r1[j] += a1 * w
                    r2[j] += a2 * w
                    r3[j] += a3 * w
        else:
            for i in range(i0, m):
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
    out = np.empty((m, d), dtype=np.float32)
    for i in prange(m):
        ss = np.float32(0.0)
        for j in range(d):
            ss += x[i, j] * x[i, j]
        r = np.float32(1.0) / np.float32(math.sqrt(ss / np.float32(d) + eps))
        for j in range(d):
            out[i, j] = (x[i, j] * r) * w[j]
    return out


@njit(**_JIT)
def silu_mul(g, u):
    """silu(g) * u = g * sigmoid(g) * u, elementwise over [M, N]."""
    m, n = g.shape
    out = np.empty((m, n), dtype=np.float32)
    for i in prange(m):
        for j in range(n):
            a = g[i, j]
            out[i, j] = (a * (np.float32(1.0) / (np.float32(1.0) + np.float32(math.exp(-a))))) * u[i, j]
    return out


@njit(**_JIT)
def log_softmax(x):
    """Row-wise x - logsumexp(x); the sum of exp runs left to right."""
    m, v = x.shape
    out = np.empty((m, v), dtype=np.float32)
    for i in prange(m):
        mx = x[i, 0]
        for j in range(1, v):
            if x[i, j] > mx:
                mx = x[i, j]
        s = np.float32(0.0)
        for j in range(v):
            s += np.float32(math.exp(x[i, j] - mx))
        lse = mx + np.float32(math.log(s))
        for j in range(v):
            out[i, j] = x[i, j] - lse
    return out


@njit(**_JIT)
def softmax(x):
    """Row-wise softmax, left-to-right sum."""
    m, v = x.shape
    out = np.empty((m, v), dtype=np.float32)
    for i in prange(m):
        mx = x[i, 0]
        for j in range(1, v):
            if x[i, j] > mx:
                mx = x[i, j]
        s = np.float32(0.0)
        for j in range(v):
            e = np.float32(math.exp(x[i, j] - mx))
            out[i, j] = e
            s += e
        for j in range(v):
            out[i, j] = out[i, j] / s
    return out


@njit(**_JIT)
def attend(q, kc, vc, slot, nkeys, scale):
    """Attention of each query row against keys 0..nkeys[n]-1 of cache slot slot[n].

    q: [N, H, D]; kc, vc: [S, T, Hkv, D]. Keys are walked by absolute position,
    the same order in prefill (keys from this forward) and decode (keys from the
    cache): the kernel cannot tell the two apart. Two-pass softmax as HF eager:
    p_j = exp(s_j - max) / sum, then sum_j p_j v_j.
    """
    n_q, n_h, d = q.shape
    n_kv = kc.shape[2]
    group = n_h // n_kv
    out = np.zeros((n_q, n_h, d), dtype=np.float32)
    for idx in prange(n_q * n_h):
        n = idx // n_h
        h = idx % n_h
        g = h // group
        s_ = slot[n]
        t_len = nkeys[n]
        scores = np.empty(t_len, dtype=np.float32)
        mx = np.float32(-np.inf)
        for t in range(t_len):
            acc = np.float32(0.0)
            for j in range(d):
                acc += q[n, h, j] * kc[s_, t, g, j]
            acc = acc * scale
            scores[t] = acc
            if acc > mx:
                mx = acc
        tot = np.float32(0.0)
        for t in range(t_len):
            e = np.float32(math.exp(scores[t] - mx))
            scores[t] = e
            tot += e
        o = out[n, h]
        for t in range(t_len):
            p = scores[t] / tot
            for j in range(d):
                o[j] += p * vc[s_, t, g, j]
    return out


@njit(cache=True, nogil=True)
def _mix64(z):
    # splitmix64 finaliser: a counter-based hash, so noise is a pure function of its key.
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


@njit(parallel=True, cache=True, nogil=True)
def keyed_uniform(seed, stream, req, pos, width):
    """U(0,1) float64 noise of shape [len(req), width], a pure function of (seed, stream, req, pos, column)."""
    n = req.shape[0]
    out = np.empty((n, width), dtype=np.float64)
    golden = np.uint64(0x9E3779B97F4A7C15)
    for i in prange(n):
        base = _mix64(np.uint64(seed) * golden + np.uint64(stream))
        base = _mix64(base ^ (np.uint64(req[i]) * golden))
        base = _mix64(base ^ (np.uint64(pos[i]) + golden))
        for j in range(width):
            z = _mix64(base + np.uint64(j) * golden)
            # 53 random bits, shifted off 0 so log(u) is finite.
            out[i, j] = (np.float64(z >> np.uint64(11)) + 0.5) * (1.0 / 9007199254740992.0)
    return out


@njit(parallel=True, cache=True, nogil=True)
def keyed_gumbel(seed, stream, req, pos, width):
    """Standard Gumbel noise -log(-log(u)) with u from `keyed_uniform`, scalar libm logs."""
    u = keyed_uniform(seed, stream, req, pos, width)
    n = u.shape[0]
    for i in prange(n):
        for j in range(width):
            u[i, j] = -math.log(-math.log(u[i, j]))
    return u


@njit(parallel=True, cache=True, nogil=True)
def top_p_logprobs(lp, top_p):
    """Nucleus filter per row: keep the fewest most-likely tokens whose mass reaches top_p, renormalise.

    Probabilities, their sort (stable: ties by id) and the running mass are all
    per-row scalar float64 work, so a row's nucleus never depends on its batch.
    """
    m, v = lp.shape
    out = np.empty((m, v), dtype=np.float32)
    for i in prange(m):
        p = np.empty(v, dtype=np.float64)
        for j in range(v):
            p[j] = math.exp(np.float64(lp[i, j]))
        order = np.argsort(-p, kind="mergesort")
        keep = np.zeros(v, dtype=np.bool_)
        cum = 0.0
        mass = 0.0
        for r in range(v):
            j = order[r]
            if cum < top_p:
                keep[j] = True
                mass += p[j]
            cum += p[j]
        lm = np.float32(math.log(mass))
        for j in range(v):
            out[i, j] = lp[i, j] - lm if keep[j] else -np.inf
    return out
