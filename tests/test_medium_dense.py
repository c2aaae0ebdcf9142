"""The medium-dense preset (the dense size ladder's third rung): tiny-dense's shape rules at ~6M parameters, a
geometric step up from small-dense, and an exact engine that matches the exact trainer bit for bit."""

from __future__ import annotations

import random

import pytest
import torch

from timbench.engine import Engine, Request, SamplingParams
from timbench.kernels import get_kernels
from timbench.model import PRESETS, Compute, Qwen3ForCausalLM
from timbench.spec.keys import Spec
from timbench.trainer import sequence_logprobs

TINY, SMALL, MEDIUM = PRESETS["tiny-dense"], PRESETS["small-dense"], PRESETS["medium-dense"]


def test_medium_dense_keeps_the_dense_shape_rules_and_every_width_tiles():
    assert MEDIUM.model_type == "qwen3" and not MEDIUM.is_moe
    assert MEDIUM.num_attention_heads * MEDIUM.head_dim == MEDIUM.hidden_size and MEDIUM.head_dim == TINY.head_dim
    assert MEDIUM.intermediate_size == 2 * MEDIUM.hidden_size
    widths = {MEDIUM.hidden_size, MEDIUM.num_attention_heads * MEDIUM.head_dim, MEDIUM.intermediate_size}
    assert all(k % 32 == 0 and k % 4 == 0 for k in widths)  # NVFP4/MX blocks; simulated tp 2 and 4
    # a real tp=2 shards whole heads: the KV heads split over 2 ranks, each rank's query heads over its KV heads
    assert MEDIUM.num_key_value_heads % 2 == 0 and MEDIUM.num_attention_heads % MEDIUM.num_key_value_heads == 0


def test_the_ladder_is_geometric_at_about_three_times_per_rung():
    n = [c.num_parameters() for c in (TINY, SMALL, MEDIUM)]
    assert 5.5e6 <= n[2] <= 7e6
    up1, up2 = n[1] / n[0], n[2] / n[1]
    assert 2.8 <= up2 <= 3.6 and abs(up2 - up1) < 0.3
    # the analytic count is the module's own
    assert sum(p.numel() for p in Qwen3ForCausalLM(MEDIUM, seed=0).parameters()) == n[2]


def test_exact_engine_and_trainer_agree_bitwise_on_medium_dense():
    net = Qwen3ForCausalLM(MEDIUM, seed=5)
    rng = random.Random(0)
    reqs = [Request(tuple(rng.randrange(3, 99) for _ in range(rng.randint(1, 12))), 8, i) for i in range(6)]
    engine = Engine(net.config, "kernels=exact", max_num_seqs=4)  # 6 > 4 slots: requests join mid-decode
    engine.load_weights(net)
    comps = engine.generate(reqs, SamplingParams(seed=1))
    with torch.no_grad():
        res = sequence_logprobs(
            net, Compute(get_kernels("exact"), Spec()), [(c.prompt_ids, c.token_ids) for c in comps]
        )
    for r, c in enumerate(comps):
        assert (res.logprobs[r][res.mask[r]] - c.logprobs).abs().max().item() == 0.0


@pytest.mark.parametrize("wq", ["nvfp4", "mxfp4"])
def test_four_bit_rollouts_run_on_medium_dense_and_move_the_logprobs(wq):
    net = Qwen3ForCausalLM(MEDIUM, seed=5)
    got = {}
    for spec in ("kernels=exact", f"kernels=exact,weight_quant={wq}"):
        engine = Engine(net.config, spec, max_num_seqs=4)
        engine.load_weights(net)
        got[spec] = engine.generate([Request((5, 6, 7), 4, 0)], SamplingParams(seed=1))[0]
    exact, quant = got.values()
    assert torch.isfinite(quant.logprobs).all()
    # the first sampled token's logprob (same prompt, same sampling noise): the format's rounding moves it
    assert (exact.logprobs[0] - quant.logprobs[0]).abs().item() > 0.0
