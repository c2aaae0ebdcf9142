"""The kernel interface shared by the rollout engine and the trainer forward.

A model calls only these seven operations (and compositions of them: `tensor_parallel`) for arithmetic whose rounding
could depend on the batch; everything else it does is indexing or IEEE-exact
elementwise `+ - * /`, which no kernel choice can change. Swapping the kernel
set is therefore the whole difference between an engine and a trainer that
agree bitwise (`exact` on both sides) and a classic kernel mismatch.

Backward passes belong to the kernel set too: `exact` differentiates its ops
with fixed-order kernels (`numba_grad`), so gradients are the same on any CPU.
The two exact forwards whose PyTorch backward would reduce (the embedding
gather, the MoE gate scaling) use `fixed_grad` with every kernel set.
"""

from __future__ import annotations

from typing import Protocol

import torch


class KernelSet(Protocol):
    """Operations a kernel set provides. Shapes use B batch, T time, H heads, D head dim."""

    name: str
    batch_invariant: bool
    """Every row's outputs are a function of that row alone, whatever else shares its batch (what lets the engine
    batch several sampling sets of one prompt together, `Engine.generate_many`)."""

    def linear(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """x[..., K] @ w[N, K].T -> [..., N] (HF weight layout), in x's dtype."""

    def rmsnorm(self, x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
        """Qwen3 RMSNorm over the last dim."""

    def silu_mul(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        """SwiGLU activation silu(gate) * up."""

    def causal_attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Causal GQA attention within each row: q[B,T,H,D], k/v[B,T,Hkv,D] -> [B,T,H,D]."""

    def decode_attention(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        slots: torch.Tensor,
        lengths: torch.Tensor,
        splits: int = 1,
    ) -> torch.Tensor:
        """q[B,H,D] against keys 0..lengths[b]-1 of cache slot slots[b]; caches [S,Tmax,Hkv,D].

        splits > 1: split-KV (flash-decoding) over that many LSE-merged key chunks (`split_kv`).
        """

    def log_softmax(self, x: torch.Tensor) -> torch.Tensor:
        """fp32 log-softmax over the last dim."""

    def router_topk(
        self, logits: torch.Tensor, k: int, normalize: bool, experts: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """MoE router: softmax over experts, top-k, optional renormalisation -> (weights[N,k] fp32, experts[N,k]).

        Given `experts` (routing replay), those are used instead of the top-k choice;
        the weights are still this router's probabilities, so gradients reach it.
        """

    def cache_weights(self, enabled: bool = True) -> None:
        """Keep per-weight layouts between calls until `invalidate_weights` (no-op where nothing is cached).

        The engine enables this: its weights change only in `load_weights`.
        """

    def invalidate_weights(self) -> None:
        """Drop cached per-weight layouts because the weights changed (no-op where nothing is cached)."""
