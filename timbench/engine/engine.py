"""The rollout engine: continuous batching over a slot KV cache, prefill then decode.

Scheduling is plain Python (as in nano-vllm): waiting requests are admitted
into free cache slots and prefilled together; running ones decode one token a
step; a sequence that emits EOS or reaches its limit leaves at once, so the
batch shrinks and regroups as generation proceeds, which is exactly what
exposes batch-variant kernels. `generate_many` runs the requests under several
sampling parameter sets at once: one prefill per prompt, its keys/values forked
into a slot per set, one decode loop. Only `_prefill` and `_decode` touch tensors.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping

import torch

from ..model import Compute, ModelConfig, Qwen3ForCausalLM
from ..quant import QuantCache
from ..spec.keys import Spec, parse_spec
from .device import resolve_device
from .sampler import Draw, SamplingParams, draw, for_spec
from .score import EngineScores, score_sequences
from .sequence import Completion, Request, Sequence, check_request


class Engine:
    """Generates completions with a given engine spec; weights arrive from the trainer in memory."""

    def __init__(
        self, config: ModelConfig, spec: Spec | str | None = None, max_num_seqs: int = 256, max_len: int | None = None
    ):
        self.config = config
        self.spec = parse_spec(spec, "engine spec", side="engine")
        if self.spec.engine != "timbench":
            raise ValueError(
                f"Engine runs engine=timbench specs; use timbench.engine.make_engine for engine={self.spec.engine}"
            )
        self.compute = Compute.from_spec(self.spec)
        self.device = resolve_device(self.spec.device)
        self.model = Qwen3ForCausalLM(config).to(self.device, self.compute.dtype).eval().requires_grad_(False)
        # Engine weights change only in load_weights, so a kernel set may keep per-weight
        # layouts (exact: transposed fp32 copies) until then; load_weights invalidates them.
        self.compute.kernels.cache_weights(True)
        self.compute.quant_cache = QuantCache()  # quantized weights (weight_quant), likewise until load_weights
        self.max_num_seqs = max_num_seqs
        self.max_len = min(max_len or config.max_position_embeddings, config.max_position_embeddings)
        shape = (max_num_seqs, self.max_len, config.num_key_value_heads, config.head_dim)
        # Cache in fp32: values are already rounded to the activation dtype, so storing them
        # wider is exact and lets the fixed-order kernels read it without a conversion.
        self.k_cache = [torch.zeros(shape, device=self.device) for _ in range(config.num_hidden_layers)]
        self.v_cache = [torch.zeros(shape, device=self.device) for _ in range(config.num_hidden_layers)]

    # --- weights ----------------------------------------------------------------------------
    def load_weights(self, state: Mapping[str, torch.Tensor] | Qwen3ForCausalLM) -> None:
        """Copy weights in memory (the trainer -> engine sync), rounding to the engine dtype."""
        if isinstance(state, torch.nn.Module):
            state = state.state_dict()
        own = self.model.state_dict()
        missing = [k for k in own if k not in state and not k.startswith("lm_head")]
        if missing:
            raise ValueError(f"weight sync: missing tensors {missing[:3]}")
        with torch.no_grad():
            for k, p in own.items():
                if k in state:
                    p.copy_(state[k].detach().to(p.dtype))
        self.compute.kernels.invalidate_weights()
        self.compute.quant_cache.clear()

    # --- generation -------------------------------------------------------------------------
    def generate(self, requests: Iterable[Request], params: SamplingParams = SamplingParams()) -> list[Completion]:
        return self._generate(list(requests), [params])[0]

    def generate_many(self, requests: Iterable[Request], params: Iterable[SamplingParams]) -> list[list[Completion]]:
        """Every request under each of `params`: [generate(requests, p) for p in params], bitwise, in one run.

        A prompt is prefilled once and its keys/values copied into one cache slot per parameter set (the fork);
        the forks then decode in one loop, sampled per row with their own parameters. A request is admitted once
        a slot is free for each fork. Its completions equal the separate runs' because every row's logits, noise
        and sampling are functions of that row alone (the batch-invariant kernels; what `generate` relies on
        whatever the batch), which tests/test_engine_fork.py checks. Kernels that are not batch-invariant
        (`kernels=torch`) would give other bits in the shared batches, so there it runs one `generate` per set.
        """
        requests, params = list(requests), list(params)
        if not params:
            raise ValueError("generate_many: no sampling parameters")
        if len(params) > self.max_num_seqs:
            raise ValueError(
                f"generate_many: {len(params)} sampling parameter sets need as many cache slots per request, "
                f"the engine has max_num_seqs={self.max_num_seqs}"
            )
        if not self.compute.kernels.batch_invariant:
            return [self._generate(requests, [p])[0] for p in params]
        return self._generate(requests, params)

    def _generate(self, requests: list[Request], params: list[SamplingParams]) -> list[list[Completion]]:
        params = [for_spec(p, self.spec) for p in params]  # the condition's top_k / top_p
        for r in requests:
            check_request(r, self.max_len)
        forks = [[Sequence(r, fork=f) for r in requests] for f in range(len(params))]
        waiting = deque(range(len(requests)))
        free = list(range(self.max_num_seqs - 1, -1, -1))
        running: list[Sequence] = []
        done: dict[int, Completion] = {}
        with torch.inference_mode():
            while waiting or running:
                if waiting and len(free) >= len(params):
                    batch = []
                    while waiting and len(free) >= len(params):
                        i = waiting.popleft()
                        for seqs in forks:
                            seqs[i].slot = free.pop()
                        batch.append(i)
                    prefilled = [[seqs[i] for i in batch] for seqs in forks]
                    self._prefill(prefilled, params)
                    for seqs in prefilled:
                        running.extend(seqs)
                else:
                    self._decode(running, params)
                still = []
                for seq in running:
                    if seq.finish_reason is None:
                        still.append(seq)
                    else:
                        free.append(seq.slot)
                        done[id(seq)] = seq.to_completion()
                running = still
        return [[done[id(s)] for s in seqs] for seqs in forks]

    def score(
        self, seqs, params: SamplingParams = SamplingParams(), request_ids=None, levels: bool = False
    ) -> EngineScores:
        """Teacher-forced: each response token's logprob (and argmax) as this engine would report it.

        seqs: [(prompt_ids, response_ids)]; request_ids and params.seed key the logit noise as in
        `generate`. For a batch-invariant spec the scores are bitwise the logprobs `generate` returned.
        """
        return score_sequences(self.model, self.spec, seqs, request_ids, params.temperature, params.seed, levels)

    def _append(self, seqs: list[Sequence], d: Draw, full: bool = False) -> None:
        eos = self.config.eos_token_id
        # One conversion per tensor, not one indexing per row (the same Python ints and floats, and the same
        # [V] row views): this runs once per decode step for every running sequence.
        tokens, logprobs = d.tokens.tolist(), d.logprobs.tolist()
        support = None if d.support is None else d.support.unbind(0)
        rows = d.full.unbind(0) if full else None
        for i, seq in enumerate(seqs):
            t = tokens[i]
            seq.tokens.append(t)
            seq.logprobs.append(logprobs[i])
            if support is not None:
                seq.support.append(support[i])
            if full:
                seq.full_logprobs.append(rows[i])
            if t == eos:
                seq.finish_reason = "stop"
            elif len(seq.tokens) >= seq.request.max_new_tokens or seq.length >= self.max_len:
                seq.finish_reason = "length"

    def _sample(self, seqs, logits, params):
        req = torch.tensor([s.request.request_id for s in seqs])
        pos = torch.tensor([s.length for s in seqs])  # absolute position of the token to sample
        return draw(logits, params, req, pos, self.compute.kernels, self.compute.noise)  # the spec it carries

    def _tensor(self, values, dtype=torch.long):
        return torch.tensor(values, dtype=dtype, device=self.device)

    def _prefill(self, forks: list[list[Sequence]], params: list[SamplingParams]) -> None:
        """Prefill forks[0]'s prompts (every fork holds the same requests, in the same order) once; each fork
        gets the keys/values in its own slots and samples its first token from the same logits."""
        seqs = forks[0]
        lens = [len(s.request.prompt_ids) for s in seqs]
        width = max(lens)
        ids = torch.full((len(seqs), width), self.config.pad_token_id, dtype=torch.long)
        for i, s in enumerate(seqs):
            ids[i, : lens[i]] = torch.tensor(s.request.prompt_ids)
        ids = ids.to(self.device)
        slots = [self._tensor([s.slot for s in f]) for f in forks]

        def on_kv(layer, k, v):
            k, v = k.float(), v.float()
            for sl in slots:
                self.k_cache[layer][sl, :width] = k
                self.v_cache[layer][sl, :width] = v

        logits, routing = self.model(ids, self.compute, on_kv=on_kv)
        logits = logits[self._tensor(range(len(seqs))), self._tensor(lens) - 1]
        if routing is not None:
            for i in range(len(seqs)):
                r = routing[i, : lens[i]].cpu()
                for f in forks:
                    f[i].routes.append(r)
        for f, p in zip(forks, params):
            self._append(f, self._sample(f, logits, p), p.full_logprobs)

    def _decode(self, seqs: list[Sequence], params: list[SamplingParams]) -> None:
        ids = self._tensor([s.last_token for s in seqs])
        pos = self._tensor([s.length - 1 for s in seqs])
        slots = self._tensor([s.slot for s in seqs])
        logits, routing = self.model.decode(ids, pos, self.compute, self.k_cache, self.v_cache, slots)
        if routing is not None:
            # One split into per-row views (the same [1, ...] slices as routing[i : i + 1], a third of the cost).
            for s, r in zip(seqs, routing.cpu().split(1)):
                s.routes.append(r)
        if len(params) == 1:
            self._append(seqs, self._sample(seqs, logits, params[0]), params[0].full_logprobs)
            return
        # Forks sample apart, each from its own rows' logits (row-wise: the same bits as in a batch of its own).
        for f, p in enumerate(params):
            rows = [i for i, s in enumerate(seqs) if s.fork == f]
            if rows:
                part = [seqs[i] for i in rows]
                self._append(part, self._sample(part, logits[self._tensor(rows)], p), p.full_logprobs)
