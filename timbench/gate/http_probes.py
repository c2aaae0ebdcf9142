"""The gate's probes that need a trainer beside an HTTP engine: alignment against the HF trainer, and logprob
semantics (which distribution the server's logprobs belong to).

Both score exactly the server's token ids with the trainer (`HfTrainer.logits`: raw logits per response
position). Alignment is timbench.align's statistics on timbench.align's workload, sent through the server in
calls of the suite's batch sizes (each call's requests concurrently). Logprob semantics tests every hypothesis
users have met about the returned logprobs against the trainer's distribution and names the one that fits:
processed (temperature applied once: what an RL framework's importance ratio needs), raw (temperature not
applied, vLLM's default `raw_logprobs` mode), temperature applied twice, shifted by one position either way,
zero-filled; and it flags logprobs rounded to bf16 on the way out (an fp32 logprob is exactly representable in
bf16 with probability 2^-16, so a majority of them is no accident). A hypothesis fits only within the bound: when
none does, the server's distribution is not the trainer's at all (other weights, another prompt).

It also samples with top_p < 1 and names the truncated-support semantics: logprobs renormalised over the kept
nucleus (log p - log of the kept mass: the distribution sampled from, vLLM's processed mode) or of the full
distribution (not renormalised). A trainer that scores the full distribution against renormalised logprobs sees
its importance ratio drop to the kept mass (TRL #6789: 0.896 at top_p 0.8), so the probe reports that mass.
"""

from __future__ import annotations

import math

import torch

from ..align import workload
from ..engine import SamplingParams
from ..metrics.mismatch import mismatch_metrics
from ..metrics.schema import K3_KL
from .hf_trainer import HfTrainer, log_softmax_at
from .probes import Probe, _requests

SEMANTICS_DEFAULTS = {
    "requests": 16,
    "max_new_tokens": 8,
    "max_mean_abs_diff": 0.1,
    "max_frac_bf16_exact": 0.5,
    "temperature": 0.7,
    "top_p": 0.8,
}
"""The semantic probe's work when the suite does not name it; `temperature` is used only when the suite samples at
1.0, where raw and processed logprobs are the same distribution and could not be told apart; `top_p` is the
truncated-support leg's nucleus."""
HYPOTHESES = {
    "processed": "processed (temperature applied once)",
    "raw": "raw (temperature not applied)",
    "temperature_twice": "temperature applied twice",
    "shift_next": "shifted by one (each token gets the next one's logprob)",
    "shift_prev": "shifted by one (each token gets the previous one's logprob)",
    "zero": "zero-filled",
}
SUPPORT = {"renormalised": "renormalised over the kept mass", "full": "of the full distribution (not renormalised)"}
"""The truncated-support hypotheses (top_p < 1)."""


def _sampled(rows: torch.Tensor, tokens) -> torch.Tensor:
    return rows.gather(-1, torch.tensor(tokens, dtype=torch.long)[:, None])[:, 0]  # long: a response may be empty


