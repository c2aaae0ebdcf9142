"""The gate's probes: each runs one engine property on one checkpoint and returns pass/fail with its numbers.

A probe is a function (engine factory, model, its parameters from the suite, the
sampling settings, the engine spec) -> `Probe`; the RL-outcome probe lives in `outcome`.
Exact properties (determinism, batch invariance, prefill vs decode, weight sync) pass
only at 0.0 difference; the alignment probe against timbench's exact fp32 trainer has
a threshold from the suite. Probes
never look at which fault (if any) the engine carries: they must find it.
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from ..align import align
from ..diagnose.forward import score
from ..engine import Request, SamplingParams
from ..report.stats import chi2_sf
from ..spec.keys import ZERO_MISMATCH


@dataclass
class Probe:
    passed: bool
    numbers: dict
    thresholds: dict = field(default_factory=dict)
    note: str = ""


def _requests(seed: str, vocab: int, n: int, max_new: int, first_id: int = 0, lengths=None) -> list[Request]:
    rng = random.Random(seed)
    lengths = lengths or [rng.randint(1, 24) for _ in range(n)]
    return [
        Request(tuple(rng.randrange(3, vocab) for _ in range(L)), max_new, first_id + i) for i, L in enumerate(lengths)
    ]


def _diff(a, b) -> tuple[int, float]:
    """(completions whose tokens differ, max |logprob difference| over the common prefix)."""
    tokens, worst = 0, 0.0
    for x, y in zip(a, b):
        tokens += x.token_ids != y.token_ids
        k = min(len(x.token_ids), len(y.token_ids))
        if k:
            worst = max(worst, float((x.logprobs[:k].double() - y.logprobs[:k].double()).abs().max()))
    return tokens, worst


def determinism(make, model, p: dict, params: SamplingParams, spec) -> Probe:
    """The same requests and seed twice on one engine: identical tokens and logprobs."""
    reqs = _requests("gate:det", model.config.vocab_size, p["requests"], p["max_new_tokens"])
    engine = make(model)
    tokens, worst = _diff(engine.generate(reqs, params), engine.generate(reqs, params))
    return Probe(
        tokens == 0 and worst == 0.0, {"completions_differ": tokens, "max_abs_diff": worst}, {"max_abs_diff": 0.0}
    )


def batch_invariance(make, model, p: dict, params: SamplingParams, spec) -> Probe:
    """Each request alone (bs 1) vs inside batches of other sizes and compositions; lengths cross block edges."""
    vocab = model.config.vocab_size
    probes = _requests("gate:bi", vocab, 0, p["max_new_tokens"], lengths=p["prompt_lengths"])
    engine = make(model)
    alone = {r.request_id: engine.generate([r], params)[0] for r in probes}
    differ, worst, cases = 0, 0.0, 0
    for bs in p["batch_sizes"]:
        for r in probes:
            fill = _requests(f"gate:bi:{bs}:{r.request_id}", vocab, bs - 1, p["max_new_tokens"], first_id=1000)
            batch = fill[: (bs - 1) // 2] + [r] + fill[(bs - 1) // 2 :]  # the request in the middle of the batch
            got = next(c for c in engine.generate(batch, params) if c.request_id == r.request_id)
            t, w = _diff([alone[r.request_id]], [got])
            differ, worst, cases = differ + t, max(worst, w), cases + 1
    return Probe(
        differ == 0 and worst == 0.0,
        {"cases": cases, "completions_differ": differ, "max_abs_diff": worst},
        {"max_abs_diff": 0.0},
    )


def prefill_vs_decode(make, model, p: dict, params: SamplingParams, spec) -> Probe:
    """A token's logprob as decoded vs scored again with its prefix in one prefill (teacher forcing).

    timbench's engine: its model prefills prompt + response in one forward (`diagnose.forward.score`; its own
    `Engine.score` decodes the response again, so it would not test prefill). An engine without a model but with
    `score` (vLLM: prompt logprobs, one prefill) scores through it; vLLM's prompt logprobs are of the raw
    distribution, so there both generation and scoring run at temperature 1 (reported as `temperature`).
    """
    engine, extra = make(model), {}
    if hasattr(engine, "model") and hasattr(engine, "spec"):
        prefill = lambda seqs: score(engine.model, engine.spec, seqs, params.temperature).logprobs  # noqa: E731
    elif hasattr(engine, "score"):
        params, extra = dataclasses.replace(params, temperature=1.0), {"temperature": 1.0}
        prefill = lambda seqs: engine.score(seqs, params).logprobs  # noqa: E731
    else:
        return Probe(True, {}, note="not testable: the engine exposes no prefill scoring here")
    reqs = _requests("gate:pd", model.config.vocab_size, p["requests"], p["max_new_tokens"])
    comps = engine.generate(reqs, params)
    scored = prefill([(c.prompt_ids, c.token_ids) for c in comps])
    worst = max(  # an empty response (a server ending at a stop token it does not list) has nothing to compare
        (float((lp - c.logprobs.double()).abs().max()) for lp, c in zip(scored, comps) if c.token_ids), default=0.0
    )
    return Probe(
        worst == 0.0,
        {"tokens": sum(len(c.token_ids) for c in comps), "max_abs_diff": worst, **extra},
        {"max_abs_diff": 0.0},
    )


def claims_zero_mismatch(spec) -> bool:
    """An engine spec that is timbench's exact fp32 reference (a fault aside) is held to 0.0 exactly."""
    return dataclasses.replace(spec, fault="none") == ZERO_MISMATCH


