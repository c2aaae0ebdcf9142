"""One trainer update per case, printed as JSON hashes: run by tests/test_determinism.py under emulated CPUs.

Usage: python tests/determinism_worker.py THREADS [RUN_DIR]
Each case loads a shipped tiny checkpoint, scores a few padded (prompt, response)
rows with autograd, takes a policy-gradient loss, backpropagates, clips and steps
the optimizer, and reports sha256 of every parameter's bytes plus the loss and
grad-norm bits. `exact` cases use the fixed-order kernels, AdamW and clipping
(what the RL loop runs); the `torch` case is the plain-PyTorch update, the
negative control that shows the emulated CPU changes ordinary kernels' bits.
With RUN_DIR, it also runs short RL runs (`timbench.rl.loop.run`, THREADS threads)
and reports sha256 of the files a run logs: metrics.jsonl, eval.jsonl, summary.json.
"""

from __future__ import annotations

import hashlib
import json
import random
import sys
from pathlib import Path

import numba
import torch

from timbench.kernels import get_kernels
from timbench.kernels import numba_ops as nb
from timbench.kernels.reduce import masked_sum
from timbench.model import Compute, load_checkpoint
from timbench.spec import Spec
from timbench.trainer import sequence_logprobs
from timbench.trainer.optim import AdamW, clip_grad_norm

CKPT = Path(__file__).resolve().parents[1] / "timbench" / "assets" / "checkpoints"
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def _seqs(vocab: int, n: int = 6, seed: int = 0):
    rng = random.Random(seed)
    tok = lambda k: [rng.randrange(3, vocab) for _ in range(k)]  # noqa: E731
    return [(tok(rng.randint(4, 9)), tok(rng.randint(3, 12))) for _ in range(n)]


def _bits(x: float) -> str:
    return torch.tensor(x, dtype=torch.float64).numpy().tobytes().hex()


def update(model_name: str, dtype: str, kernels: str) -> dict:
    model = load_checkpoint(str(CKPT / model_name))
    seqs = _seqs(model.config.vocab_size)
    adv = torch.tensor([1.0, -0.5, 0.25, -1.0, 0.75, -0.25])
    params = list(model.parameters())
    if kernels == "exact":
        opt, clip = AdamW(params, lr=1e-3, betas=(0.9, 0.99), weight_decay=0.01), clip_grad_norm
    else:
        opt = torch.optim.AdamW(params, lr=1e-3, betas=(0.9, 0.99), weight_decay=0.01)
        clip = torch.nn.utils.clip_grad_norm_
    out = sequence_logprobs(model, Compute(get_kernels(kernels), Spec(dtype=dtype)), seqs)
    pg = out.logprobs * adv[:, None]
    if kernels == "exact":
        loss = -masked_sum(pg, out.mask) / out.mask.sum()
    else:
        loss = -(pg * out.mask).sum() / out.mask.sum()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    gn = float(clip(params, 0.5))  # small enough that clipping is active
    opt.step()
    h = hashlib.sha256()
    for name, p in model.named_parameters():
        h.update(name.encode())
        h.update(p.detach().numpy().tobytes())
    return {"params": h.hexdigest(), "loss": _bits(float(loss.detach())), "grad_norm": _bits(gn)}


# Short RL runs that together touch every phase: rollout with noise, recompute, a remedy, both
# handling modes, a zero-mismatch twin, MoE with routing replay, bf16, low-precision formats, the
# fixed-order update, eval.
RUN_BASE = ["steps=2", "prompts_per_step=4", "group_size=4", "mini_batches=2", "eval_every=2", "eval_n=32"]
RUNS = {
    "run/noise-bypass-tis-seq-rs-twin": ["engine.noise=gaussian:0.5", "mode=bypass", "remedy=tis_token+seq_rs",
                                         "twin=true"],
    "run/moe-bf16-r3": ["preset=tiny-moe", "engine.dtype=bf16", "remedy=routing_replay_r3"],
    # Quantized weights, activations and KV cache in the engine; the same quantized forward with
    # straight-through gradients in the trainer (unified precision); the quantized-policy eval.
    "run/nvfp4-w4a4-kvfp8-unified": ["engine.dtype=bf16", "engine.weight_quant=nvfp4", "engine.act_quant=nvfp4",
                                     "engine.kv_cache_dtype=fp8_e4m3", "remedy=unified_precision"],
}


def train_runs(threads: int, root: Path) -> dict:
    from timbench.rl.config import load_config
    from timbench.rl.loop import run

    out = {}
    for name, sets in RUNS.items():
        d = root / name.replace("/", "_")
        run(load_config(None, RUN_BASE + sets + [f"threads={threads}"]), d, progress=False)
        out[name] = {f: hashlib.sha256((d / f).read_bytes()).hexdigest()
                     for f in ("metrics.jsonl", "eval.jsonl", "summary.json")}
    return out


def main(threads: int, run_dir: str | None = None) -> None:
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True)  # as the RL loop
    cases = {f"{m}-{dt}-exact": (m, dt, "exact") for m in ("add-4d-v1-tiny-dense", "add-4d-v1-tiny-moe")
             for dt in DTYPES}
    result = {name: update(*args) for name, args in cases.items()}
    if run_dir:
        result.update(train_runs(threads, Path(run_dir)))
        torch.set_num_threads(threads)
    # Negative controls, always on one thread so that only the emulated CPU can change them.
    torch.set_num_threads(1)
    result["control/torch-update"] = update("add-4d-v1-tiny-dense", "fp32", "torch")
    # The machine code numba generated for the forward matmul: proves NUMBA_CPU_NAME/FEATURES took effect.
    asm = "".join(nb.matmul.inspect_asm(sig) for sig in nb.matmul.signatures)
    result["control/numba-asm"] = hashlib.sha256(asm.encode()).hexdigest()
    result["control/numba-asm-zmm"] = "zmm" in asm
    torch.set_num_threads(threads)
    result["_env"] = {"aten_capability": torch.backends.cpu.get_cpu_capability(),
                      "torch_threads": torch.get_num_threads(), "numba_threads": numba.get_num_threads(),
                      "numba_cpu": numba.core.config.CPU_NAME or "host",
                      "numba_features": numba.core.config.CPU_FEATURES}
    print(json.dumps(result))


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else None)
