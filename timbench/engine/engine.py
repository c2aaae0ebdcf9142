"""The rollout engine: continuous batching over a slot KV cache, prefill then decode.

Scheduling is plain Python (as in nano-vllm): waiting requests are admitted
into free cache slots and prefilled together; running ones decode one token a
step; a sequence that emits EOS or reaches its limit leaves at once, so the
batch shrinks and regroups as generation proceeds, which is exactly what
exposes batch-variant kernels. Only `_prefill` and `_decode` touch tensors.
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
        requests = list(requests)
        params = for_spec(params, self.spec)  # the condition's top_k / top_p
        for r in requests:
            check_request(r, self.max_len)
        order = [Sequence(r) for r in requests]
        waiting = deque(order)
        free = list(range(self.max_num_seqs - 1, -1, -1))
        running: list[Sequence] = []
        done: dict[int, Completion] = {}
        with torch.inference_mode():
            while waiting or running:
                if waiting and free:
                    batch = []
                    while waiting and free:
                        seq = waiting.popleft()
                        seq.slot = free.pop()
                        batch.append(seq)
                    self._prefill(batch, params)
                    running.extend(batch)
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
        return [done[id(s)] for s in order]

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

    def _prefill(self, seqs: list[Sequence], params: SamplingParams) -> None:
        lens = [len(s.request.prompt_ids) for s in seqs]
        width = max(lens)
        ids = torch.full((len(seqs), width), self.config.pad_token_id, dtype=torch.long)
        for i, s in enumerate(seqs):
            ids[i, : lens[i]] = torch.tensor(s.request.prompt_ids)
        ids, slots = ids.to(self.device), self._tensor([s.slot for s in seqs])

        def on_kv(layer, k, v):
            self.k_cache[layer][slots, :width] = k.float()
            self.v_cache[layer][slots, :width] = v.float()

        logits, routing = self.model(ids, self.compute, on_kv=on_kv)
        logits = logits[self._tensor(range(len(seqs))), self._tensor(lens) - 1]
        if routing is not None:
            for i, s in enumerate(seqs):
                s.routes.append(routing[i, : lens[i]].cpu())
        self._append(seqs, self._sample(seqs, logits, params), params.full_logprobs)

    def _decode(self, seqs: list[Sequence], params: SamplingParams) -> None:
        ids = self._tensor([s.last_token for s in seqs])
        pos = self._tensor([s.length - 1 for s in seqs])
        slots = self._tensor([s.slot for s in seqs])
        logits, routing = self.model.decode(ids, pos, self.compute, self.k_cache, self.v_cache, slots)
        if routing is not None:
            # One split into per-row views (the same [1, ...] slices as routing[i : i + 1], a third of the cost).
            for s, r in zip(seqs, routing.cpu().split(1)):
                s.routes.append(r)
        self._append(seqs, self._sample(seqs, logits, params), params.full_logprobs)
