"""The one-pass rope (kernels/rope.py) against the model's torch ops: the same bits, and when it serves."""

import pytest
import torch

from timbench.kernels import rope
from timbench.model import preset
from timbench.model.qwen3 import rope_table

pytestmark = pytest.mark.unit  # builds no model: the rope table only


def _torch_rope(x, pos, cos, sin):
    h = x.shape[-1] // 2
    c, s = cos[pos].unsqueeze(-2), sin[pos].unsqueeze(-2)
    return x * c + torch.cat((-x[..., h:], x[..., :h]), dim=-1) * s


def _bits(t):
    return t.contiguous().view(torch.int32)


@pytest.mark.parametrize("lead", [(7,), (3, 11)])
def test_rope_matches_torch_bitwise(lead):
    cos, sin = rope_table(preset("tiny-dense"))
    g = torch.Generator().manual_seed(1)
    x = torch.randn(*lead, 4, 32, generator=g) * torch.logspace(-30, 30, 32)
    # IEEE specials and ties in rounding: -0, subnormals, inf (NaN positions must stay NaN)
    x.view(-1)[:6] = torch.tensor([-0.0, 1e-45, -1e-40, float("inf"), float("-inf"), float("nan")])
    pos = torch.randint(0, cos.shape[0], lead, generator=g)
    want, got = _torch_rope(x, pos, cos, sin), rope.rope(x, pos, cos, sin)
    nan = torch.isnan(want)
    assert torch.equal(nan, torch.isnan(got))
    assert torch.equal(_bits(want)[~nan], _bits(got)[~nan])


def test_rope_serves_only_fp32_without_autograd():
    table = torch.zeros(4, 8)
    x = torch.zeros(2, 1, 8)
    assert rope.applies(x, table)
    assert not rope.applies(x.bfloat16(), table)
    w = x.clone().requires_grad_(True)
    assert not rope.applies(w, table)
    with torch.no_grad():
        assert rope.applies(w, table)
