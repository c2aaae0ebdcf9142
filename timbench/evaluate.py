"""Task accuracy of a model: generate with the rollout engine, score with the task's verifier.

Deterministic: request ids are the problems' indices in the list given (the
eval set's order), the sampling seed is explicit, and the engine's noise is
keyed by (seed, request id, position), so with `kernels=exact` the result is a
pure function of (weights, problems, temperature, seed), whatever the batch
size `max_num_seqs`. `evaluate_both` runs its two temperatures as one engine run
where the engine can (`generate_many`: one prefill per prompt, one decode loop),
with the same result as two.
"""

from __future__ import annotations

from collections.abc import Sequence
from statistics import mean

from .data import decode_response, max_new_tokens, requests_for
from .engine import SamplingParams, make_engine
from .metrics.schema import ACCURACY_GREEDY, ACCURACY_T1
from .spec.keys import Spec


def evaluate(
    model,
    task,
    problems: Sequence,
    engine_spec: Spec | str = "kernels=exact",
    temperature: float = 1.0,
    seed: int = 0,
    max_num_seqs: int = 256,
    engine=None,
) -> dict:
    """Mean reward of `model` on `problems` at `temperature` (0 = greedy).

    Returns {"accuracy", "n", "mean_response_tokens" (incl. EOS), "truncated" (fraction
    cut at the token limit), "temperature", "seed"}. `engine_spec` may name any backend
    (`engine=vllm` too). Pass `engine` to reuse one whose weights are already `model`'s
    (`model` is then not read).
    """
    problems = list(problems)
    if not problems:
        raise ValueError("evaluate: no problems")
    if engine is None:
        engine = make_engine(model.config, engine_spec, max_num_seqs=min(max_num_seqs, len(problems)), weights=model)
    outs = engine.generate(_requests(task, problems, engine), SamplingParams(temperature=temperature, seed=seed))
    return _score(task, problems, outs, temperature, seed)


def _requests(task, problems: list, engine) -> list:
    return requests_for(problems, range(len(problems)), max_new_tokens(task, engine.max_len))


def _score(task, problems: list, outs: list, temperature: float, seed: int) -> dict:
    """`evaluate`'s result from the completions of `problems`."""
    rewards = [task.reward(decode_response(o.token_ids), p) for o, p in zip(outs, problems)]
    return {
        "accuracy": mean(rewards),
        "n": len(problems),
        "mean_response_tokens": mean(len(o.token_ids) for o in outs),
        "truncated": mean(o.finish_reason == "length" for o in outs),
        "temperature": temperature,
        "seed": seed,
    }


def both_slots(n_problems: int, max_num_seqs: int = 512) -> int:
    """Engine slots for `evaluate_both` on `n_problems` with every fork in flight: two per problem (its T=1 and
    greedy sequences), at most `max_num_seqs`. The result does not depend on it; the speed does."""
    return min(max_num_seqs, 2 * n_problems)


def evaluate_both(
    model,
    task,
    problems: Sequence,
    engine_spec: Spec | str = "kernels=exact",
    seed: int = 0,
    max_num_seqs: int = 512,
    engine=None,
) -> dict:
    """Accuracy at T=1 (seeded) and greedy, from one engine:
    {"accuracy_t1", "accuracy_greedy", "n", "mean_response_tokens_t1", "mean_response_tokens_greedy"}.

    An engine with `generate_many` (timbench's) runs both as one: each prompt prefilled once, its two forks
    decoded in one loop (each problem takes two of the engine's `max_num_seqs` slots); one without it
    (vLLM) runs `evaluate` twice. The result is the same either way.
    """
    problems = list(problems)
    if not problems:
        raise ValueError("evaluate: no problems")
    if engine is None:
        n = both_slots(len(problems), max_num_seqs)
        engine = make_engine(model.config, engine_spec, max_num_seqs=n, weights=model)
    t1_params, gr_params = SamplingParams(temperature=1.0, seed=seed), SamplingParams(temperature=0.0, seed=seed)
    generate_many = getattr(engine, "generate_many", None)
    if generate_many is not None and engine.max_num_seqs >= 2:
        t1_outs, gr_outs = generate_many(_requests(task, problems, engine), [t1_params, gr_params])
        t1 = _score(task, problems, t1_outs, 1.0, seed)
        gr = _score(task, problems, gr_outs, 0.0, seed)
    else:
        t1 = evaluate(model, task, problems, temperature=1.0, seed=seed, engine=engine)
        gr = evaluate(model, task, problems, temperature=0.0, seed=seed, engine=engine)
    return {
        ACCURACY_T1: t1["accuracy"],
        ACCURACY_GREEDY: gr["accuracy"],
        "n": t1["n"],
        "mean_response_tokens_t1": t1["mean_response_tokens"],
        "mean_response_tokens_greedy": gr["mean_response_tokens"],
    }