def alignment(engine, trainer: HfTrainer, p: dict, params: SamplingParams) -> Probe:
    """Mean / max |delta|, k3, the fraction of tokens that differ and argmax flips between the server's logprobs
    and the trainer's on the same tokens; passes when mean |delta| <= the suite's bound."""
    comps = []
    for call in workload(params.seed, trainer.vocab_size, engine.max_len, tuple(p["batches"])):
        comps += engine.generate(call, params)
    rows = trainer.logits([(c.prompt_ids, c.token_ids) for c in comps])
    mine = [log_softmax_at(z, params.temperature) for z in rows]
    lp_t = torch.cat([_sampled(m, c.token_ids) for m, c in zip(mine, comps)])
    lp_e = torch.cat([c.logprobs.double() for c in comps])
    diff = (lp_t - lp_e).abs()
    flips = checked = 0
    for m, c in zip(mine, comps):
        top = engine.top_ids.get(c.request_id)
        if top is not None:
            flips += int((m.argmax(-1) != torch.tensor(top)).sum())
            checked += len(top)
    numbers = {
        "tokens": int(diff.numel()),
        "mean_abs_diff": float(diff.mean()),
        "max_abs_diff": float(diff.max()),
        "k3_kl": mismatch_metrics(lp_t, lp_e)[K3_KL],
        "frac_tokens_differ": float((diff != 0).double().mean()),
    }
    empty = sum(not c.token_ids for c in comps)
    if empty:  # a server that ends at a stop token without listing it (llama-cpp-python): nothing to compare
        numbers["completions_empty"] = empty
    if checked:
        numbers["argmax_flips"] = flips
        numbers["argmax_checked"] = checked
    miscounted = [engine.prompt_counts[c.request_id] for c in comps if c.request_id in engine.prompt_counts]
    note = ""
    if miscounted:  # the server saw another prompt than the one sent (a template or tokenizer adding tokens)
        numbers["prompts_miscounted"] = len(miscounted)
        sent, counted = miscounted[0]
        note = (
            f"the server counted {counted} prompt tokens for {sent} sent ({len(miscounted)} of {len(comps)} "
            "requests): a BOS or chat template added?"
        )
    bound = p["max_mean_abs_diff"]
    return Probe(numbers["mean_abs_diff"] <= bound, numbers, {"mean_abs_diff": bound}, note=note)


def bf16_exact(x: torch.Tensor) -> torch.Tensor:
    """Which fp32 values survive a round trip through bf16 unchanged."""
    x = x.float()
    return x.to(torch.bfloat16).float() == x


def logprob_semantics(engine, trainer: HfTrainer, p: dict, params: SamplingParams) -> Probe:
    """Which distribution the returned logprobs belong to (module docstring); passes when it is the processed one,
    within the bound of it, and the logprobs are not rounded to bf16."""
    p = {**SEMANTICS_DEFAULTS, **p}
    t = params.temperature if params.temperature not in (0.0, 1.0) else p["temperature"]
    run = SamplingParams(temperature=t, seed=params.seed)
    reqs = _requests("gate:sem", trainer.vocab_size, p["requests"], p["max_new_tokens"])
    comps = engine.generate(reqs, run)
    rows = trainer.logits([(c.prompt_ids, c.token_ids) for c in comps])
    got, hyp = [], {k: [] for k in HYPOTHESES}
    for z, c in zip(rows, comps):
        lp = c.logprobs.double()
        proc = _sampled(log_softmax_at(z, t), c.token_ids)
        got.append(lp)
        hyp["processed"].append(proc - lp)
        hyp["raw"].append(_sampled(log_softmax_at(z, 1.0), c.token_ids) - lp)
        hyp["temperature_twice"].append(_sampled(log_softmax_at(z, t * t), c.token_ids) - lp)
        hyp["shift_next"].append(proc[1:] - lp[:-1])
        hyp["shift_prev"].append(proc[:-1] - lp[1:])
        hyp["zero"].append(-lp)
    mad = {k: float(torch.cat(v).abs().mean()) if sum(map(len, v)) else math.inf for k, v in hyp.items()}
    best = min(HYPOTHESES, key=lambda k: (mad[k], k != "processed"))  # a tie goes to the processed one
    bound = p["max_mean_abs_diff"]
    fits = best if mad[best] <= bound else "none"
    allv = torch.cat(got)
    nonzero = allv[allv != 0]
    frac = float(bf16_exact(nonzero).double().mean()) if len(nonzero) >= 16 else 0.0
    numbers = {
        "tokens": int(allv.numel()),
        "temperature": t,
        "fits": fits,
        **{f"mean_abs_diff_{k}": v for k, v in mad.items()},
        "frac_bf16_exact": frac,
    }
    trunc = truncated_support(engine, trainer, p, t, params.seed)
    numbers.update(trunc)
    rounded = frac > p["max_frac_bf16_exact"]
    passed = fits == "processed" and not rounded and trunc["top_p_fits"] != "none"
    note = (
        f"logprobs fit: {HYPOTHESES[best]}"
        if fits != "none"
        else f"logprobs fit none of the hypotheses (nearest: {HYPOTHESES[best]}, mean abs delta {mad[best]:.3g} > "
        f"{bound:g}): the server's distribution is not the trainer's (other weights? another prompt?)"
    )
    note += "; they are rounded to bf16" if rounded else ""
    note += f"; {support_note(trunc)}"
    return Probe(
        passed, numbers, {"mean_abs_diff_processed": bound, "frac_bf16_exact": p["max_frac_bf16_exact"]}, note=note
    )


