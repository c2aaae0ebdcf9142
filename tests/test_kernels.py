"""Kernel sets: exact ops are bitwise batch-invariant and numerically right; gradients flow."""

import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from timbench.kernels import get_kernels

EX, TO = get_kernels("exact"), get_kernels("torch")
SETTINGS = settings(max_examples=15, deadline=None)


def _rand(seed, *shape, dtype=torch.float32):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


@SETTINGS
@given(
    m=st.integers(1, 70),
    k=st.sampled_from([32, 128, 256]),
    n=st.sampled_from([7, 98, 384]),
    seed=st.integers(0, 10_000),
    dtype=st.sampled_from([torch.float32, torch.bfloat16]),
)
def test_linear_rows_do_not_depend_on_batch(m, k, n, seed, dtype):
    x, w = _rand(seed, 80, k, dtype=dtype), _rand(seed + 1, n, k, dtype=dtype)
    full = EX.linear(x, w)
    perm = torch.randperm(80, generator=torch.Generator().manual_seed(seed))[:m]
    part = EX.linear(x[perm], w)
    assert torch.equal(part, full[perm])
    ref = (x.double() @ w.double().t()).float()
    tol = dict(rtol=8e-3, atol=1e-2) if dtype == torch.bfloat16 else dict(rtol=1e-5, atol=1e-4)  # bf16: 8 mantissa bits
    assert torch.allclose(full.float(), ref, **tol)


@SETTINGS
@given(m=st.integers(1, 40), seed=st.integers(0, 10_000))
def test_rowwise_ops_do_not_depend_on_batch(m, seed):
    x, g = _rand(seed, 48, 99), _rand(seed + 1, 48, 99)
    w = _rand(seed + 2, 99)
    for f in (lambda a: EX.rmsnorm(a, w, 1e-6), EX.log_softmax, lambda a: EX.silu_mul(a, a * 0.5)):
        assert torch.equal(f(x[:m]), f(x)[:m])
        assert torch.equal(f(x[-m:]), f(x)[-m:])
    assert torch.allclose(EX.rmsnorm(x, w, 1e-6), TO.rmsnorm(x, w, 1e-6), atol=1e-5)
    assert torch.allclose(EX.log_softmax(x), TO.log_softmax(x), atol=1e-5)
    assert torch.allclose(EX.silu_mul(x, g), TO.silu_mul(x, g), atol=1e-5)


def test_causal_attention_equals_decode_against_cache():
    b, t, h, kvh, d = 3, 11, 4, 2, 32
    q, k, v = _rand(0, b, t, h, d), _rand(1, b, t, kvh, d), _rand(2, b, t, kvh, d)
    full = EX.causal_attention(q, k, v)
    assert torch.allclose(full, TO.causal_attention(q, k, v), atol=1e-5)
    # Decode each position against a cache laid out in other slots than the batch order.
    cache_k, cache_v = torch.zeros(5, 16, kvh, d), torch.zeros(5, 16, kvh, d)
    slots = torch.tensor([4, 0, 2])
    cache_k[slots, :t], cache_v[slots, :t] = k, v
    for pos in range(t):
        for rows in ([0, 1, 2], [2], [1, 0]):
            r = torch.tensor(rows)
            out = EX.decode_attention(q[r, pos], cache_k, cache_v, slots[r], torch.full((len(rows),), pos + 1))
            assert torch.equal(out, full[r, pos])
    ref = TO.decode_attention(q[:, 5], cache_k, cache_v, slots, torch.full((3,), 6))
    assert torch.allclose(ref, full[:, 5], atol=1e-5)


