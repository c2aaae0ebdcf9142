"""Keyed noise for the synthetic-noise and router-noise conditions, as pure functions of their keys.

Sampler noise is keyed by (seed, stream, request, position, column), as the
sampling Gumbel noise is, so a request sees the same perturbation in any batch
and a run is reproducible. Router noise has no request id to key on (it lives
inside the forward), so it is keyed by the bits of the token's own router
logits and the layer: the same activations get the same noise in any batch,
prefill or decode. Normals come from Box-Muller with scalar libm calls (numba,
no fastmath), never from a vectorised transcendental whose value could depend
on where an element lands in a SIMD loop.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from .numba_ops import _mix64, keyed_uniform

_TWO_PI = 2.0 * math.pi
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


@njit(cache=True, nogil=True)
def _box_muller(u1, u2):
    return math.sqrt(-2.0 * math.log(u1)) * math.cos(_TWO_PI * u2)


@njit(parallel=True, cache=True, nogil=True)
def keyed_normal(seed, stream, req, pos, width):
    """Standard normal float64 noise [len(req), width], a pure function of (seed, stream, req, pos, column)."""
    u = keyed_uniform(seed, stream, req, pos, 2 * width)
    n = req.shape[0]
    out = np.empty((n, width), dtype=np.float64)
    for i in prange(n):
        for j in range(width):
            out[i, j] = _box_muller(u[i, 2 * j], u[i, 2 * j + 1])
    return out


@njit(parallel=True, cache=True, nogil=True)
def keyed_student_t(seed, stream, req, pos, width, df):
    """Student-t(df) float64 noise: z / sqrt(chi2_df / df), chi2 as a sum of df squared keyed normals."""
    z = keyed_normal(seed, stream, req, pos, width)
    n = req.shape[0]
    chi = np.zeros((n, width), dtype=np.float64)
    for d in range(df):
        w = keyed_normal(seed, stream + 1 + d, req, pos, width)
        for i in prange(n):
            for j in range(width):
                chi[i, j] += w[i, j] * w[i, j]
    for i in prange(n):
        for j in range(width):
            z[i, j] = z[i, j] / math.sqrt(chi[i, j] / df)
    return z


@njit(parallel=True, cache=True, nogil=True)
def one_minus_prob(lp):
    """1 - exp(lp) per element (float64), the lowprob noise scale: ~0 on likely tokens, ~1 on unlikely."""
    m, v = lp.shape
    out = np.empty((m, v), dtype=np.float64)
    for i in prange(m):
        for j in range(v):
            out[i, j] = 1.0 - math.exp(np.float64(lp[i, j]))
    return out


@njit(parallel=True, cache=True, nogil=True)
def row_keyed_normal(x, salt):
    """Standard normal float32 noise shaped like x[M, E], keyed by the bits of each row of x and `salt`."""
    m, e = x.shape
    bits = x.view(np.uint32)
    out = np.empty((m, e), dtype=np.float32)
    for i in prange(m):
        h = _mix64(np.uint64(salt) * _GOLDEN + np.uint64(1))
        for j in range(e):
            h = _mix64(h ^ (np.uint64(bits[i, j]) + _GOLDEN))
        for j in range(e):
            a = _mix64(h + np.uint64(2 * j + 1) * _GOLDEN)
            b = _mix64(h + np.uint64(2 * j + 2) * _GOLDEN)
            u1 = (np.float64(a >> np.uint64(11)) + 0.5) * (1.0 / 9007199254740992.0)
            u2 = (np.float64(b >> np.uint64(11)) + 0.5) * (1.0 / 9007199254740992.0)
            out[i, j] = np.float32(_box_muller(u1, u2))
    return out
