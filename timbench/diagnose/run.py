"""`diagnose`: the align workload's rollouts scored by engine, trainer and the float64 reference, then attributed.

`diagnose_rollouts` is the library call: given a model, the (prompt, response)
token ids an engine produced and the logprobs it reported, it scores them with
the trainer spec and the reference and returns the JSON-ready report
(attribution, per-key shares, views, per-layer localisation). Training runs do
not save their rollouts today, so that call is the way to diagnose one: pass
the batch the loop had in hand. `diagnose` generates the `timbench align`
workload first (same prompts, sampling, engine batches and trainer mini-batches).
"""

from __future__ import annotations

import random

import torch

from ..align import ENGINE_BATCHES, TRAINER_BATCHES, workload
from ..engine import SamplingParams, make_engine, score_sequences
from ..kernels.pointwise import fexp
from ..kernels.reduce import fmean
from ..model import Qwen3ForCausalLM
from ..spec.keys import Spec, SpecError, parse_spec
from .attribution import _ms, attribute, changed_keys, errors, key_groups, key_shares
from .forward import REFERENCE, level_names, reference, score
from .layers import error_by_level, localise, stack_levels
from .views import by_argmax, by_position, by_probability, flip_rate, routing_by_layer


def align_groups(n: int, seed: int) -> list[list[int]]:
    """The trainer mini-batches `timbench align` uses: shuffled, sizes cycling TRAINER_BATCHES."""
    order = list(range(n))
    random.Random(f"align-trainer:{seed}").shuffle(order)
    sizes = iter(TRAINER_BATCHES * (n // sum(TRAINER_BATCHES) + 1))
    groups, i = [], 0
    while i < n:
        groups.append(order[i : i + next(sizes)])
        i += len(groups[-1])
    return groups


def _cat(xs) -> torch.Tensor:
    return torch.cat([torch.as_tensor(x).double().reshape(-1) for x in xs])


def _keys(model, es, ts, seqs, request_ids, temperature, seed, groups, lp_ref, own) -> dict:
    """One key at a time on each side: that key alone over the reference spec, its error vs the reference."""
    base_ms = _ms(_cat(score(model, Spec(), seqs, temperature).logprobs) - lp_ref)
    entries, notes = [], []
    sides = [("engine", es, ts), ("trainer", ts, es)]
    for side, spec, other in sides:
        if spec is None:
            continue
        other_keys = set(changed_keys(other)) if other is not None else set()
        groups_k = key_groups(spec, side)
        for label, s in groups_k:
            if side == "engine" and s.engine != "timbench":
                notes.append(f"engine key {label}: not replayable here (only timbench's engine path is)")
                continue
            if s == spec and side in own:  # the side's whole spec: its logprobs are already known
                lp = own[side]
            elif side == "engine":
                lp = _cat(score_sequences(model, s, seqs, request_ids, temperature, seed).logprobs)
            else:
                lp = _cat(score(model, s, seqs, temperature, groups).logprobs)
            shared = all(kv in other_keys for kv in changed_keys(s))
            entries.append({"side": side, "key": label, "ms": _ms(lp - lp_ref), "shared": shared})
    shares = key_shares(base_ms, entries)
    out = {"floor_rms": base_ms**0.5, "floor_spec": str(Spec()), "keys": shares, "notes": notes}
    for side in ("engine", "trainer"):  # additivity: floor + the side's key excesses vs its actual error
        exc = [k["excess_ms"] for k in shares if k["side"] == side]
        out[f"{side}_rms_from_keys"] = (base_ms + sum(exc)) ** 0.5 if exc else None
    return out


def diagnose_rollouts(
    model: Qwen3ForCausalLM,
    seqs,
    engine_logprobs,
    trainer_spec,
    engine_spec=None,
    request_ids=None,
    engine_routing=None,
    seed: int = 0,
    temperature: float = 1.0,
    groups=None,
    per_key: bool = True,
    layers: bool = True,
) -> dict:
    """Diagnose given rollouts: seqs [(prompt_ids, response_ids)], engine_logprobs [per seq [R]].

    engine_spec (optional) enables the engine replay: argmax flips, per-layer
    localisation and the engine's per-key shares; request_ids and seed must then be the
    ones the engine sampled with (they key its logit noise). engine_routing: MoE experts
    per seq [P+R-1, layers, k] as the engine reported them.
    """
    ts = parse_spec(trainer_spec, "trainer spec", side="trainer")
    es = parse_spec(engine_spec, "engine spec", side="engine") if engine_spec is not None else None
    if len(seqs) != len(engine_logprobs) or any(len(r) != len(lp) for (_, r), lp in zip(seqs, engine_logprobs)):
        raise ValueError("diagnose: engine_logprobs needs one logprob per response token of every sequence")
    replayable = es is not None and es.engine == "timbench"
    ref = reference(model, seqs, temperature, levels=layers and replayable)
    tr = score(model, ts, seqs, temperature, groups, levels=layers and replayable)
    lp_e, lp_t, lp_r = _cat(engine_logprobs), _cat(tr.logprobs), _cat(ref.logprobs)
    errs = errors(lp_e, lp_t, lp_r)
    tokens = torch.cat([torch.tensor(list(r), dtype=torch.long) for _, r in seqs])
    position = torch.cat([torch.arange(len(r)) for _, r in seqs])
    gap = errs["gap"].abs()
    report = {
        "sequences": len(seqs),
        "tokens": int(tokens.numel()),
        "reference": str(REFERENCE),
        "mean_abs_diff": float(fmean(gap)) if gap.numel() else 0.0,
        "max_abs_diff": float(gap.max()) if gap.numel() else 0.0,
        "attribution": attribute(lp_e, lp_t, lp_r),
    }
    views = {
        "probability": by_probability(errs, fexp(lp_r)),
        "position": by_position(errs, position),
        "argmax": by_argmax(errs, tokens == _cat(ref.argmax).long()),
        "argmax_flip_rate": None,
    }
    own = {"trainer": lp_t}
    if replayable:
        rep = score_sequences(model, es, seqs, request_ids, temperature, seed, levels=layers)
        lp_rep = _cat(rep.logprobs)
        own["engine"] = lp_rep
        report["replay_max_abs_diff"] = float((lp_rep - lp_e).abs().max()) if lp_e.numel() else 0.0
        views["argmax_flip_rate"] = flip_rate(_cat(rep.argmax), _cat(tr.argmax))
        if layers:
            names = level_names(model.config.num_hidden_layers)
            ev, tv, rv = stack_levels(rep.levels), stack_levels(tr.levels), stack_levels(ref.levels)
            report["layers"] = {
                **localise(ev, tv, lp_rep, lp_t, names),
                "engine_vs_reference": error_by_level(ev, rv, names),
                "trainer_vs_reference": error_by_level(tv, rv, names),
            }
    if engine_routing is not None and tr.routing[0] is not None:
        er = torch.cat([torch.as_tensor(x) for x in engine_routing])
        trr, rr = torch.cat(tr.routing), torch.cat(ref.routing)
        views["routing_disagreement_by_layer"] = {
            "engine_vs_trainer": routing_by_layer(er, trr),
            "engine_vs_reference": routing_by_layer(er, rr),
            "trainer_vs_reference": routing_by_layer(trr, rr),
        }
    report["views"] = views
    if per_key:
        report["keys"] = _keys(
            model, es if replayable else None, ts, seqs, request_ids, temperature, seed, groups, lp_r, own
        )
    return report


def diagnose(
    model: Qwen3ForCausalLM,
    engine_spec,
    trainer_spec,
    seed: int = 0,
    temperature: float = 1.0,
    batches=ENGINE_BATCHES,
    max_num_seqs: int = 64,
    per_key: bool = True,
    layers: bool = True,
) -> dict:
    """Generate the align workload with the engine spec, then `diagnose_rollouts` it."""
    es = parse_spec(engine_spec, "engine spec", side="engine")
    ts = parse_spec(trainer_spec, "trainer spec", side="trainer")
    if es.dtype == "fp64":
        raise SpecError(
            "engine spec: dtype=fp64 is the trainer-side reference (the engine's KV cache is fp32); "
            "valid engine dtypes: fp32, bf16, fp16"
        )
    cfg = model.config
    engine = make_engine(cfg, es, max_num_seqs=max_num_seqs, weights=model)
    params = SamplingParams(temperature=temperature, seed=seed)
    comps = []
    for call in workload(seed, cfg.vocab_size, cfg.max_position_embeddings, batches):
        comps.extend(engine.generate(call, params))
    seqs = [(tuple(c.prompt_ids), tuple(c.token_ids)) for c in comps]
    routing = [c.routing for c in comps] if comps and comps[0].routing is not None else None
    body = diagnose_rollouts(
        model,
        seqs,
        [c.logprobs for c in comps],
        ts,
        es,
        [c.request_id for c in comps],
        routing,
        seed,
        temperature,
        align_groups(len(comps), seed),
        per_key,
        layers,
    )
    return {
        "model": cfg.model_type,
        "engine": str(es),
        "trainer": str(ts),
        "seed": seed,
        "temperature": temperature,
        **body,
    }