def test_router_topk_ties_and_renormalisation():
    logits = torch.tensor([[1.0, 3.0, 3.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    w, e = EX.router_topk(logits, 2, True)
    assert e.tolist() == [[1, 2], [0, 1]]  # ties go to the lower expert id
    assert torch.allclose(w, torch.full((2, 2), 0.5))
    w2, e2 = EX.router_topk(logits, 2, True, experts=torch.tensor([[0, 3], [2, 3]]))
    assert e2.tolist() == [[0, 3], [2, 3]]
    assert torch.allclose(w2.sum(-1), torch.ones(2))


def test_exact_gradients_match_torch():
    x = _rand(0, 6, 32).requires_grad_()
    w = _rand(1, 16, 32).requires_grad_()
    nw = _rand(2, 16).requires_grad_()
    grads = []
    for kn in (EX, TO):
        y = kn.log_softmax(kn.rmsnorm(kn.linear(x, w), nw, 1e-6))
        gx, gw, gn = torch.autograd.grad(y[:, 3].sum(), [x, w, nw])
        grads.append((gx, gw, gn))
    for a, b in zip(*grads):
        assert torch.allclose(a, b, atol=1e-5)


def test_unknown_kernel_set_is_a_clear_error():
    import pytest

    with pytest.raises(ValueError, match="valid: exact, torch"):
        get_kernels("triton")


# --- fixed-order backward vs float64 autograd --------------------------------------------------


def _grad_err(f_exact, f_ref, xs, seed, dtype=torch.float32):
    """Max over inputs of max|g_exact - g_ref| / max(max|g_ref|, 1e-2), g_ref by float64 autograd of f_ref.

    The floor judges gradients that are zero in exact arithmetic (a k=1 renormalised router) absolutely, against N(0, 1)
    upstream gradients.
    """
    xs_e = [x.to(dtype).requires_grad_() for x in xs]
    y = f_exact(*xs_e)
    g = _rand(seed, *y.shape)
    ge = torch.autograd.grad(y, xs_e, g.to(y.dtype))
    xs_d = [x.to(dtype).double().requires_grad_() for x in xs]
    gd = torch.autograd.grad(f_ref(*xs_d), xs_d, g.to(y.dtype).double())
    for a, x in zip(ge, xs_e):
        assert a.dtype == x.dtype  # each gradient comes back in its input's dtype
    return max(float((a.double() - b).abs().max() / b.abs().max().clamp(min=1e-2)) for a, b in zip(ge, gd))


GRAD_TOL = {torch.float32: 1e-5, torch.bfloat16: 1.6e-2}  # bf16: 8 mantissa bits, rounded once per op
DTYPE = st.sampled_from([torch.float32, torch.bfloat16])


@SETTINGS
@given(
    m=st.integers(1, 70),
    k=st.sampled_from([8, 32, 128, 384]),
    n=st.sampled_from([1, 7, 98, 256]),
    seed=st.integers(0, 10_000),
    dtype=DTYPE,
)
def test_linear_backward_matches_float64(m, k, n, seed, dtype):
    err = _grad_err(EX.linear, lambda x, w: x @ w.t(), [_rand(seed, m, k), _rand(seed + 1, n, k)], seed + 2, dtype)
    assert err < GRAD_TOL[dtype]


@SETTINGS
@given(m=st.integers(1, 60), d=st.sampled_from([16, 32, 99, 128]), seed=st.integers(0, 10_000), dtype=DTYPE)
def test_rowwise_backwards_match_float64(m, d, seed, dtype):
    x, u = _rand(seed, m, d), _rand(seed + 1, m, d)
    w = 1 + 0.3 * _rand(seed + 2, d)
    tol = GRAD_TOL[dtype]
    assert (
        _grad_err(lambda a, b: EX.rmsnorm(a, b, 1e-6), lambda a, b: TO.rmsnorm(a, b, 1e-6), [x, w], seed, dtype) < tol
    )
    assert _grad_err(EX.silu_mul, TO.silu_mul, [x, u], seed, dtype) < tol
    # log_softmax and the router softmax take fp32 logits (as the model calls them).
    assert _grad_err(EX.log_softmax, lambda a: torch.log_softmax(a, -1), [3 * x], seed) < 1e-5
    assert (
        _grad_err(
            lambda a: EX.router_topk(a, 1, False)[0],
            lambda a: torch.softmax(a, -1).max(-1, keepdim=True)[0],
            [x[:, :16] if d > 16 else x],
            seed,
        )
        < 1e-5
    )


@SETTINGS
@given(
    b=st.integers(1, 3),
    t=st.integers(1, 19),
    kvh=st.sampled_from([1, 2]),
    group=st.sampled_from([1, 2, 4]),
    d=st.sampled_from([8, 32]),
    seed=st.integers(0, 10_000),
    dtype=DTYPE,
)
def test_causal_attention_backward_matches_float64(b, t, kvh, group, d, seed, dtype):
    q, k, v = _rand(seed, b, t, kvh * group, d), _rand(seed + 1, b, t, kvh, d), _rand(seed + 2, b, t, kvh, d)
    assert _grad_err(EX.causal_attention, TO.causal_attention, [q, k, v], seed + 3, dtype) < GRAD_TOL[dtype]


@SETTINGS
@given(
    n=st.integers(1, 30),
    experts=st.sampled_from([4, 8]),
    k=st.sampled_from([1, 2, 3]),
    seed=st.integers(0, 10_000),
    normalize=st.booleans(),
    replay=st.booleans(),
)
def test_router_backward_matches_float64_with_replayed_experts(n, experts, k, seed, normalize, replay):
    # k=1 renormalised weights are p/p = 1: the true gradient is 0 and any fp32 one is cancellation noise
    assume(not (k == 1 and normalize))
    logits = 2 * _rand(seed, n, experts)
    chosen = (
        torch.stack([torch.randperm(experts, generator=torch.Generator().manual_seed(seed + i))[:k] for i in range(n)])
        if replay
        else EX.router_topk(logits, k, normalize)[1]
    )
    err = _grad_err(
        lambda x: EX.router_topk(x, k, normalize, chosen if replay else None)[0],
        lambda x: TO.router_topk(x, k, normalize, chosen)[0],
        [logits],
        seed + 1,
    )
    assert err < 1e-5


def test_model_gradients_match_torch_kernels_with_padding_and_moe_replay():
    """Whole-model gradients (dense and MoE with replayed routing, right-padded rows) vs plain PyTorch."""
    from timbench.model import Compute, Qwen3ForCausalLM, preset
    from timbench.trainer import sequence_logprobs

    seqs = [([5, 6, 7], [8, 9, 10, 11, 12]), ([13, 14, 15, 16, 17, 18], [19]), ([20, 21], [22, 23, 24])]
    for name in ("tiny-dense", "tiny-moe"):
        model = Qwen3ForCausalLM(preset(name), seed=1)
        grads, replay = [], None
        for kn in (EX, TO):
            model.zero_grad(set_to_none=True)
            out = sequence_logprobs(model, Compute(kn), seqs, replay=replay)
            if replay is None and out.routing is not None:
                replay = out.routing  # the torch pass replays the exact pass's experts
            (out.logprobs * torch.tensor([1.0, -2.0, 0.5])[:, None]).sum().backward()
            grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
        assert grads[0].keys() == grads[1].keys()  # the same experts got gradients
        for n, ge in grads[0].items():
            gt = grads[1][n]
            assert float((ge - gt).abs().max()) <= 1e-4 * float(gt.abs().max()) + 1e-9, n


def test_rmsnorm_backward_of_an_overflowed_row_is_nan_as_torch():
    x = torch.tensor([[1e30, 2e30, 1.0], [1.0, 2.0, 3.0]], requires_grad=True)
    w = torch.ones(3, requires_grad=True)
    (gx,) = torch.autograd.grad(EX.rmsnorm(x, w, 1e-6).sum(), [x])
    assert gx[0].isnan().all() and torch.isfinite(gx[1]).all()  # the trainer's non-finite check can stop
