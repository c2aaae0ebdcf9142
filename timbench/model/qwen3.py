"""The Qwen3 / Qwen3-MoE decoder, one definition for the engine and the trainer.

Parameters are named exactly as in Hugging Face checkpoints, so `state_dict()`
is the checkpoint. All batch-sensitive arithmetic goes through the kernel set
passed in (never a module default), and weights are cast to the compute dtype
on the fly, so an fp32 master copy computing in bf16 and an engine that stores
bf16 weights see the same bits.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from ..kernels import KernelSet, get_kernels, grouped_experts
from ..kernels import rope as fused_rope
from ..kernels.exact_kernels import ExactKernels
from ..kernels.fixed_grad import embed, scale_rows
from ..kernels.noise_ops import row_keyed_normal
from ..kernels.tensor_parallel import row_parallel_linear
from ..quant import QuantCache
from ..quant.aligned import RolloutCodes
from ..spec.keys import ZERO_MISMATCH, Spec
from . import quantized as Q
from .config import ModelConfig


@dataclass
class Compute:
    """How to run a forward: a kernel set instance and the parsed spec of one side.

    The spec is carried whole, not mirrored field by field: every spec key reads
    through (`compute.tp`, `compute.weight_quant`, and any key added to
    `timbench.spec.keys.SPEC_KEYS` later), and only the dtypes are resolved to torch
    dtypes here.
    """

    kernels: KernelSet
    spec: Spec = ZERO_MISMATCH
    """The side's spec (`timbench.spec.keys.Spec`); its kernels name is the kernel set's."""
    quant_cache: QuantCache | None = None
    """Quantized weights kept between forwards (the engine's `timbench.quant.QuantCache`, cleared at each
    weight sync); None = quantize at every forward (a trainer)."""
    rollout_codes: RolloutCodes | None = None
    """A trainer's rounding-aligned quantization (`timbench.quant.aligned.RolloutCodes`): the codewords the
    rollout's weights used, which its quantized weights round toward; None = round to nearest."""

    def __post_init__(self):
        # Kernel options that the spec selects reach the kernel set here, whichever way the Compute was made.
        accum = getattr(self.spec, "mma_accum", None)
        if accum is not None and accum.block is not None:
            if not hasattr(self.kernels, "mma_accum"):
                raise ValueError(f"mma_accum={accum} needs kernels=exact (got kernels={self.kernels.name})")
            self.kernels.mma_accum = accum

    @classmethod
    def from_spec(cls, spec: Spec) -> Compute:
        """The Compute a `timbench.spec.keys.Spec` asks for (a fresh kernel set instance)."""
        return cls(get_kernels(spec.kernels), spec)

    @property
    def dtype(self) -> torch.dtype:
        """Weights and activations."""
        return self.spec.torch_dtype

    @property
    def logits_dtype(self) -> torch.dtype:
        """LM-head matmul dtype (auto resolved to `dtype`)."""
        return self.spec.torch_logits_dtype

    @property
    def router_dtype(self) -> torch.dtype:
        """MoE gate matmul dtype (auto resolved to `dtype`)."""
        return self.spec.torch_router_dtype

    def __getattr__(self, name: str):
        # Only called for names that are not attributes: the spec's keys (router_noise, tp, attn_splits, ...).
        if name.startswith("__") or "spec" not in self.__dict__:
            raise AttributeError(name)
        return getattr(self.spec, name)


def _grouped(c: Compute, flat: torch.Tensor, experts: torch.Tensor) -> bool:
    """Whether the experts run as one grouped call (`timbench.kernels.grouped_experts`), bit for bit the loop.

    Only the exact kernels have it, and only where the loop's arithmetic is the plain linear: no quantized
    weights or inputs, no simulated tensor parallelism, no blocked K accumulation (`mma_accum`).
    """
    return (
        isinstance(c.kernels, ExactKernels)
        and c.kernels.mma_accum.block is None
        and c.tp == 1
        and c.weight_quant == "none"
        and c.act_quant == "none"
        and grouped_experts.applies(flat, experts)
    )


