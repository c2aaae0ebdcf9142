"""Golden fingerprints: the exact trainer's bits on fixed inputs, hashed, to compare machines.

Training is meant to give the same bytes on every x86-64 CPU and thread count.
Emulating an older CPU on one machine cannot prove that (a vendor-dispatched
library such as MKL's vector math takes its own path on each real CPU), so
every machine that computes these hashes and compares them with the committed
ones (`timbench fingerprint --check`, and `tests/test_fingerprint.py` in every
test run, each developer's and each CI's) is one more real-hardware check.

One case per (model, dtype): tiny-dense and tiny-moe, fp32 and bf16. Each case
hashes, in the order the trainer computes them: the forward (logprobs,
entropy), the GRPO advantages of groups with every success count 0..8 of 8
(each a different fixed-order std and square root), the PPO-clip loss at
ratios away from 1 (fexp), every parameter's gradient, the clipped global norm
and the clipped gradients, then the parameters after each of two AdamW steps.
Then five 2-step RL runs (dense and MoE, fp32 and bf16 engines, NVFP4 with unified precision) hash their
metrics.jsonl and eval.jsonl byte for byte. `first_difference` names the first
key, in that order, whose hash differs: the earliest tensor that moved.
"""

from __future__ import annotations

import hashlib
import json
import platform
import random
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from .util.atomic import atomic_write
from .util.shipped import default_checkpoint

if TYPE_CHECKING:  # torch is imported where it is used, so `timbench --help` stays torch-free
    import torch

GOLDEN = Path(__file__).resolve().parent / "assets" / "golden_fingerprints.json"
CASES = {f"{m}-{dt}": (m, dt) for m in ("tiny-dense", "tiny-moe") for dt in ("fp32", "bf16")}
RUN_BASE = ["steps=2", "prompts_per_step=4", "group_size=8", "mini_batches=2", "eval_every=2", "eval_n=32"]
RUNS = {  # name -> overrides: dense and MoE, fp32 and bf16 engines, each touching a different path
    "dense-fp32": ["engine.noise=gaussian:0.5", "mode=bypass", "remedy=tis_token+seq_rs", "twin=true"],
    "dense-bf16": ["engine.dtype=bf16", "remedy=tis_token"],
    "moe-fp32": ["preset=tiny-moe", "engine.router_noise=0.5", "remedy=routing_replay_r3"],
    "moe-bf16": ["preset=tiny-moe", "engine.dtype=bf16", "remedy=routing_replay_r2"],
    # Quantized weights, activations and KV cache in the engine; the same quantized forward with
    # straight-through gradients in the trainer (unified precision); the quantized-policy eval.
    "nvfp4-w4a4-kvfp8-unified": [
        "engine.dtype=bf16",
        "engine.weight_quant=nvfp4",
        "engine.act_quant=nvfp4",
        "engine.kv_cache_dtype=fp8_e4m3",
        "remedy=unified_precision",
    ],
}


def _h(t: torch.Tensor) -> str:
    return hashlib.sha256(t.detach().contiguous().cpu().numpy().tobytes()).hexdigest()[:16]


def _batch(vocab: int, n: int = 16, seed: int = 0) -> list[tuple[list[int], list[int]]]:
    """n (prompt, response) pairs of random tokens; Python's Mersenne Twister, so the same on every machine."""
    rng = random.Random(seed)
    tok = lambda k: [rng.randrange(3, vocab) for _ in range(k)]  # noqa: E731
    return [(tok(rng.randint(3, 12)), tok(rng.randint(4, 18))) for _ in range(n)]