def top_p_keep(lp: torch.Tensor, top_p: float) -> torch.Tensor:
    """[R, V] bool: the nucleus of each row of log-probabilities, as timbench's sampler keeps it (the fewest most
    likely tokens whose mass reaches top_p; ties by lower id), in float64."""
    prob = lp.double().exp()
    order = torch.sort(prob, dim=-1, descending=True, stable=True).indices
    sorted_p = prob.gather(-1, order)
    before = torch.cumsum(sorted_p, dim=-1) - sorted_p  # the mass ranked above each token
    return torch.zeros_like(prob, dtype=torch.bool).scatter(-1, order, before < top_p)


def truncated_support(engine, trainer: HfTrainer, p: dict, t: float, seed: int) -> dict:
    """Sample at top_p < 1 and fit the returned logprobs to the trainer's nucleus, renormalised or not; with the
    mean kept mass (the ratio a full-distribution trainer sees against renormalised logprobs) and how many sampled
    tokens fall outside the trainer's nucleus."""
    top_p = float(p["top_p"])
    comps = engine.generate(
        _requests("gate:sem-top-p", trainer.vocab_size, p["requests"], p["max_new_tokens"]),
        SamplingParams(temperature=t, top_p=top_p, seed=seed),
    )
    rows = trainer.logits([(c.prompt_ids, c.token_ids) for c in comps])
    diff, mass, outside = {k: [] for k in SUPPORT}, [], 0
    for z, c in zip(rows, comps):
        lp_all = log_softmax_at(z, t)
        keep = top_p_keep(lp_all, top_p)
        kept = (lp_all.exp() * keep).sum(-1)
        tok = torch.tensor(c.token_ids, dtype=torch.long)[:, None]
        full = lp_all.gather(-1, tok)[:, 0]
        got = c.logprobs.double()
        diff["full"].append(full - got)
        diff["renormalised"].append(full - kept.log() - got)
        mass.append(kept)
        outside += int((~keep.gather(-1, tok)[:, 0]).sum())
    mad = {k: float(torch.cat(v).abs().mean()) for k, v in diff.items()}
    best = min(SUPPORT, key=lambda k: (mad[k], k != "renormalised"))
    fits = best if mad[best] <= p["max_mean_abs_diff"] else "none"
    if float(torch.cat(mass).log().abs().max()) < 1e-9:  # every nucleus held all the mass: nothing to tell apart
        fits = "indistinguishable"
    return {
        "top_p": top_p,
        "top_p_fits": fits,
        **{f"mean_abs_diff_top_p_{k}": v for k, v in mad.items()},
        "mean_kept_mass": float(torch.cat(mass).mean()),
        "top_p_outside_nucleus": outside,
    }


def support_note(trunc: dict) -> str:
    """The truncated-support finding as a clause of the probe's note."""
    head = f"at top_p {trunc['top_p']:g} the logprobs are "
    mass = trunc["mean_kept_mass"]
    if trunc["top_p_fits"] == "renormalised":
        return head + (
            f"{SUPPORT['renormalised']} (mean kept mass {mass:.3f}: a trainer scoring the full "
            f"distribution sees its ratio drop to ~{mass:.3f})"
        )
    if trunc["top_p_fits"] == "full":
        return head + (
            f"{SUPPORT['full']} (mean kept mass {mass:.3f}: a trainer renormalising over the nucleus sees "
            f"its ratio rise to ~{1 / mass:.3f})"
        )
    if trunc["top_p_fits"] == "indistinguishable":
        return f"at top_p {trunc['top_p']:g} every nucleus held all the mass: renormalised or not is not tested"
    return head + "neither renormalised over the kept mass nor of the full distribution"