def alignment(make, model, p: dict, params: SamplingParams, spec) -> Probe:
    """Train-inference alignment against timbench's exact fp32 trainer (timbench.align): mean |delta| within the
    suite's bound (the field's CI gates: slime/vime's 0.1), and 0.0 exactly for an engine claiming zero mismatch."""
    r = align(
        model,
        spec,
        "kernels=exact,dtype=fp32",
        seed=params.seed,
        temperature=params.temperature,
        batches=tuple(p["batches"]),
    )
    keys = ("mean_abs_diff", "max_abs_diff", "k3_kl", "frac_tokens_differ", "routing_agreement")
    numbers = {k: r[k] for k in keys if k in r}
    bound = 0.0 if claims_zero_mismatch(spec) else p["max_mean_abs_diff"]
    passed = r["max_abs_diff"] == 0.0 if bound == 0.0 else r["mean_abs_diff"] <= bound
    return Probe(passed, numbers, {"mean_abs_diff": bound})


def weight_sync(make, model, p: dict, params: SamplingParams, spec) -> Probe:
    """After k trainer updates and an in-memory sync: every engine tensor equals the trainer's (rounded to the
    engine's dtype), and the logprobs equal those of a fresh engine started from the updated weights. The same
    prompts are generated once before the updates too, as an RL loop meets a prompt again: a prefix / KV cache
    the sync does not flush would serve them stale afterwards."""
    engine = make(model)
    reqs = _requests("gate:ws", model.config.vocab_size, p["requests"], p["max_new_tokens"])
    engine.generate(reqs, params)
    trained = type(model)(model.config)
    trained.load_state_dict(model.state_dict())
    gen = torch.Generator().manual_seed(params.seed)
    with torch.no_grad():
        for _ in range(p["updates"]):  # a stand-in for optimizer steps: every tensor moves
            for t in trained.parameters():
                t.add_(1e-2 * torch.randn(t.shape, generator=gen))
            engine.load_weights(trained)
    numbers = {}
    if hasattr(engine, "model"):
        own, want = engine.model.state_dict(), trained.state_dict()
        stale = [k for k, v in own.items() if k in want and not torch.equal(v.cpu(), want[k].to(v.dtype))]
        numbers["tensors"], numbers["tensors_differ"] = len(own), len(stale)
    tokens, worst = _diff(engine.generate(reqs, params), make(trained).generate(reqs, params))
    numbers |= {"completions_differ": tokens, "max_abs_diff": worst}
    return Probe(
        numbers.get("tensors_differ", 0) == 0 and tokens == 0 and worst == 0.0,
        numbers,
        {"tensors_differ": 0, "max_abs_diff": 0.0},
    )


