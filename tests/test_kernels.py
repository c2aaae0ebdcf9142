"""Kernel sets: exact ops are bitwise batch-invariant and numerically right; gradients flow."""

import torch
from hypothesis import given, settings, strategies as st

from timbench.kernels import get_kernels

EX, TO = get_kernels("exact"), get_kernels("torch")
SETTINGS = settings(max_examples=15, deadline=None)


def _rand(seed, *shape, dtype=torch.float32):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


@SETTINGS
@given(m=st.integers(1, 70), k=st.sampled_from([32, 128, 256]), n=st.sampled_from([7, 98, 384]),
       seed=st.integers(0, 10_000), dtype=st.sampled_from([torch.float32, torch.bfloat16]))
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
