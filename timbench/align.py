"""Alignment probe: how far apart are engine and trainer logprobs on a mixed workload?

The workload is built to expose every way a kernel can depend on its batch:
engine calls with batch sizes 1..96 (`ENGINE_BATCHES`), prompts of different lengths, sequences
that finish at different steps (random token limits, EOS), more requests than
cache slots so new ones join mid-decode; the trainer then scores the same
sequences shuffled into mini-batches of other sizes. An `exact/exact` pair must
report max_abs_diff == 0.0.
"""

from __future__ import annotations

import random

import torch

from .engine import Request, SamplingParams, make_engine
from .metrics.mismatch import mismatch_metrics, routing_agreement
from .metrics.schema import K3_KL, P99_ABS_DELTA, PROBS_DIFF_MAX
from .model import Compute, Qwen3ForCausalLM
from .spec.keys import parse_spec
from .trainer import sequence_logprobs

ENGINE_BATCHES = (1, 2, 3, 7, 16, 64, 96)
TRAINER_BATCHES = (5, 1, 32, 13, 64)


def workload(seed: int, vocab: int, max_len: int, batches=ENGINE_BATCHES, max_new: int = 40):
    """Engine calls as lists of Requests; prompts are random non-special tokens."""
    rng = random.Random(f"align:{seed}")
    calls, rid = [], 0
    for b in batches:
        call = []
        for _ in range(b):
            plen = rng.randint(1, min(24, max_len // 2))
            prompt = tuple(rng.randrange(3, vocab) for _ in range(plen))
            call.append(Request(prompt, rng.randint(1, min(max_new, max_len - plen - 1)), rid))
            rid += 1
        calls.append(call)
    return calls


def align(
    model: Qwen3ForCausalLM,
    engine_spec,
    trainer_spec,
    seed: int = 0,
    temperature: float = 1.0,
    batches=ENGINE_BATCHES,
    max_num_seqs: int = 64,
) -> dict:
    """Run the probe; returns the JSON-ready report."""
    es = parse_spec(engine_spec, "engine spec", side="engine")
    ts = parse_spec(trainer_spec, "trainer spec", side="trainer")
    cfg = model.config
    engine = make_engine(cfg, es, max_num_seqs=max_num_seqs, weights=model)
    params = SamplingParams(temperature=temperature, seed=seed)
    completions = []
    for call in workload(seed, cfg.vocab_size, cfg.max_position_embeddings, batches):
        completions.extend(engine.generate(call, params))
    # The trainer regroups: shuffled order, mini-batches of other sizes.
    order = list(range(len(completions)))
    random.Random(f"align-trainer:{seed}").shuffle(order)
    compute = Compute.from_spec(ts)
    lp_t, lp_e, agree = [], [], []
    i = 0
    sizes = iter(TRAINER_BATCHES * (len(order) // sum(TRAINER_BATCHES) + 1))
    with torch.no_grad():
        while i < len(order):
            chunk = [completions[j] for j in order[i : i + next(sizes)]]
            i += len(chunk)
            out = sequence_logprobs(model, compute, [(c.prompt_ids, c.token_ids) for c in chunk], temperature)
            for r, c in enumerate(chunk):
                lp_t.append(out.logprobs[r][out.mask[r]])
                lp_e.append(c.logprobs)
                if out.routing is not None:
                    n = c.routing.shape[0]
                    agree.append((out.routing[r, :n], c.routing))
    train, roll = torch.cat(lp_t), torch.cat(lp_e)
    m = mismatch_metrics(train, roll)
    diff = (train.double() - roll.double()).abs()
    report = {
        "model": cfg.model_type,
        "engine": str(es),
        "trainer": str(ts),
        "seed": seed,
        "temperature": temperature,
        "sequences": len(completions),
        "tokens": int(train.numel()),
        "max_abs_diff": float(diff.max()),
        "mean_abs_diff": float(diff.mean()),
        "frac_tokens_differ": float((diff != 0).double().mean()),
        "k3_kl": m[K3_KL],
        "kl": m["rollout_corr/kl"],
        "p99_abs_diff": m[P99_ABS_DELTA],
        "probs_diff_max": m[PROBS_DIFF_MAX],
    }
    if agree:
        report["routing_agreement"] = routing_agreement(
            torch.cat([a for a, _ in agree]), torch.cat([b for _, b in agree])
        )
    return report
