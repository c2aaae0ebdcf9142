"""triage_gate: the TRIAGE-style segment gate and pseudo-Huber repair on a batch computed by hand."""

from __future__ import annotations

import math

import pytest
import torch

from timbench.remedies import RemedyBatch, load_remedy
from timbench.remedies.direction import TriageParams, segment_gates, triage_weights

pytestmark = pytest.mark.unit  # builds no model (make test-unit)


def _batch(delta, adv, mask=None):
    delta = torch.tensor(delta, dtype=torch.float64)
    mu = torch.full_like(delta, -1.0)
    mask = torch.ones_like(delta, dtype=torch.bool) if mask is None else torch.tensor(mask)
    return RemedyBatch(mu + delta, mu, torch.tensor(adv, dtype=torch.float64), mask, 1)


def test_weights_match_the_formula_by_hand():
    # Segments of 2 tokens. Row 0 (A < 0): segment [-0.2, 0.1] (mean -0.05, no tail) and segment [-1.0, -0.1]
    # (mean -0.55, half its tokens beyond log 2). Row 1 (A > 0): pseudo-Huber. Row 2 (A = 0): untouched.
    rem = load_remedy("triage_gate", {"segment": 2})
    b = _batch([[-0.2, 0.1, -1.0, -0.1], [0.0, 0.5, -2.0, 1.0], [-3.0, 3.0, -0.5, 0.5]], [-1.0, 1.0, 0.0])
    w = rem(b).weights
    g1 = math.exp(-0.05 / 0.1)  # segment 1: no tail, shift -0.05
    g2 = max(0.0, 1 - 0.5 / 0.5) * math.exp(-0.55 / 0.1)  # segment 2: half in the tail -> shut
    raw = [g1, 1.0, g2, g2]
    scale = 4 / sum(raw)  # the response keeps its update mass
    assert w[0].tolist() == pytest.approx([r * scale for r in raw], abs=1e-12)
    assert float(w[0].sum()) == pytest.approx(4.0, abs=1e-12)
    c = math.log(2)
    assert w[1].tolist() == pytest.approx([1 / math.sqrt(1 + (d / c) ** 2) for d in (0.0, 0.5, -2.0, 1.0)], abs=1e-12)
    assert w[2].tolist() == [1.0, 1.0, 1.0, 1.0]
    _, lowered, gated = triage_weights(b.old_logprobs - b.rollout_logprobs, b.advantages, b.mask, rem.params)
    assert lowered.tolist() == gated.tolist() == [[True, False, True, True], [False] * 4, [False] * 4]


def test_zero_mismatch_is_a_no_op_and_padding_is_ignored():
    rem = load_remedy("triage_gate", {})
    b = _batch([[0.0, 0.0, 0.0], [0.0, 0.0, 0.0]], [-1.0, 2.0], [[True, True, False], [True, False, False]])
    r = rem(b)
    assert torch.equal(r.weights[b.mask], torch.ones(3, dtype=torch.float64)) and torch.equal(r.mask, b.mask)
    # a padded position's garbage delta does not move its segment's gate
    g = segment_gates(
        torch.tensor([[-0.3, 9.0]], dtype=torch.float64), torch.tensor([[True, False]]), TriageParams(segment=2)
    )
    assert float(g[0, 0]) == pytest.approx(math.exp(-3.0), abs=1e-12)


@pytest.mark.parametrize(
    "args,msg",
    [
        ({"segment": 0}, "segment must be an integer >= 1"),
        ({"f_max": -1}, "f_max must be > 0"),
        ({"colour": 1}, "unknown parameter"),
    ],
)
def test_bad_parameters_are_one_line_errors(args, msg):
    with pytest.raises(ValueError, match=msg):
        load_remedy("triage_gate", args)
