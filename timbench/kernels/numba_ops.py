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

    Every element runs the same sequence, acc = acc + x[i, k] * wt[k, j] for k ascending,
    each product and sum rounded to fp32 (no FMA); the rest is speed only. Rows go in blocks
    of four that share each load of wt[k]; k goes four at a time, so an accumulator is
    loaded and stored once per four steps instead of every step (its four additions still
    run in k order, parenthesised left to right); j is innermost, SIMD across output columns.
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
                    r0[j] = (((r0[j] + a00 * v0) + a01 * v1) + a02 * v2) + a03 * v3
                    r1[j] = (((r1[j] + a10 * v0) + a11 * v1) + a12 * v2) + a13 * v3
                    r2[j] = (((r2[j] + a20 * v0) + a21 * v1) + a22 * v2) + a23 * v3
                    r3[j] = (((r3[j] + a30 * v0) + a31 * v1) + a32 * v2) + a33 * v3
            for k in range(k4, kdim):
                a0 = x[i0, k]
                a1 = x[i0 + 1, k]
                a2 = x[i0 + 2, k]
                a3 = x[i0 + 3, k]
                wk = wt[k]
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
def rmsnorm(x, w, eps, rkeep):
    """HF Qwen3RMSNorm order: x * rsqrt(mean(x^2) + eps), then * weight.

    rkeep: [M] to keep each row's r = 1 / sqrt(mean(x^2) + eps) for the backward, or `NO_ROWS`.
    """
    m, d = x.shape
    out = np.empty((m, d), dtype=np.float32)
    keep = rkeep.shape[0] > 0
    for i in prange(m):
        ss = np.float32(0.0)
        for j in range(d):
            ss += x[i, j] * x[i, j]
        r = np.float32(1.0) / np.float32(math.sqrt(ss / np.float32(d) + eps))
        if keep:
            rkeep[i] = r
        for j in range(d):
            out[i, j] = (x[i, j] * r) * w[j]
    return out