def frequency_test(
    counts: dict[int, int], probs: dict[int, float], n: int, min_expected: float = 5.0, unlisted: int = 0
) -> dict:
    """Pearson's chi-square of `n` draws' token `counts` against the probabilities the engine returned for them. Tokens
    expected fewer than `min_expected` times are pooled with the mass of every token never drawn (1 - the returned
    probabilities' sum), so the test needs no access to the engine's full distribution. `unlisted` draws returned no
    token (a server that ends at a stop token without listing it): they belong to that never-listed mass.
    Returned probabilities summing past 1 cannot be one distribution: chi2 = inf."""
    mass = math.fsum(probs.values())
    if mass > 1 + 1e-6:
        return {"chi2": math.inf, "dof": 0, "prob_mass": mass}
    bins, pool_o, pool_e = [], unlisted, n * max(0.0, 1.0 - mass)
    for t, pr in sorted(probs.items()):
        if n * pr >= min_expected:
            bins.append((counts.get(t, 0), n * pr))
        else:
            pool_o, pool_e = pool_o + counts.get(t, 0), pool_e + n * pr
    if pool_e > 0:
        bins.append((pool_o, pool_e))
    elif pool_o:
        return {"chi2": math.inf, "dof": 0, "prob_mass": mass}
    chi2 = math.fsum((o - e) ** 2 / e for o, e in bins)
    return {"chi2": chi2, "dof": len(bins) - 1, "prob_mass": mass}


def sampling_semantics(make, model, p: dict, params: SamplingParams, spec) -> Probe:
    """The returned logprobs are those of the distribution actually sampled from (temperature / top-p applied
    once, processed not raw): `samples` one-token draws of each of `prompts` prompts, each draw its own request
    id (independent keyed sampling noise), token frequencies against the mean returned probability of each
    token by a chi-square test pooled over prompts; fails when p < `alpha`, the false-alarm rate of one run.
    A token's logprob may vary a little across draws (an engine that is not batch-invariant; that is the batch
    invariance probe's finding): `logprob_spread` reports it. Synthetic `noise=` perturbs each request's logits
    on purpose, so its draws come from different distributions and this test does not apply."""
    if getattr(getattr(spec, "noise", None), "kind", "none") != "none":
        return Probe(True, {}, note="not testable: noise= gives every request its own distribution")
    engine, n = make(model), p["samples"]
    chi2, dof, spread, mass, unlisted = 0.0, 0, 0.0, 0.0, 0
    for i, prompt in enumerate(_requests("gate:ss", model.config.vocab_size, p["prompts"], 1)):
        comps = engine.generate([Request(prompt.prompt_ids, 1, i * n + j) for j in range(n)], params)
        seen: dict[int, list[float]] = {}
        for c in comps:
            if c.token_ids:
                seen.setdefault(c.token_ids[0], []).append(float(c.logprobs[0]))
        empty = sum(not c.token_ids for c in comps)
        unlisted += empty
        spread = max([spread] + [max(v) - min(v) for v in seen.values()])
        probs = {t: math.fsum(math.exp(x) for x in v) / len(v) for t, v in seen.items()}
        r = frequency_test({t: len(v) for t, v in seen.items()}, probs, n, unlisted=empty)
        chi2, dof, mass = chi2 + r["chi2"], dof + r["dof"], max(mass, r["prob_mass"])
    p_value = 0.0 if chi2 == math.inf else chi2_sf(chi2, dof)
    numbers = {
        "draws": n * p["prompts"],
        "chi2": chi2,
        "dof": dof,
        "p_value": p_value,
        "max_prob_mass": mass,
        "logprob_spread": spread,
        **({"draws_unlisted": unlisted} if unlisted else {}),
    }
    return Probe(p_value >= p["alpha"], numbers, {"min_p_value": p["alpha"]})  # passes at p >= alpha


from .outcome import rl_outcome  # noqa: E402 - it builds on Probe above

PROBES: dict[str, Callable] = {
    "determinism": determinism,
    "batch_invariance": batch_invariance,
    "prefill_vs_decode": prefill_vs_decode,
    "alignment": alignment,
    "weight_sync": weight_sync,
    "sampling_semantics": sampling_semantics,
    "rl_outcome": rl_outcome,
}
"""Every probe by name, in the order a suite runs them. A probe gets its suite parameters plus `model`, the
suite model's name; a probe's `models:` list, when given, limits it to those of the suite's models."""
