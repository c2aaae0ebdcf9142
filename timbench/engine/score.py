"""Teacher-forced scoring through the engine's own arithmetic: prefill the prompts, decode the given response.

This is `Engine.generate` with the sampler's choice replaced by the recorded
token: the model's public prefill (`forward` with `on_kv`) and `decode` through
a slot KV cache (decode attention against the cache, split-KV, TP, router
noise), the same logit noise keyed by (seed, request id, position), the same
tempered log-softmax. For a batch-invariant engine spec a token's score is
bitwise the logprob the engine reported while generating it (a test checks
it); with batch-variant kernels (`kernels=torch`) it differs by the
batch-composition noise, which `timbench diagnose` reports as
`replay_max_abs_diff`. It gives the engine side an argmax, per-key variants
and per-layer hidden states, and is the one door for probes that score given
tokens through an engine (vLLM's prompt-logprobs counterpart).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..model import Compute, Qwen3ForCausalLM
from ..spec.keys import Spec
from .sampler import SamplingParams, for_spec, perturb_logits, processed_logprobs


@dataclass
class EngineScores:
    """Per sequence (input order): logprobs [R] (float64, widened exactly), argmax [R], levels or None."""

    logprobs: list[torch.Tensor]
    argmax: list[torch.Tensor]
    levels: list[list[torch.Tensor]] | None
    """Per sequence, per level (each layer's residual, the final norm, the logits): [R, width] float64."""


def score_sequences(
    model: Qwen3ForCausalLM,
    spec: Spec,
    seqs,
    request_ids=None,
    temperature: float = 1.0,
    seed: int = 0,
    levels: bool = False,
) -> EngineScores:
    """Engine-path logprobs, argmax and (optionally) levels of every response token of `seqs`.

    seqs: [(prompt_ids, response_ids)]; request_ids key the logit noise as the engine's requests did
    (default 0..n-1); temperature and seed as the engine's SamplingParams.
    """
    if spec.engine != "timbench":
        raise ValueError(
            f"scoring through an engine needs engine=timbench (got engine={spec.engine}): only "
            "timbench's engine path can be re-run here"
        )
    c = Compute.from_spec(spec)
    cfg, dev = model.config, model.lm_head_weight.device  # the engine's device (spec key `device`)
    n = len(seqs)
    rids = torch.tensor(list(request_ids) if request_ids is not None else range(n))
    plen = torch.tensor([len(p) for p, _ in seqs])
    rlen = torch.tensor([len(r) for _, r in seqs])
    t_max = int((plen + rlen).max())
    if t_max > cfg.max_position_embeddings:
        raise ValueError(f"sequence length {t_max} exceeds max_position_embeddings={cfg.max_position_embeddings}")
    cache_dtype = torch.float64 if c.dtype == torch.float64 else torch.float32  # the engine's is fp32
    shape = (n, t_max, cfg.num_key_value_heads, cfg.head_dim)
    kc = [torch.zeros(shape, dtype=cache_dtype, device=dev) for _ in range(cfg.num_hidden_layers)]
    vc = [torch.zeros(shape, dtype=cache_dtype, device=dev) for _ in range(cfg.num_hidden_layers)]
    params = for_spec(SamplingParams(temperature=temperature, seed=seed), spec)  # and the spec's top_k / top_p
    lps = [torch.empty(int(r), dtype=torch.float64) for r in rlen]  # fp32 values widen exactly
    ams = [torch.empty(int(r), dtype=torch.long) for r in rlen]
    lvs = [[] for _ in range(n)] if levels else None

    def step(rows, logits, hs, j):
        # Sampler: logit noise keyed by (seed, request, absolute position of the sampled token).
        noisy = perturb_logits(logits, spec.noise, params, rids[rows], plen[rows] + j, c.kernels)
        lp_all = processed_logprobs(noisy, params, c.kernels)[0]  # on the host, as the sampler's
        tok = torch.tensor([seqs[int(i)][1][j] for i in rows])
        lp = lp_all.gather(-1, tok[:, None])[:, 0]
        am = lp_all.argmax(-1)
        for r, i in enumerate(rows.tolist()):
            lps[i][j], ams[i][j] = lp[r], am[r]
            if levels:
                lvs[i].append([t[r].double().cpu() for t in [*hs, logits]])

    with torch.no_grad():
        # Prefill every prompt in one padded batch (the engine admits them together).
        width = int(plen.max())
        ids = torch.full((n, width), cfg.pad_token_id, dtype=torch.long)
        for i, (p, _) in enumerate(seqs):
            ids[i, : len(p)] = torch.tensor(list(p))
        ids, slots = ids.to(dev), torch.arange(n, device=dev)

        def on_kv(i, k, v):
            kc[i][slots, :width] = k.to(cache_dtype)
            vc[i][slots, :width] = v.to(cache_dtype)

        hs = [] if levels else None
        logits, _ = model(ids, c, on_kv=on_kv, hiddens=hs)
        last = plen.to(dev) - 1
        step(slots.cpu(), logits[slots, last], [t[slots, last] for t in hs] if levels else [], 0)
        # Decode: token j-1 goes in at position plen + j - 1 and the logits score token j.
        for j in range(1, int(rlen.max())):
            rows = torch.nonzero(rlen > j)[:, 0]
            ids = torch.tensor([seqs[int(i)][1][j - 1] for i in rows], device=dev)
            hs = [] if levels else None
            logits, _ = model.decode(ids, (plen[rows] + j - 1).to(dev), c, kc, vc, rows.to(dev), hiddens=hs)
            step(rows, logits, hs or [], j)
    out_lv = None
    if levels:  # per sequence: per level [R, width]
        out_lv = [[torch.stack([tok[lv] for tok in lvs[i]]) for lv in range(len(lvs[i][0]))] for i in range(n)]
    return EngineScores(lps, ams, out_lv)