@njit(**_JIT)
def silu_mul(g, u, skeep):
    """silu(g) * u = g * sigmoid(g) * u, elementwise over [M, N].

    skeep: [M, N] to keep sigmoid(g) for the backward, or `NO_ELEMS`.
    """
    m, n = g.shape
    out = np.empty((m, n), dtype=np.float32)
    keep = skeep.shape[0] > 0
    for i in prange(m):
        for j in range(n):
            a = g[i, j]
            s = np.float32(1.0) / (np.float32(1.0) + np.float32(math.exp(-a)))
            if keep:
                skeep[i, j] = s
            out[i, j] = (a * s) * u[i, j]
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
def attend(q, kc, vc, slot, nkeys, scale, probs):
    """Attention of each query row against keys 0..nkeys[n]-1 of cache slot slot[n].

    q: [N, H, D]; kc, vc: [S, T, Hkv, D]. probs: [N, H, >= max nkeys] to keep each row's
    probabilities for the backward (`numba_grad.attend_causal_bwd`), or `NO_PROBS` (decode).
    Keys are walked by absolute position,
    the same order in prefill (keys from this forward) and decode (keys from the
    cache): the kernel cannot tell the two apart. Two-pass softmax as HF eager:
    p_j = exp(s_j - max) / sum, then sum_j p_j v_j.

    Per score: s_t = sum_j q[j] * k[t, j] (j ascending, fp32), times `scale`
    (the product is float64 and is what the running max compares; s_t is stored
    rounded to fp32); e_t = fp32(exp(f64(s_t) - max)); tot = fp32 sum of e_t, t
    ascending; out[j] = fp32 sum over t ascending of (e_t / tot) * v[t, j].
    Speed only: keys go eight at a time (eight independent j-ascending sums,
    the same operations as one key at a time), the heads sharing a kv head run
    in one task, and all indexing is direct so the j loops see unit stride.
    """
    n_q, n_h, d = q.shape
    n_kv = kc.shape[2]
    group = n_h // n_kv
    out = np.zeros((n_q, n_h, d), dtype=np.float32)
    keep = probs.shape[0] > 0
    for idx in prange(n_q * n_kv):
        n = idx // n_kv
        g = idx % n_kv
        s_ = slot[n]
        t_len = nkeys[n]
        scores = np.empty((group, t_len), dtype=np.float32)
        for hh in range(group):
            h = g * group + hh
            mx = np.float32(-np.inf)
            t = 0
            while t + 8 <= t_len:
                a0 = np.float32(0.0)
                a1 = np.float32(0.0)
                a2 = np.float32(0.0)
                a3 = np.float32(0.0)
                a4 = np.float32(0.0)
                a5 = np.float32(0.0)
                a6 = np.float32(0.0)
                a7 = np.float32(0.0)
                for j in range(d):
                    qj = q[n, h, j]
                    a0 += qj * kc[s_, t, g, j]
                    a1 += qj * kc[s_, t + 1, g, j]
                    a2 += qj * kc[s_, t + 2, g, j]
                    a3 += qj * kc[s_, t + 3, g, j]
                    a4 += qj * kc[s_, t + 4, g, j]
                    a5 += qj * kc[s_, t + 5, g, j]
                    a6 += qj * kc[s_, t + 6, g, j]
                    a7 += qj * kc[s_, t + 7, g, j]
                a0 = a0 * scale
                a1 = a1 * scale
                a2 = a2 * scale
                a3 = a3 * scale
                a4 = a4 * scale
                a5 = a5 * scale
                a6 = a6 * scale
                a7 = a7 * scale
                scores[hh, t] = a0
                scores[hh, t + 1] = a1
                scores[hh, t + 2] = a2
                scores[hh, t + 3] = a3
                scores[hh, t + 4] = a4
                scores[hh, t + 5] = a5
                scores[hh, t + 6] = a6
                scores[hh, t + 7] = a7
                # the running max, in key order, over the unrounded products (as one key at a time)
                if a0 > mx:
                    mx = a0
                if a1 > mx:
                    mx = a1
                if a2 > mx:
                    mx = a2
                if a3 > mx:
                    mx = a3
                if a4 > mx:
                    mx = a4
                if a5 > mx:
                    mx = a5
                if a6 > mx:
                    mx = a6
                if a7 > mx:
                    mx = a7
                t += 8
            while t < t_len:
                acc = np.float32(0.0)
                for j in range(d):
                    acc += q[n, h, j] * kc[s_, t, g, j]
                acc = acc * scale
                scores[hh, t] = acc
                if acc > mx:
                    mx = acc
                t += 1
            tot = np.float32(0.0)
            for t in range(t_len):
                e = np.float32(math.exp(scores[hh, t] - mx))
                scores[hh, t] = e
                tot += e
            for t in range(t_len):
                scores[hh, t] = scores[hh, t] / tot
            if keep:
                for t in range(t_len):
                    probs[n, h, t] = scores[hh, t]
        for hh in range(group):
            h = g * group + hh
            for t in range(t_len):
                p = scores[hh, t]
                for j in range(d):
                    out[n, h, j] += p * vc[s_, t, g, j]
    return out


# What a forward keeps for its backward, when no backward will run (inference, decode).
NO_PROBS = np.empty((0, 0, 0), dtype=np.float32)  # `attend`'s probs
NO_ROWS = np.empty(0, dtype=np.float32)  # `rmsnorm`'s r
NO_ELEMS = np.empty((0, 0), dtype=np.float32)  # `silu_mul`'s sigmoid


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


@njit(cache=True, nogil=True)
def _ranks_above(a, b):
    """Whether a ranks before b in a descending sort: NaN above every number (torch.sort's order), -0 == +0."""
    return (a != a and b == b) or a > b


@njit(parallel=True, cache=True, nogil=True)
def top_k_ids(x, k):
    """[M, k] int64: each row's first k ids in a stable descending sort of x [M, V] (ties to the lower id, NaN
    first), i.e. torch.sort(x, -1, descending=True, stable=True).indices[:, :k], by insertion into a k-list
    (a later id enters only if it ranks strictly above the k-th) instead of sorting all V."""
    m, v = x.shape
    out = np.empty((m, k), dtype=np.int64)
    for i in prange(m):
        vals = np.empty(k, dtype=x.dtype)
        n = 0
        for j in range(v):
            a = x[i, j]
            if n == k and not _ranks_above(a, vals[k - 1]):
                continue
            p = n if n < k else k - 1
            while p > 0 and _ranks_above(a, vals[p - 1]):
                vals[p] = vals[p - 1]
                out[i, p] = out[i, p - 1]
                p -= 1
            vals[p] = a
            out[i, p] = j
            if n < k:
                n += 1
    return out
