"""The gate's probes that need a trainer beside an HTTP engine: alignment against the HF trainer, and logprob
semantics (which distribution the server's logprobs belong to).

Both score exactly the server's token ids with the trainer (`HfTrainer.logits`: raw logits per response
position). Alignment is timbench.align's statistics on timbench.align's workload, sent through the server in
calls of the suite's batch sizes (each call's requests concurrently). Logprob semantics tests every hypothesis
users have met about the returned logprobs against the trainer's distribution and names the one that fits:
processed (temperature applied once: what an RL framework's importance ratio needs), raw (temperature not
applied, vLLM's default `raw_logprobs` mode), temperature applied twice, shifted by one position either way,
zero-filled; and it flags logprobs rounded to bf16 on the way out (an fp32 logprob is exactly representable in
bf16 with probability 2^-16, so a majority of them is no accident).
"""

from __future__ import annotations

import math

import torch

from ..engine import SamplingParams
from .hf_trainer import HfTrainer, log_softmax_at
from .probes import Probe, _requests

SEMANTICS_DEFAULTS = {"requests": 16, "max_new_tokens": 8, "max_mean_abs_diff": 0.1, "max_frac_bf16_exact": 0.5,
                      "temperature": 0.7}
"""The semantic probe's work when the suite does not name it; `temperature` is used only when the suite samples at
1.0, where raw and processed logprobs are the same distribution and could not be told apart."""
HYPOTHESES = {
    "processed": "processed (temperature applied once)",
    "raw": "raw (temperature not applied)",
    "temperature_twice": "temperature applied twice",
    "shift_next": "shifted by one (each token gets the next one's logprob)",
    "shift_prev": "shifted by one (each token gets the previous one's logprob)",
    "zero": "zero-filled",
}


def _sampled(rows: torch.Tensor, tokens) -> torch.Tensor:
    return rows.gather(-1, torch.tensor(tokens)[:, None])[:, 0]


def alignment(engine, trainer: HfTrainer, p: dict, params: SamplingParams) -> Probe:
    """Mean / max |delta|, k3, the fraction of tokens that differ and argmax flips between the server's logprobs
    and the trainer's on the same tokens; passes when mean |delta| <= the suite's bound."""
    from ..align import workload
    from ..metrics.mismatch import mismatch_metrics

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
    numbers = {"tokens": int(diff.numel()), "mean_abs_diff": float(diff.mean()), "max_abs_diff": float(diff.max()),
               "k3_kl": mismatch_metrics(lp_t, lp_e)["rollout_corr/k3_kl"],
               "frac_tokens_differ": float((diff != 0).double().mean())}
    if checked:
        numbers["argmax_flips"] = flips
        numbers["argmax_checked"] = checked
    bound = p["max_mean_abs_diff"]
    return Probe(numbers["mean_abs_diff"] <= bound, numbers, {"mean_abs_diff": bound})


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
    allv = torch.cat(got)
    nonzero = allv[allv != 0]
    frac = float(bf16_exact(nonzero).double().mean()) if len(nonzero) >= 16 else 0.0
    numbers = {"tokens": int(allv.numel()), "temperature": t, "fits": best,
               **{f"mean_abs_diff_{k}": v for k, v in mad.items()}, "frac_bf16_exact": frac}
    rounded = frac > p["max_frac_bf16_exact"]
    passed = best == "processed" and mad["processed"] <= p["max_mean_abs_diff"] and not rounded
    note = f"logprobs fit: {HYPOTHESES[best]}" + ("; they are rounded to bf16" if rounded else "")
    return Probe(passed, numbers, {"mean_abs_diff_processed": p["max_mean_abs_diff"],
                                   "frac_bf16_exact": p["max_frac_bf16_exact"]}, note=note)
