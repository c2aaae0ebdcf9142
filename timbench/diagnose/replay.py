"""The engine's own arithmetic on given sequences: prefill the prompts, then decode the response, teacher-forced.

This is `timbench.engine.Engine` with the sampler's choice replaced by the
recorded token: the same `_blocks` calls through a slot KV cache (decode
attention against the cache, split-KV, TP, router noise), the same logit noise
keyed by (seed, request id, position), the same tempered log-softmax. For a
batch-invariant engine spec the replayed logprob of a token is bitwise the one
the engine reported while generating (a test checks it); with batch-variant
kernels (`kernels=torch`) it differs by the batch-composition noise, which the
report states as `replay_max_abs_diff`. It is what gives the engine side an
argmax, per-key variants and per-layer hidden states.
"""

from __future__ import annotations

import torch

from ..engine.sampler import SamplingParams, perturb_logits
from ..kernels.logprobs import token_logprobs_all
from ..model import Compute, Qwen3ForCausalLM
from ..spec import Spec
from .forward import Scored


def replay(model: Qwen3ForCausalLM, spec: Spec, seqs, request_ids=None, temperature: float = 1.0,
           seed: int = 0, levels: bool = False) -> Scored:
    """Engine-path logprobs, argmax and (optionally) levels of every response token of `seqs`."""
    if spec.engine != "timbench":
        raise ValueError(f"replay needs engine=timbench (got engine={spec.engine}): only timbench's engine "
                         "path can be re-run here")
    c = Compute.from_spec(spec)
    cfg = model.config
    n = len(seqs)
    rids = torch.tensor(list(request_ids) if request_ids is not None else range(n))
    plen = torch.tensor([len(p) for p, _ in seqs])
    rlen = torch.tensor([len(r) for _, r in seqs])
    t_max = int((plen + rlen).max())
    if t_max > cfg.max_position_embeddings:
        raise ValueError(f"sequence length {t_max} exceeds max_position_embeddings={cfg.max_position_embeddings}")
    cache_dtype = torch.float64 if c.dtype == torch.float64 else torch.float32  # the engine's is fp32
    shape = (n, t_max, cfg.num_key_value_heads, cfg.head_dim)
    kc = [torch.zeros(shape, dtype=cache_dtype) for _ in range(cfg.num_hidden_layers)]
    vc = [torch.zeros(shape, dtype=cache_dtype) for _ in range(cfg.num_hidden_layers)]
    params = SamplingParams(temperature=temperature, seed=seed)
    lps = [torch.empty(int(r), dtype=torch.float64) for r in rlen]  # fp32 values widen exactly
    ams = [torch.empty(int(r), dtype=torch.long) for r in rlen]
    lvs = [[] for _ in range(n)] if levels else None

    def step(rows, logits, hs, h, j):
        # Sampler: logit noise keyed by (seed, request, absolute position of the sampled token).
        noisy = perturb_logits(logits, spec.noise, params, rids[rows], plen[rows] + j, c.kernels)
        lp_all = token_logprobs_all(noisy, temperature, c.kernels)
        tok = torch.tensor([seqs[int(i)][1][j] for i in rows])
        lp = lp_all.gather(-1, tok[:, None])[:, 0]
        am = lp_all.argmax(-1)
        for r, i in enumerate(rows.tolist()):
            lps[i][j], ams[i][j] = lp[r], am[r]
            if levels:
                lvs[i].append([t[r].double() for t in [*hs, h, logits]])

    with torch.no_grad():
        # Prefill every prompt in one padded batch (the engine admits them together).
        width = int(plen.max())
        ids = torch.full((n, width), cfg.pad_token_id, dtype=torch.long)
        for i, (p, _) in enumerate(seqs):
            ids[i, : len(p)] = torch.tensor(list(p))
        slots = torch.arange(n)

        def prefill_attend(i, q, k, v):
            kc[i][slots, :width] = k.to(cache_dtype)
            vc[i][slots, :width] = v.to(cache_dtype)
            return c.kernels.causal_attention(q, k, v)

        hs = [] if levels else None
        h, _ = model._blocks(ids, torch.arange(width).expand(ids.shape), prefill_attend, c, hiddens=hs)
        logits = model.logits(h, c)
        last = plen - 1
        pick = (lambda t: t[slots, last])
        step(slots, pick(logits), [pick(t) for t in hs] if levels else [], pick(h), 0)
        # Decode: token j-1 goes in at position plen + j - 1 and the logits score token j.
        for j in range(1, int(rlen.max())):
            rows = torch.nonzero(rlen > j)[:, 0]
            ids = torch.tensor([seqs[int(i)][1][j - 1] for i in rows])
            pos = plen[rows] + j - 1

            def decode_attend(i, q, k, v, rows=rows, pos=pos):
                kc[i][rows, pos] = k.to(cache_dtype)
                vc[i][rows, pos] = v.to(cache_dtype)
                return c.kernels.decode_attention(q, kc[i], vc[i], rows, pos + 1, c.attn_splits)

            hs = [] if levels else None
            h, _ = model._blocks(ids, pos, decode_attend, c, hiddens=hs)
            step(rows, model.logits(h, c), hs or [], h, j)
    out_lv = None
    if levels:  # per sequence: per level [R, width]
        out_lv = [[torch.stack([tok[lv] for tok in lvs[i]]) for lv in range(len(lvs[i][0]))] for i in range(n)]
    return Scored(lps, ams, [None] * n, out_lv)
