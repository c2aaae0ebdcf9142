"""Split-KV decode attention (flash-decoding): the `attn_splits=S` condition.

Production decode kernels (FlashAttention's split-KV path, vLLM's paged
attention v2, FlashInfer) cut a long key range into S chunks, attend to each
chunk separately, store a normalised partial output with its log-sum-exp, and
merge the partials with their LSE weights. The result is mathematically the
same softmax attention, but the sums run in a different order than one pass
over all keys (what a trainer's prefill does), so engine and trainer round
differently. Chunk c of a row with L keys covers keys [c*ceil(L/S), (c+1)*ceil(L/S)):
a function of the row's own length only, so the condition is a pure kernel
mismatch, still batch-invariant (the real kernels also pick S from the batch
size, which would add batch variance on top).
"""

from __future__ import annotations

import math

import numpy as np
import torch
from numba import njit, prange


@njit(parallel=True, cache=True, fastmath=False, nogil=True)
def attend_split(q, kc, vc, slot, nkeys, scale, splits):
    """q[N,H,D] against keys 0..nkeys[n]-1 of cache slot slot[n], in `splits` LSE-merged chunks (fp32)."""
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
        cs = (t_len + splits - 1) // splits
        n_chunks = (t_len + cs - 1) // cs
        lse = np.empty(n_chunks, dtype=np.float32)
        part = np.zeros((n_chunks, d), dtype=np.float32)
        for c in range(n_chunks):
            t0 = c * cs
            t1 = min(t0 + cs, t_len)
            sc = np.empty(t1 - t0, dtype=np.float32)
            mx = np.float32(-np.inf)
            for t in range(t0, t1):
                acc = np.float32(0.0)
                for j in range(d):
                    acc += q[n, h, j] * kc[s_, t, g, j]
                s = np.float32(acc * scale)
                sc[t - t0] = s
                if s > mx:
                    mx = s
            tot = np.float32(0.0)
            for t in range(t1 - t0):
                e = np.float32(math.exp(sc[t] - mx))
                sc[t] = e
                tot += e
            for t in range(t1 - t0):
                p = sc[t] / tot
                for j in range(d):
                    part[c, j] += p * vc[s_, t0 + t, g, j]
            lse[c] = mx + np.float32(math.log(tot))
        big = lse[0]
        for c in range(1, n_chunks):
            if lse[c] > big:
                big = lse[c]
        w = np.empty(n_chunks, dtype=np.float32)
        wsum = np.float32(0.0)
        for c in range(n_chunks):
            w[c] = np.float32(math.exp(lse[c] - big))
            wsum += w[c]
        for c in range(n_chunks):
            f = w[c] / wsum
            for j in range(d):
                out[n, h, j] += f * part[c, j]
    return out


def split_decode_attention_torch(q, k_cache, v_cache, slots, lengths, splits: int):
    """The same split-KV algorithm in plain PyTorch ops (batched einsum, masked chunks)."""
    b, h, d = q.shape
    t_max = int(lengths.max())
    k = k_cache[slots, :t_max].to(q.dtype)  # [B, T, Hkv, D]
    v = v_cache[slots, :t_max].to(q.dtype)
    rep = h // k.shape[2]
    k, v = k.repeat_interleave(rep, dim=2), v.repeat_interleave(rep, dim=2)
    scores = torch.einsum("bhd,bthd->bht", q.float(), k.float()) / math.sqrt(d)
    t = torch.arange(t_max, device=lengths.device)
    cs = (lengths + splits - 1) // splits  # per-row chunk size
    chunk = t[None, :] // cs[:, None]  # [B, T] chunk id of each key
    valid = t[None, :] < lengths[:, None]
    parts, lses = [], []
    for c in range(splits):
        m = (valid & (chunk == c))[:, None, :]  # [B, 1, T]
        s = scores.masked_fill(~m, float("-inf"))
        lse = torch.logsumexp(s, dim=-1)  # [B, H]; -inf for an empty chunk
        p = torch.exp(s - lse[..., None]).nan_to_num(0.0)
        parts.append(torch.einsum("bht,bthd->bhd", p, v.float()))
        lses.append(lse)
    lse = torch.stack(lses)  # [S, B, H]
    w = torch.softmax(lse, dim=0).nan_to_num(0.0)
    return (w[..., None] * torch.stack(parts)).sum(0).to(q.dtype)
