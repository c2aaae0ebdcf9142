"""Engine vs trainer: bitwise-equal logprobs with exact kernels, in any layout; reproducible sampling."""

import random

import pytest
import torch

from timbench.engine import Engine, Request, SamplingParams
from timbench.kernels import get_kernels
from timbench.model import Compute
from timbench.spec.keys import Spec
from timbench.trainer import sequence_logprobs


def _requests(seed, n, vocab=99, max_prompt=20, max_new=24, start_id=0):
    rng = random.Random(seed)
    return [
        Request(
            tuple(rng.randrange(3, vocab) for _ in range(rng.randint(1, max_prompt))),
            rng.randint(1, max_new),
            start_id + i,
        )
        for i in range(n)
    ]


def _trainer_lps(model, spec_dtype, completions, order, sizes, kernels="exact"):
    c = Compute(get_kernels(kernels), Spec(dtype=spec_dtype))
    out = {}
    i = 0
    with torch.no_grad():
        for size in sizes:
            chunk = order[i : i + size]
            i += size
            if not chunk:
                break
            res = sequence_logprobs(model, c, [(completions[j].prompt_ids, completions[j].token_ids) for j in chunk])
            for r, j in enumerate(chunk):
                out[j] = (res.logprobs[r][res.mask[r]], None if res.routing is None else res.routing[r])
    return out


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_exact_engine_and_trainer_agree_bitwise(model, dtype, seed):
    engine = Engine(model.config, f"kernels=exact,dtype={dtype}", max_num_seqs=16)
    engine.load_weights(model)
    rng = random.Random(seed)
    reqs = _requests(seed, 40)
    comps = []
    i = 0
    for b in (1, 3, 20, 16):  # 20 > 16 slots: requests join mid-decode
        comps += engine.generate(reqs[i : i + b], SamplingParams(seed=seed))
        i += b
    order = list(range(len(comps)))
    rng.shuffle(order)
    lps = _trainer_lps(model, engine.spec.dtype, comps, order, (1, 7, 2, 30))
    for j, c in enumerate(comps):
        lp, routing = lps[j]
        assert lp.shape == c.logprobs.shape
        assert (lp - c.logprobs).abs().max().item() == 0.0
        if routing is not None:
            n = c.routing.shape[0]
            assert torch.equal(routing[:n], c.routing)


def test_exact_stays_exact_after_weight_update(moe):
    model = type(moe)(moe.config, seed=11)
    engine = Engine(model.config, "kernels=exact", max_num_seqs=8)
    engine.load_weights(model)
    reqs = _requests(5, 8)
    before = engine.generate(reqs)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.01 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    engine.load_weights(model)
    after = engine.generate(reqs)
    assert any(a.token_ids != b.token_ids or not torch.equal(a.logprobs, b.logprobs) for a, b in zip(before, after))
    lps = _trainer_lps(model, "fp32", after, list(range(8)), (8,))
    assert all(torch.equal(lps[j][0], c.logprobs) for j, c in enumerate(after))


def test_torch_kernels_mismatch_the_exact_trainer(dense):
    engine = Engine(dense.config, "kernels=torch", max_num_seqs=64)
    engine.load_weights(dense)
    comps = engine.generate(_requests(3, 64)) + engine.generate(_requests(4, 3, start_id=100))
    lps = _trainer_lps(dense, "fp32", comps, list(range(len(comps)))[::-1], (5, 62))
    diff = torch.cat([(lps[j][0] - c.logprobs).abs() for j, c in enumerate(comps)])
    assert diff.max().item() > 0.0
    assert diff.max().item() < 1e-3  # a kernel mismatch, not a bug


def test_sampling_is_invariant_to_batch_composition(model):
    engine = Engine(model.config, "kernels=exact", max_num_seqs=32)
    engine.load_weights(model)
    reqs = _requests(9, 30)
    together = engine.generate(reqs, SamplingParams(seed=4))
    alone = [engine.generate([r], SamplingParams(seed=4))[0] for r in reqs[:5]]
    shuffled = engine.generate(reqs[::-1], SamplingParams(seed=4))[::-1]
    for a, b, c in zip(alone, together, shuffled):
        assert a.token_ids == b.token_ids == c.token_ids
        assert torch.equal(a.logprobs, b.logprobs)
    other_seed = engine.generate(reqs, SamplingParams(seed=5))
    assert [c.token_ids for c in other_seed] != [c.token_ids for c in together]