def rope_table(cfg: ModelConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin [max_pos, head_dim], HF layout (frequencies repeated twice), built with scalar math.

    Scalar `math.cos` in float64 makes the table a pure function of the config:
    no vectorised transcendental whose result could depend on the tensor size.
    """
    half = cfg.head_dim // 2
    inv = [1.0 / (cfg.rope_theta ** (2 * i / cfg.head_dim)) for i in range(half)]
    ang = [[p * f for f in inv] * 2 for p in range(cfg.max_position_embeddings)]
    cos = torch.tensor([[math.cos(a) for a in row] for row in ang], dtype=torch.float64).float()
    sin = torch.tensor([[math.sin(a) for a in row] for row in ang], dtype=torch.float64).float()
    return cos, sin


def _rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


class _Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        d, hd = cfg.hidden_size, cfg.head_dim
        self.q_proj = nn.Linear(d, cfg.num_attention_heads * hd, bias=False)
        self.k_proj = nn.Linear(d, cfg.num_key_value_heads * hd, bias=False)
        self.v_proj = nn.Linear(d, cfg.num_key_value_heads * hd, bias=False)
        self.o_proj = nn.Linear(cfg.num_attention_heads * hd, d, bias=False)
        self.q_norm = _RMSNorm(hd)
        self.k_norm = _RMSNorm(hd)


class _RMSNorm(nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))


class _MLP(nn.Module):
    def __init__(self, d: int, inter: int):
        super().__init__()
        self.gate_proj = nn.Linear(d, inter, bias=False)
        self.up_proj = nn.Linear(d, inter, bias=False)
        self.down_proj = nn.Linear(inter, d, bias=False)


class _Router(nn.Module):
    def __init__(self, d: int, n_experts: int):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(n_experts, d))


class _SparseMoE(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.gate = _Router(cfg.hidden_size, cfg.num_experts)
        self.experts = nn.ModuleList(_MLP(cfg.hidden_size, cfg.moe_intermediate_size) for _ in range(cfg.num_experts))


class _Layer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.self_attn = _Attention(cfg)
        self.mlp = _SparseMoE(cfg) if cfg.is_moe else _MLP(cfg.hidden_size, cfg.intermediate_size)
        self.input_layernorm = _RMSNorm(cfg.hidden_size)
        self.post_attention_layernorm = _RMSNorm(cfg.hidden_size)


class _Backbone(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(_Layer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = _RMSNorm(cfg.hidden_size)


# attend(layer_index, q, k, v) -> attention output; supplied by the caller (prefill or decode).
AttendFn = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


class Qwen3ForCausalLM(nn.Module):
    """Qwen3 (dense or MoE) with HF parameter names. Forward passes take an explicit `Compute`."""

    def __init__(self, cfg: ModelConfig, seed: int = 0):
        super().__init__()
        self.config = cfg
        self.model = _Backbone(cfg)
        if not cfg.tie_word_embeddings:
            self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        cos, sin = rope_table(cfg)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.reset_parameters(seed)

    def reset_parameters(self, seed: int) -> None:
        """HF-style init (normal std 0.02, norms 1) from an explicit generator."""
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, p in self.named_parameters():
                if name.endswith("norm.weight"):
                    p.fill_(1.0)
                else:
                    p.copy_(torch.randn(p.shape, generator=g) * 0.02)

    @property
    def lm_head_weight(self) -> torch.Tensor:
        return self.model.embed_tokens.weight if self.config.tie_word_embeddings else self.lm_head.weight

    # --- the shared block stack -------------------------------------------------------------
    def _rope(self, x, pos, dtype):
        if dtype == torch.float32 and fused_rope.applies(x, self.rope_cos):  # the same bits, one pass
            return fused_rope.rope(x, pos, self.rope_cos, self.rope_sin)
        cos = self.rope_cos[pos].to(dtype).unsqueeze(-2)
        sin = self.rope_sin[pos].to(dtype).unsqueeze(-2)
        return x * cos + _rotate_half(x) * sin

    def _moe(self, x, moe: _SparseMoE, c: Compute, replay, layer: int):
        """Top-k experts per token; outputs summed in rank order (fixed, so exact stays exact)."""
        cfg, kn = self.config, c.kernels
        flat = x.reshape(-1, x.shape[-1])
        rd = c.router_dtype or c.dtype
        # Weights are stored in `dtype` on an engine; casting through it first makes a trainer's
        # fp32 master weights round the same way, so router_dtype alone is never a mismatch.
        logits = kn.linear(flat.to(rd), moe.gate.weight.to(c.dtype).to(rd))
        if c.router_noise > 0:
            z = row_keyed_normal(logits.detach().float().contiguous().numpy(), layer)
            logits = logits.float() + c.router_noise * torch.from_numpy(z)
        if replay is not None:  # [..., k] in the caller's token layout -> one row per token, as the router
            replay = replay.reshape(-1, replay.shape[-1])
        weights, experts = kn.router_topk(logits, cfg.num_experts_per_tok, cfg.norm_topk_prob, replay)
        weights = weights.to(c.dtype)
        if _grouped(c, flat, experts):
            per_rank = grouped_experts.expert_mlps(
                c.kernels, flat, weights, experts, cfg.num_experts, lambda e, n: self._expert_weight(moe, e, n, c)
            )
        else:
            per_rank = self._experts_loop(flat, weights, experts, moe, c)
        out = per_rank[:, 0]
        for r in range(1, cfg.num_experts_per_tok):
            out = out + per_rank[:, r]
        return out.reshape(x.shape), experts

    def _experts_loop(self, flat, weights, experts, moe: _SparseMoE, c: Compute):
        """per_rank [T, k, D]: each token's k expert outputs scaled by its gate weights, one expert at a time."""
        per_rank = torch.zeros(*experts.shape, flat.shape[1], dtype=c.dtype, device=flat.device)
        for e in torch.unique(experts).tolist():
            tok, rank = torch.nonzero(experts == e, as_tuple=True)
            y = self._mlp(flat[tok], moe.experts[e], c)
            # (token, rank) pairs are unique, so the scatter has no accumulation order.
            per_rank.index_put_((tok, rank), scale_rows(y, weights[tok, rank]))
        return per_rank

    @staticmethod
    def _expert_weight(moe: _SparseMoE, e: int, name: str, c: Compute):
        return Q.weight(getattr(moe.experts[e], name).weight, c)

    def _mlp(self, x, mlp: _MLP, c: Compute):
        kn = c.kernels
        x = Q.act(x, c)
        h = kn.silu_mul(kn.linear(x, Q.weight(mlp.gate_proj.weight, c)), kn.linear(x, Q.weight(mlp.up_proj.weight, c)))
        return row_parallel_linear(kn, Q.act(h, c), Q.weight(mlp.down_proj.weight, c), c.tp, c.tp_reduce)

    def _blocks(self, ids, pos, attend: AttendFn, c: Compute, replay=None, hiddens: list | None = None):
        """Embed, run all decoder layers and the final norm over tokens of any leading shape.

        `hiddens` (a list, default None: off) receives the residual stream after each layer, then the
        final-normed hidden state (`timbench diagnose`'s levels).

        Returns (hidden, routing) with routing [*ids.shape, layers, k] for MoE, else None.
        """
        cfg, kn, dt = self.config, c.kernels, c.dtype
        h = embed(self.model.embed_tokens.weight.to(dt), ids)
        lead = ids.shape
        routes = []
        for i, layer in enumerate(self.model.layers):
            at = layer.self_attn
            x = Q.act(kn.rmsnorm(h, layer.input_layernorm.weight.to(dt), cfg.rms_norm_eps), c)
            q = kn.linear(x, Q.weight(at.q_proj.weight, c)).view(*lead, cfg.num_attention_heads, cfg.head_dim)
            k = kn.linear(x, Q.weight(at.k_proj.weight, c)).view(*lead, cfg.num_key_value_heads, cfg.head_dim)
            v = kn.linear(x, Q.weight(at.v_proj.weight, c)).view(*lead, cfg.num_key_value_heads, cfg.head_dim)
            q = self._rope(kn.rmsnorm(q, at.q_norm.weight.to(dt), cfg.rms_norm_eps), pos, dt)
            k = self._rope(kn.rmsnorm(k, at.k_norm.weight.to(dt), cfg.rms_norm_eps), pos, dt)
            # Keys and values as the KV cache stores them; prefill and decode both attend to the stored values.
            a = attend(i, q, Q.kv(k, c), Q.kv(v, c)).reshape(*lead, cfg.num_attention_heads * cfg.head_dim)
            h = h + row_parallel_linear(kn, Q.act(a, c), Q.weight(at.o_proj.weight, c), c.tp, c.tp_reduce)
            x = kn.rmsnorm(h, layer.post_attention_layernorm.weight.to(dt), cfg.rms_norm_eps)
            if cfg.is_moe:
                y, experts = self._moe(x, layer.mlp, c, None if replay is None else replay[..., i, :], i)
                routes.append(experts.reshape(*lead, -1))
            else:
                y = self._mlp(x, layer.mlp, c)
            h = h + y
            if hiddens is not None:
                hiddens.append(h)
        h = kn.rmsnorm(h, self.model.norm.weight.to(dt), cfg.rms_norm_eps)
        if hiddens is not None:
            hiddens.append(h)
        return h, (torch.stack(routes, dim=-2) if routes else None)

    def logits(self, h, c: Compute) -> torch.Tensor:
        ld = c.logits_dtype or c.dtype
        return c.kernels.linear(h.to(ld), self.lm_head_weight.to(c.dtype).to(ld))  # via dtype: see _moe

    # --- entry points -----------------------------------------------------------------------
    def forward(
        self,
        ids: torch.Tensor,
        c: Compute,
        replay: torch.Tensor | None = None,
        on_kv: Callable[[int, torch.Tensor, torch.Tensor], None] | None = None,
        hiddens: list | None = None,
    ):
        """Full causal forward (the trainer's, and the engine's prefill) over right-padded rows ids[B, T].

        Returns (logits[B,T,V], routing). `on_kv(layer, k, v)` lets the engine copy prefill keys/values
        into its cache. `replay` [B, T, layers, k] fixes the experts (routing replay); gate weights stay
        live. `hiddens` (a list) receives each layer's residual stream and the final-normed state.
        """
        if ids.shape[1] > self.config.max_position_embeddings:
            raise ValueError(
                f"sequence length {ids.shape[1]} exceeds max_position_embeddings={self.config.max_position_embeddings}"
            )
        pos = torch.arange(ids.shape[1], device=ids.device).expand(ids.shape)

        def attend(i, q, k, v):
            if on_kv is not None:
                on_kv(i, k, v)
            return c.kernels.causal_attention(q, k, v)

        h, routing = self._blocks(ids, pos, attend, c, replay, hiddens)
        return self.logits(h, c), routing

    def decode(
        self,
        ids: torch.Tensor,
        pos: torch.Tensor,
        c: Compute,
        k_cache: list,
        v_cache: list,
        slots: torch.Tensor,
        hiddens: list | None = None,
    ):
        """One token per sequence: ids[B] at positions pos[B], attending to its cache slot.

        Writes the token's keys/values into k_cache[layer][slots, pos] (any float dtype: values are
        rounded to the activation dtype first, so a wider cache is exact). `hiddens` as in `forward`.
        """

        def attend(i, q, k, v):
            k_cache[i][slots, pos] = k.to(k_cache[i].dtype)
            v_cache[i][slots, pos] = v.to(v_cache[i].dtype)
            return c.kernels.decode_attention(q, k_cache[i], v_cache[i], slots, pos + 1, c.attn_splits)

        h, routing = self._blocks(ids, pos, attend, c, hiddens=hiddens)
        return self.logits(h, c), routing
