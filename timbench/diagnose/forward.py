"""Scoring given sequences with one side's spec: the trainer forward, and the float64 reference.

`score` is `timbench.trainer.sequence_logprobs` (same calls, same bits; a test
checks it) that also keeps what the diagnosis needs: each scored token's
argmax and, on request, the "levels" of the computation at the position that
scores it: the residual stream after every decoder layer, the final norm, the
logits. The reference is the same forward with the exact kernels in float64
(`dtype=fp64`), so both sides are measured against one fixed-order computation
of the same model whose own rounding error is ~1e-16.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..kernels.logprobs import token_logprobs_all
from ..model import Compute, Qwen3ForCausalLM
from ..spec.keys import Spec
from ..trainer.forward import pack

REFERENCE = Spec(dtype="fp64")
"""The float64 exact-kernel reference both sides are compared with."""


def level_names(num_layers: int) -> list[str]:
    """Names of the compared levels, in forward order."""
    return [f"layer{i}" for i in range(num_layers)] + ["final_norm", "logits"]


@dataclass
class Scored:
    """Per sequence (in input order): token logprobs [R], argmax ids [R], routing, levels."""

    logprobs: list[torch.Tensor]
    argmax: list[torch.Tensor]
    routing: list[torch.Tensor | None]
    """MoE: experts [P+R-1, layers, k] of every token the forward processed that the engine also did."""
    levels: list[list[torch.Tensor]] | None
    """Per sequence, per level: [R, width] float64 values at the positions scoring each token."""


def score(
    model: Qwen3ForCausalLM, spec: Spec, seqs, temperature: float = 1.0, groups=None, levels: bool = False
) -> Scored:
    """Logprobs of each response token of `seqs` [(prompt_ids, response_ids)] under `spec`.

    `groups` (lists of indices into seqs) is the mini-batching, as the trainer would
    group them; default: all in one batch. Float64 specs run under no_grad.
    """
    c = Compute.from_spec(spec)
    n, dev = len(seqs), model.lm_head_weight.device  # an engine's model may sit on a GPU (spec key `device`)
    groups = groups or [list(range(n))]
    out_lp, out_am, out_rt, out_lv = [None] * n, [None] * n, [None] * n, ([None] * n if levels else None)
    with torch.no_grad():
        for g in groups:
            chunk = [seqs[i] for i in g]
            ids, p_len, r_len = pack(chunk, model.config.pad_token_id)
            hs = [] if levels else None  # per-layer residuals, then the final norm
            logits, routing = model(ids.to(dev), c, hiddens=hs)
            r_max = int(r_len.max())
            j = torch.arange(r_max)
            mask = j[None, :] < r_len[:, None]
            src = (p_len[:, None] - 1 + j[None, :]).clamp(max=ids.shape[1] - 1)
            tgt = torch.where(mask, ids.gather(1, (src + 1).clamp(max=ids.shape[1] - 1)), 0)
            rows = torch.arange(len(chunk))[:, None]
            lp_all = token_logprobs_all(logits[rows.to(dev), src.to(dev)], temperature, c.kernels).cpu()
            lp = lp_all.gather(-1, tgt[..., None])[..., 0]
            am = lp_all.argmax(-1)
            for r, i in enumerate(g):
                m = int(r_len[r])
                out_lp[i], out_am[i] = lp[r, :m].clone(), am[r, :m].clone()
                if routing is not None:
                    out_rt[i] = routing[r, : int(p_len[r]) + m - 1].cpu().clone()
                if levels:
                    s = src[r, :m].to(dev)
                    out_lv[i] = [t[r, s].double().cpu() for t in [*hs, logits]]
    return Scored(out_lp, out_am, out_rt, out_lv)


def reference(model: Qwen3ForCausalLM, seqs, temperature: float = 1.0, levels: bool = False, batch: int = 32) -> Scored:
    """The float64 exact-kernel reference scores (batch-invariant, so the grouping is free)."""
    groups = [list(range(i, min(i + batch, len(seqs)))) for i in range(0, len(seqs), batch)]
    return score(model, REFERENCE, seqs, temperature, groups, levels)