def _rewards(n: int) -> torch.Tensor:
    """0/1 rewards in groups of 8 whose success counts run 0, 1, ..., 8 (then repeat): every group std."""
    import torch  # deferred: torch is heavy

    return torch.tensor([float(i % 8 < (i // 8) % 9) for i in range(n)], dtype=torch.float32)


def update_case(model_name: str, dtype: str) -> dict[str, str]:
    """Forward, advantages, loss, gradients, clip and two AdamW steps of one case, hashed in that order."""
    import torch  # deferred: torch is heavy

    from .model import Compute, load_checkpoint  # deferred: torch is heavy
    from .rl.algorithms import grpo_advantage, ppo_clip_loss  # deferred: torch is heavy
    from .spec.keys import parse_spec  # deferred: torch is heavy
    from .trainer import sequence_logprobs  # deferred: torch is heavy
    from .trainer.optim import AdamW, clip_grad_norm  # deferred: torch is heavy

    model = load_checkpoint(default_checkpoint("add-4d-v1", model_name))
    compute = Compute.from_spec(parse_spec(f"kernels=exact,dtype={dtype}"))
    seqs = _batch(model.config.vocab_size, n=72)  # 9 groups of 8: success counts 0..8
    params = [p for p in model.parameters() if p.requires_grad]
    opt = AdamW(params, lr=1e-3, betas=(0.9, 0.99), weight_decay=0.01)
    adv = grpo_advantage(_rewards(len(seqs)), 8)
    res: dict[str, str] = {"advantages": _h(adv)}
    for step in (1, 2):
        out = sequence_logprobs(model, compute, seqs)
        # pi_old a little off pi_theta (a fixed pattern of +-0.05 steps) so the ratio leaves 1 and clips.
        j = torch.arange(out.logprobs.shape[1], dtype=torch.float32)
        i = torch.arange(out.logprobs.shape[0], dtype=torch.float32)[:, None]
        old = out.logprobs.detach() + (torch.remainder(i * 7 + j * 3, 11) - 5) * 0.05
        loss, _ = ppo_clip_loss(out.logprobs, old, adv, out.mask)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if step == 1:
            res.update({"forward/logprobs": _h(out.logprobs), "forward/entropy": _h(out.entropy), "loss": _h(loss)})
            res.update({f"grad/{n}": _h(p.grad) for n, p in model.named_parameters() if p.grad is not None})
        norm = clip_grad_norm(params, 0.5)  # small enough that clipping is active
        res[f"step{step}/clip/grad_norm"] = _h(norm)
        res[f"step{step}/clip/grads"] = _h(torch.cat([p.grad.reshape(-1) for p in params if p.grad is not None]))
        opt.step()
        res[f"step{step}/adamw/params"] = _h(torch.cat([p.detach().reshape(-1) for p in params]))
    return res


def run_case(overrides: list[str], threads: int, root: Path) -> dict[str, str]:
    """A 2-step RL run; sha256 of the files it logs."""
    from .rl.config import load_config  # deferred: torch is heavy
    from .rl.loop import run  # deferred: torch is heavy

    run(load_config(None, RUN_BASE + overrides + [f"threads={threads}"]), root, progress=False)
    return {f: hashlib.sha256((root / f).read_bytes()).hexdigest()[:16] for f in ("metrics.jsonl", "eval.jsonl")}


def machine() -> dict:
    """CPU model and the instruction-set flags that matter for numerics (informational, never compared)."""
    info = {"cpu": platform.processor(), "isa": []}
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return info
    for line in text.splitlines():
        if line.startswith("model name") and info["cpu"] in ("", platform.processor()):
            info["cpu"] = line.split(":", 1)[1].strip()
        if line.startswith("flags"):
            flags = set(line.split(":", 1)[1].split())
            info["isa"] = [f for f in ("avx", "avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16") if f in flags]
            break
    return info


def fingerprint(threads: int = 1, runs: bool = True) -> dict[str, str]:
    """Every hash, keys in computation order (cases, then runs)."""
    import torch  # deferred: torch is heavy

    torch.set_num_threads(threads)
    out: dict[str, str] = {}
    for case, (m, dt) in CASES.items():
        out.update({f"{case}/{k}": v for k, v in update_case(m, dt).items()})
    if runs:
        with tempfile.TemporaryDirectory(prefix="timbench-fp-") as tmp:
            for name, sets in RUNS.items():
                out.update({f"run/{name}/{k}": v for k, v in run_case(sets, threads, Path(tmp) / name).items()})
        torch.set_num_threads(threads)
    return out


def first_difference(expected: dict[str, str], got: dict[str, str]) -> str | None:
    """The first key (in `expected`'s order) whose hash differs or is missing, with both values; None if equal."""
    for key, want in expected.items():
        if got.get(key) != want:
            return f"{key}: expected {want}, got {got.get(key)}"
    extra = [k for k in got if k not in expected]
    return f"{extra[0]}: not in the golden file" if extra else None


def load_golden(path: Path = GOLDEN) -> dict[str, str]:
    return json.loads(Path(path).read_text())["hashes"]


def add_parser(sub) -> None:
    p = sub.add_parser(
        "fingerprint",
        help="hash the exact trainer's bits on fixed inputs; --check compares them "
        "with the committed golden fingerprints (a cross-machine check)",
    )
    p.add_argument("--threads", type=int, default=1, help="torch and numba threads (the bits must not depend on it)")
    p.add_argument(
        "--check", action="store_true", help="compare with the golden file; exit 1 naming the first differing tensor"
    )
    p.add_argument("--write", metavar="FILE", help="write the fingerprint as a golden file (JSON) to FILE")
    p.set_defaults(func=_cmd)


def _cmd(args) -> int:
    import torch  # deferred: torch is heavy

    got = fingerprint(args.threads)
    doc = {"machine": machine(), "torch": torch.__version__, "hashes": got}
    if args.write:
        atomic_write(args.write, json.dumps(doc, indent=1) + "\n")
    if args.check:
        diff = first_difference(load_golden(), got)
        if diff:
            print(f"fingerprint: differs from {GOLDEN.name} on {machine()['cpu']}: {diff}")
            return 1
        print(f"fingerprint: all {len(got)} hashes match {GOLDEN.name} ({machine()['cpu']}, {args.threads} threads)")
        return 0
    if not args.write:
        print(json.dumps(doc, indent=1))
    return 0


__all__ = ["CASES", "GOLDEN", "RUNS", "first_difference", "fingerprint", "load_golden", "machine"]
