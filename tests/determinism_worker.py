"""One trainer update per case, printed as JSON hashes: run by tests/test_determinism.py under emulated CPUs.

Usage: python tests/determinism_worker.py THREADS [RUN_DIR]
Each case loads a shipped tiny checkpoint, scores a few padded (prompt, response)
rows with autograd, takes a policy-gradient loss, backpropagates, clips and steps
the optimizer, and reports sha256 of every parameter's bytes plus the loss and
grad-norm bits. `exact` cases use the fixed-order kernels, AdamW and clipping
(what the RL loop runs); the `torch` case is the plain-PyTorch update, the
negative control that shows the emulated CPU changes ordinary kernels' bits.
The exact cases and runs are `timbench.fingerprint`'s (the golden-fingerprint test's).
With RUN_DIR, it also runs its short RL runs (THREADS threads) and reports sha256
of the files a run logs: metrics.jsonl and eval.jsonl.
"""

from __future__ import annotations

import hashlib
import json
import random
import sys
from pathlib import Path

import numba
import numpy as np
import torch

from timbench.fingerprint import CASES, RUNS, run_case, update_case
from timbench.kernels import get_kernels, native
from timbench.kernels import numba_ops as nb
from timbench.model import Compute, load_checkpoint
from timbench.spec.keys import Spec
from timbench.trainer import sequence_logprobs

CKPT = Path(__file__).resolve().parents[1] / "timbench" / "assets" / "checkpoints"


def _seqs(vocab: int, n: int = 6, seed: int = 0):
    rng = random.Random(seed)
    tok = lambda k: [rng.randrange(3, vocab) for _ in range(k)]  # noqa: E731
    return [(tok(rng.randint(4, 9)), tok(rng.randint(3, 12))) for _ in range(n)]


def _bits(x: float) -> str:
    return torch.tensor(x, dtype=torch.float64).numpy().tobytes().hex()


def torch_update(model_name: str) -> dict:
    """The negative control: one plain-PyTorch update (torch kernels, torch AdamW and clipping), fp32."""
    model = load_checkpoint(str(CKPT / model_name))
    seqs = _seqs(model.config.vocab_size)
    adv = torch.tensor([1.0, -0.5, 0.25, -1.0, 0.75, -0.25])
    params = list(model.parameters())
    opt = torch.optim.AdamW(params, lr=1e-3, betas=(0.9, 0.99), weight_decay=0.01)
    out = sequence_logprobs(model, Compute(get_kernels("torch"), Spec(dtype="fp32")), seqs)
    loss = -(out.logprobs * adv[:, None] * out.mask).sum() / out.mask.sum()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    gn = float(torch.nn.utils.clip_grad_norm_(params, 0.5))  # small enough that clipping is active
    opt.step()
    h = hashlib.sha256()
    for name, p in model.named_parameters():
        h.update(name.encode())
        h.update(p.detach().numpy().tobytes())
    return {"params": h.hexdigest(), "loss": _bits(float(loss.detach())), "grad_norm": _bits(gn)}


def train_runs(threads: int, root: Path) -> dict:
    """The golden fingerprint's short RL runs (timbench.fingerprint.RUNS): rollout with noise, recompute, a
    remedy, both handling modes, a zero-mismatch twin, MoE with routing replay, bf16, low-precision formats,
    the fixed-order update, eval; sha256 of the files each logs."""
    return {f"run/{name}": run_case(sets, threads, root / name) for name, sets in RUNS.items()}


def main(threads: int, run_dir: str | None = None) -> None:
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True)  # as the RL loop
    # The exact trainer's cases are the golden fingerprint's (forward, advantages, loss, every gradient,
    # clip, two AdamW steps; dense and MoE, fp32 and bf16): one definition for both checks.
    result = {f"{name}-exact": update_case(*args) for name, args in CASES.items()}
    if run_dir:
        result.update(train_runs(threads, Path(run_dir)))
        torch.set_num_threads(threads)
    # Negative controls, always on one thread so that only the emulated CPU can change them.
    torch.set_num_threads(1)
    result["control/torch-update"] = torch_update("add-4d-v1-tiny-dense")
    # The machine code numba generated for the forward matmul: proves NUMBA_CPU_NAME/FEATURES took effect.
    # (The trainer's matmuls run in C now, so compile the numba one here: it is still the specification.)
    nb.matmul(np.ones((5, 7), np.float32), np.ones((7, 3), np.float32))
    asm = "".join(nb.matmul.inspect_asm(sig) for sig in nb.matmul.signatures)
    result["control/numba-asm"] = hashlib.sha256(asm.encode()).hexdigest()
    result["control/numba-asm-zmm"] = "zmm" in asm
    torch.set_num_threads(threads)
    result["_env"] = {
        "aten_capability": torch.backends.cpu.get_cpu_capability(),
        "torch_threads": torch.get_num_threads(),
        "numba_threads": numba.get_num_threads(),
        "numba_cpu": numba.core.config.CPU_NAME or "host",
        "numba_features": numba.core.config.CPU_FEATURES,
        "native_isa": native.isa(),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else None)