def test_sampled_token_frequencies_follow_the_distribution(dense):
    # One prompt, many request ids: Gumbel-max must reproduce softmax(logits / T).
    engine = Engine(dense.config, "kernels=exact", max_num_seqs=256)
    engine.load_weights(dense)
    prompt = (5, 17, 33)
    comps = engine.generate([Request(prompt, 1, i) for i in range(2000)], SamplingParams(temperature=2.0))
    counts = torch.bincount(torch.tensor([c.token_ids[0] for c in comps]), minlength=dense.config.vocab_size)
    with torch.no_grad():
        logits, _ = dense(torch.tensor([prompt]), Compute(get_kernels("torch")))
    p = torch.softmax(logits[0, -1] / 2.0, -1)
    assert (counts / 2000 - p).abs().max().item() < 0.02


def test_greedy_and_top_p(dense):
    engine = Engine(dense.config, "kernels=exact", max_num_seqs=8)
    engine.load_weights(dense)
    reqs = _requests(1, 4, max_new=5)
    g1 = engine.generate(reqs, SamplingParams(temperature=0, seed=1))
    g2 = engine.generate(reqs, SamplingParams(temperature=0, seed=2))
    assert [c.token_ids for c in g1] == [c.token_ids for c in g2]
    tp = engine.generate(reqs, SamplingParams(top_p=1e-6, seed=1))
    # A nucleus that small keeps only the top token: its renormalised logprob is log(1) (to rounding).
    assert all(c.logprobs.abs().max() < 1e-6 for c in tp)
    assert all(c.token_ids == g.token_ids[: len(c.token_ids)] for c, g in zip(tp, g1))


def _finish_kind(c, max_new: int, max_len: int, eos: int) -> str:
    """Why a completion ended, read off its tokens alone; asserts the engine's finish_reason agrees."""
    assert eos not in c.token_ids[:-1], "generation went on past EOS"
    assert len(c.token_ids) <= max_new and len(c.prompt_ids) + len(c.token_ids) <= max_len
    if c.token_ids[-1] == eos:
        assert c.finish_reason == "stop"
        return "stop"
    assert c.finish_reason == "length", c.finish_reason
    if len(c.token_ids) == max_new:
        return "max_new_tokens"
    assert len(c.prompt_ids) + len(c.token_ids) == max_len, "stopped with room left and no EOS"
    return "context"


def test_finish_reason_follows_from_the_tokens(dense):
    # Random-init tiny-dense samples EOS with p ~ 1/vocab per token: with these seeds a batch ends
    # in all three ways (EOS, max_new_tokens, context end), each checked against its tokens.
    max_len = 40
    engine = Engine(dense.config, "kernels=exact", max_num_seqs=16, max_len=max_len)
    engine.load_weights(dense)
    reqs = _requests(0, 48, max_new=40)
    comps = engine.generate(reqs, SamplingParams(seed=0))
    kinds = [_finish_kind(c, r.max_new_tokens, max_len, dense.config.eos_token_id) for r, c in zip(reqs, comps)]
    assert set(kinds) == {"stop", "max_new_tokens", "context"}, kinds


def test_generation_limits_and_errors(dense):
    engine = Engine(dense.config, "kernels=exact", max_num_seqs=4, max_len=32)
    engine.load_weights(dense)
    out = engine.generate([Request((4, 5), 50, 0)])[0]
    assert _finish_kind(out, 50, 32, dense.config.eos_token_id) in ("stop", "context")  # 50 new never fit
    with pytest.raises(ValueError, match="leaves no room"):
        engine.generate([Request(tuple([4] * 32), 1, 0)])
    with pytest.raises(ValueError, match="empty prompt"):
        engine.generate([Request((), 1, 0)])
    with pytest.raises(ValueError, match="unknown key"):
        Engine(dense.config, "kernel=exact")
