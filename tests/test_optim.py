"""Fixed-order AdamW and clip_grad_norm: torch's semantics, resumable state, clear errors."""

import copy

import pytest
import torch

from timbench.kernels.fixed_grad import embed, scale_rows
from timbench.trainer.optim import AdamW, clip_grad_norm

pytestmark = pytest.mark.unit  # builds no model (make test-unit)


def _params(seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(300, 17, generator=g).requires_grad_(), torch.randn(5, generator=g).requires_grad_()]


def _grads(seed, params):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(p.shape, generator=g) for p in params]


@pytest.mark.parametrize("betas,wd", [((0.9, 0.99), 0.0), ((0.9, 0.999), 0.1), ((0.3, 0.9), 0.01)])
def test_adamw_and_clip_follow_torch(betas, wd):
    ours, ref = _params(0), _params(0)
    o1 = AdamW(ours, lr=1e-2, betas=betas, weight_decay=wd)
    o2 = torch.optim.AdamW(ref, lr=1e-2, betas=betas, weight_decay=wd)
    for step in range(6):
        for a, b, g in zip(ours, ref, _grads(step, ours)):
            a.grad, b.grad = g.clone(), g.clone()
        n1, n2 = clip_grad_norm(ours, 5.0), torch.nn.utils.clip_grad_norm_(ref, 5.0)
        assert n1.dtype == n2.dtype and abs(float(n1) - float(n2)) <= 1e-6 * float(n2)
        for a, b in zip(ours, ref):
            assert torch.allclose(a.grad, b.grad, rtol=1e-6, atol=0)
        o1.step()
        o2.step()
        for a, b in zip(ours, ref):  # torch's vectorised FMA vs our unfused ops: a few ulps
            assert torch.allclose(a, b, rtol=1e-6, atol=1e-7)
    assert o1.state[ours[0]].keys() == o2.state[ref[0]].keys()


def test_resume_from_state_dict_is_bitwise():
    run, resumed = _params(1), _params(1)
    o1 = AdamW(run, lr=1e-2, betas=(0.9, 0.99), weight_decay=0.01)
    for step in range(5):
        for p, g in zip(run, _grads(10 + step, run)):
            p.grad = g
        o1.step()
        if step == 2:
            saved = copy.deepcopy(({"p": [p.detach().clone() for p in run]}, o1.state_dict()))
    ps, sd = saved
    with torch.no_grad():
        for p, v in zip(resumed, ps["p"]):
            p.copy_(v)
    o2 = AdamW(resumed, lr=1e-2)  # hyper-parameters come back from the state dict
    o2.load_state_dict(sd)
    assert o2.param_groups[0]["betas"] == (0.9, 0.99)
    for step in range(3, 5):
        for p, g in zip(resumed, _grads(10 + step, resumed)):
            p.grad = g
        o2.step()
    for a, b in zip(run, resumed):
        assert torch.equal(a, b)


def test_step_bumps_the_version_counter():
    p = _params(2)
    p[0].grad = torch.ones_like(p[0])
    v = p[0]._version
    AdamW(p).step()
    assert p[0]._version > v  # weight caches keyed on the version see the update


@pytest.mark.parametrize("bad", [0, -1.0, float("nan")])
def test_clip_rejects_a_non_positive_max_norm(bad):
    with pytest.raises(ValueError, match="grad_clip"):
        clip_grad_norm(_params(3), bad)


def test_clip_at_inf_is_no_clipping():
    p = _params(3)
    for q in p:
        q.grad = torch.full_like(q, 1e3)
    before = [q.grad.clone() for q in p]
    norm = clip_grad_norm(p, float("inf"))
    assert float(norm) > 1e3 and all(torch.equal(q.grad, b) for q, b in zip(p, before))


def test_clip_below_max_norm_leaves_gradients_and_nonfinite_propagates():
    p = _params(4)
    for q in p:
        q.grad = torch.full_like(q, 1e-3)
    before = [q.grad.clone() for q in p]
    clip_grad_norm(p, 10.0)
    assert all(torch.equal(a, q.grad) for a, q in zip(before, p))
    p[1].grad[0] = float("nan")
    assert not torch.isfinite(clip_grad_norm(p, 1.0))


def test_embedding_and_row_scaling_gradients():
    w = torch.randn(11, 6, requires_grad=True)
    ids = torch.tensor([[3, 1, 3], [0, 3, 10]])
    g = torch.randn(2, 3, 6)
    (gw,) = torch.autograd.grad(embed(w, ids), w, g)
    (ref,) = torch.autograd.grad(w[ids], w, g)
    assert torch.allclose(gw, ref, rtol=1e-6, atol=1e-7)
    y, s = torch.randn(5, 7, requires_grad=True), torch.randn(5, requires_grad=True)
    g = torch.randn(5, 7)
    ours = torch.autograd.grad(scale_rows(y, s), [y, s], g)
    ref = torch.autograd.grad(y * s[:, None], [y, s], g)
    for a, b in zip(ours, ref):
        assert torch.allclose(a, b, rtol=1e-6, atol=1e-6)
