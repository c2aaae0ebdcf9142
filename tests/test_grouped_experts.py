"""The exact kernels' grouped expert call gives the per-expert loop's bits: outputs and every gradient.

The loop (`Qwen3ForCausalLM._experts_loop`) is the reference; the grouped call
(`timbench.kernels.grouped_experts`) must match it bit for bit on ragged routings (an expert with no tokens,
one expert taking every token, the router's own choice), k = 1, 2 and 3 (with three experts a token's
gradient sums in an order that matters), fp32 and bf16, 1 and 2 threads, and with
the router in fp32 under bf16 activations. Routings are forced through routing replay, so the gate weights
still get gradients. Paths the grouped call cannot reproduce keep the loop.
"""

from __future__ import annotations

import dataclasses
from unittest import mock

import numba
import pytest
import torch

from timbench.kernels import grouped_experts
from timbench.model import PRESETS, Compute, Qwen3ForCausalLM, qwen3
from timbench.spec.keys import ZERO_MISMATCH

B, T, LAYERS = 3, 7, 2


def _int_view(t: torch.Tensor) -> torch.Tensor:
    return t.view({torch.float32: torch.int32, torch.bfloat16: torch.int16}[t.dtype])


def _routing(kind: str, k: int, n_experts: int) -> torch.Tensor | None:
    """A replayed routing [B, T, layers, k] (distinct experts per token), or None for the router's own."""
    if kind == "router":
        return None
    g = torch.Generator().manual_seed(k)
    if kind == "one_expert_all_tokens":  # expert 3 is every token's first choice; 0-2 get none
        first = torch.full((B, T, LAYERS, 1), 3)
        second = torch.randint(4, n_experts - 1, first.shape, generator=g)
        third = second + 1
    else:  # "empty_expert": experts 0 and n-1 get no token at all
        first = torch.randint(1, n_experts - 1, (B, T, LAYERS, 1), generator=g)
        second = first % (n_experts - 2) + 1  # in 1..n-2, never first
        third = second % (n_experts - 2) + 1  # likewise, never first or second (n - 2 > 2)
    return torch.cat([first, second, third][:k], dim=-1)


def _run(grouped: bool, dtype: str, k: int, threads: int, replay, router_dtype: str = "auto"):
    cfg = dataclasses.replace(PRESETS["tiny-moe"], num_experts_per_tok=k, num_hidden_layers=LAYERS)
    model = Qwen3ForCausalLM(cfg, seed=3)
    c = Compute.from_spec(ZERO_MISMATCH.override({"dtype": dtype, "router_dtype": router_dtype}))
    ids = torch.randint(0, cfg.vocab_size, (B, T), generator=torch.Generator().manual_seed(5))
    old = numba.get_num_threads()
    numba.set_num_threads(threads)
    calls = mock.Mock(wraps=grouped_experts.expert_mlps)
    try:
        with (
            mock.patch.object(qwen3, "_grouped", qwen3._grouped if grouped else (lambda *a: False)),
            mock.patch.object(grouped_experts, "expert_mlps", calls),
        ):
            logits, routing = model(ids, c, replay=replay)
            lp = c.kernels.log_softmax(logits)
            # A loss that weights every position differently, so each token's gradient is distinct.
            (lp[..., :5] * torch.linspace(-1.0, 1.0, T)[None, :, None]).sum().backward()
    finally:
        numba.set_num_threads(old)
    assert calls.call_count == (LAYERS if grouped else 0)  # the path under test really ran
    return logits.detach(), routing, {n: p.grad for n, p in model.named_parameters()}


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("k", [1, 2, 3])
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("kind", ["router", "empty_expert", "one_expert_all_tokens"])
def test_grouped_experts_match_the_loop_bit_for_bit(kind, threads, k, dtype):
    n_experts = PRESETS["tiny-moe"].num_experts
    replay = _routing(kind, k, n_experts)
    want_logits, want_routing, want = _run(False, dtype, k, threads, replay)
    got_logits, got_routing, got = _run(True, dtype, k, threads, replay)
    if replay is not None:
        used = set(replay.unique().tolist())
        assert used != set(range(n_experts))  # an expert had no token
        assert replay[..., 0].eq(3).all() or kind != "one_expert_all_tokens"
    assert torch.equal(want_routing, got_routing)
    assert torch.equal(_int_view(want_logits), _int_view(got_logits))
    for name, g in want.items():
        if g is None:  # an expert no token reached has no gradient in either path
            assert got[name] is None, name
            continue
        assert got[name] is not None, name
        assert torch.equal(_int_view(g), _int_view(got[name])), name
    assert any(g is not None and g.abs().sum() > 0 for n, g in got.items() if "experts" in n)


@pytest.mark.parametrize("threads", [1, 2])
def test_bf16_with_an_fp32_router_matches_the_loop(threads):
    replay = _routing("empty_expert", 2, PRESETS["tiny-moe"].num_experts)
    want_logits, _, want = _run(False, "bf16", 2, threads, replay, router_dtype="fp32")
    got_logits, _, got = _run(True, "bf16", 2, threads, replay, router_dtype="fp32")
    assert torch.equal(_int_view(want_logits), _int_view(got_logits))
    for name, g in want.items():
        assert (g is None) == (got[name] is None), name
        assert g is None or torch.equal(_int_view(g), _int_view(got[name])), name


def test_paths_it_cannot_reproduce_keep_the_loop():
    flat = torch.zeros(4, 8)
    experts = torch.tensor([[0, 1], [1, 2], [2, 3], [3, 0]])
    assert qwen3._grouped(Compute.from_spec(ZERO_MISMATCH), flat, experts)
    for change in (
        {"kernels": "torch"},
        {"tp": "2"},
        {"weight_quant": "fp8"},
        {"weight_quant": "fp8", "act_quant": "fp8"},
    ):
        c = Compute.from_spec(ZERO_MISMATCH.override(change))
        assert not qwen3._grouped(c, flat, experts), change
    c = Compute.from_spec(ZERO_MISMATCH)
    assert not qwen3._grouped(c, flat, torch.tensor([[0, 0], [1, 2], [2, 3], [3, 0]]))  # a token's experts repeat
    assert not qwen3._grouped(c, flat.double(), experts)  # the float64 reference path
    assert not qwen3._grouped(c, flat.half(), experts)  # fp16: not compared here, so the loop
    c.kernels.mma_accum = dataclasses.replace(c.kernels.mma_accum, block=4)
    assert not qwen3._grouped(c, flat, experts)


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_a_forward_without_autograd_matches_the_loop(dtype):
    # The engine's path (prefill and decode run under no_grad): nothing kept for a backward, the same bits.
    cfg = dataclasses.replace(PRESETS["tiny-moe"], num_hidden_layers=LAYERS)
    model = Qwen3ForCausalLM(cfg, seed=4)
    c = Compute.from_spec(ZERO_MISMATCH.override({"dtype": dtype}))
    ids = torch.randint(0, cfg.vocab_size, (B, T), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        got, got_routing = model(ids, c)
        with mock.patch.object(qwen3, "_grouped", lambda *a: False):
            want, want_routing = model(ids, c)
    assert torch.equal(want_routing, got_routing)
    assert torch.equal(_int_view(want), _int_view(got))
