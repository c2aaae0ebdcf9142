"""A pruned MoE proxy checkpoint: calibrate, prune experts, optionally recover, measure, write with its card.

The pruning itself is `timbench.warmstart.prune`; this is the pipeline behind
`timbench prune-experts`. Pruning the shipped tiny MoE from 8 to 4 or 2 experts drops
its T=1 accuracy from 0.32 to <= 0.004 (docs/findings/proxy-fidelity.md), so a proxy meant for RL
gets a short recovery fine-tune with the warm start's own machinery
(`timbench.warmstart.run`, stopped in the same accuracy band) before it is shipped.
"""

from __future__ import annotations

import hashlib
import shlex
import time
from pathlib import Path

from ..metrics.schema import ACCURACY_GREEDY, ACCURACY_T1
from ..tasks import get_task
from ..util.shipped import default_checkpoint
from ..util.threads import set_threads
from .run import ENGINE_SPEC, warmstart


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def resolve_source(model: str, task: str) -> tuple[Path, str | None]:
    """(checkpoint directory, preset name or None): a preset names the shipped warm start of (task, preset)."""
    from ..model import PRESETS  # deferred: tokenizers is heavy

    if model in PRESETS:
        return default_checkpoint(task, model), model
    d = Path(model)
    if not d.is_dir():
        raise FileNotFoundError(
            f"model {model!r} is neither a preset with a shipped {task} checkpoint "
            f"({', '.join(PRESETS)}) nor a checkpoint directory"
        )
    return d, None


def make_proxy(
    model: str,
    task: str,
    keep: int,
    out: str | Path | None = None,
    *,
    calib_n: int = 512,
    seed: int = 0,
    recover=None,
    eval_n: int = 512,
    max_steps: int = 1000,
    threads: int = 1,
    eval_every: int = 10,
    progress: bool = True,
    command: str | None = None,
) -> dict:
    """Prune `model` (a preset's shipped checkpoint for `task`, or a directory) to `keep` experts per layer.

    Routes are counted on `calibration_set(task, calib_n, seed)`. `recover` (a (lo, hi) T=1 accuracy
    band, default None: none) fine-tunes the pruned model with `timbench.warmstart.run` (seed `seed`, its
    defaults otherwise) until its accuracy is in the band. Returns the card; writes the checkpoint
    (with card.json) to `out` if given.
    """
    from ..evaluate import evaluate_both  # deferred: tokenizers is heavy
    from ..model import load_checkpoint, save_checkpoint  # deferred: tokenizers is heavy
    from .prune import (
        CALIBRATION_SPEC,
        calibration_set,
        check_keep,
        expert_frequencies,
        kept_experts,
        prune_experts,
    )  # deferred: tokenizers is heavy

    if eval_n < 1:
        raise ValueError(f"eval_n must be >= 1, got {eval_n}")
    src_dir, src_preset = resolve_source(model, task)
    t_obj = get_task(task)
    source = load_checkpoint(src_dir)
    keep = check_keep(source.config, keep)
    set_threads(threads)
    t0 = time.perf_counter()
    freqs = expert_frequencies(source, calibration_set(t_obj, calib_n, seed))
    net = prune_experts(source, keep, freqs)
    name = f"{src_preset}-e{keep}" if src_preset else f"{src_dir.name}-e{keep}"
    pruned_eval = evaluate_both(net, t_obj, t_obj.eval_set(eval_n), ENGINE_SPEC, seed=seed)
    card = {
        "task": t_obj.name,
        "task_version": t_obj.version,
        "model": name,
        "seed": seed,
        ACCURACY_T1: pruned_eval[ACCURACY_T1],
        ACCURACY_GREEDY: pruned_eval[ACCURACY_GREEDY],
        "mean_response_tokens_t1": pruned_eval["mean_response_tokens_t1"],
        "eval_n": eval_n,
        "eval_seed": seed,
        "engine_spec": ENGINE_SPEC,
    }
    if recover is not None:
        card = warmstart(
            task,
            name,
            None,
            seed=seed,
            band=recover,
            eval_n=eval_n,
            max_steps=max_steps,
            threads=threads,
            eval_every=eval_every,
            progress=progress,
            init=net,
            command="",
        )
    card.update(
        command=command
        or _command(model, task, keep, out, calib_n, seed, recover, eval_n, max_steps, threads, eval_every),
        wall_time_s=round(time.perf_counter() - t0, 1),
        recovery=_recovery(recover, card),
        pruning={
            "method": "expert pruning by activation frequency (arXiv 2608.10823, frequency view "
            "only: no multi-view consistency)",
            "source": str(src_dir),
            "source_preset": src_preset,
            "source_sha256": _sha256(src_dir / "model.safetensors"),
            "experts": source.config.num_experts,
            "keep": keep,
            "top_k": net.config.num_experts_per_tok,
            "calibration": {
                "problems": f"task.train_batch(seed={seed}, step=0, n={calib_n})",
                "tokens": "prompt + reference solution + EOS, no padding",
                "forward": CALIBRATION_SPEC,
            },
            "frequencies": freqs.tolist(),
            "kept_experts": kept_experts(freqs, keep),
            "accuracy_before_recovery": {k: pruned_eval[k] for k in (ACCURACY_T1, ACCURACY_GREEDY)},
        },
    )
    if out is not None:
        save_checkpoint(net, out, card=card)
    return card


def _recovery(recover, card: dict) -> dict | None:
    """The recovery fine-tune's summary on the card (None: the pruned weights are shipped as they are)."""
    if recover is None:
        return None
    return {
        "band": list(recover),
        "steps": card["steps"],
        "lr": card["lr"],
        "batch_size": card["batch_size"],
        "loss": card["loss"],
        "optimizer": card["optimizer"],
        "trainer_spec": card["trainer_spec"],
        "data": "task.train_batch(seed, step, batch_size), steps 1..steps (as timbench warmstart)",
    }


def _command(model, task, keep, out, calib_n, seed, recover, eval_n, max_steps, threads, eval_every) -> str:
    argv = [
        "timbench",
        "prune-experts",
        "--model",
        model,
        "--task",
        task,
        "--keep",
        str(keep),
        "--out",
        str(out),
        "--calib-n",
        str(calib_n),
        "--seed",
        str(seed),
        "--eval-n",
        str(eval_n),
        "--threads",
        str(threads),
    ]
    if recover is not None:
        argv += [
            "--recover",
            f"{recover[0]:g},{recover[1]:g}",
            "--max-steps",
            str(max_steps),
            "--eval-every",
            str(eval_every),
        ]
    return shlex.join(argv)
