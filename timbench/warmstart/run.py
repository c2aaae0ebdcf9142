"""Supervised warm start: fine-tune a fresh preset on a task's correct solutions
until its T=1 accuracy lies in a target band, then write an HF-layout checkpoint.

RL needs a starting policy that is right sometimes (signal) and wrong often
(headroom); the band (default 20-60% at T=1) says how often. Training is
cross-entropy on response tokens only (`sequence_logprobs` with the fast
`torch` kernels), AdamW, grad clip 1.0; every `eval_every` steps the first
`probe_n` eval problems are sampled at T=1 with the exact engine, and as soon as
that probe is in band the full `eval_n` set is measured (T=1 and greedy): if it
is in band too, training stops there.

Deterministic from the seed and thread count: the init uses the model's
explicit generator, the data of step s is `task.train_batch(seed, s, batch)`
(string-seeded, no global RNG), and evaluation noise is keyed by
(seed, request id, position).
"""

from __future__ import annotations

import shlex
import sys
import time
from pathlib import Path

import torch
from tqdm import tqdm

from ..kernels.reduce import fsum, masked_sum
from ..metrics.schema import ACCURACY_GREEDY, ACCURACY_T1
from ..spec.keys import parse_spec
from ..tasks import get_task
from ..util.threads import set_threads
from .cli import DEFAULT_MODEL  # noqa: E402  (one definition, in the torch-free CLI module)

TRAINER_SPEC = "kernels=torch,dtype=fp32"
ENGINE_SPEC = "kernels=exact,dtype=fp32"


class WarmstartError(ValueError):
    """A warm start that cannot run or did not reach its band; `str()` is one line."""


def parse_band(text: str) -> tuple[float, float]:
    """'0.2,0.6' -> (0.2, 0.6); 0 <= lo <= hi <= 1."""
    parts = str(text).split(",")
    try:
        if len(parts) != 2:
            raise ValueError
        lo, hi = float(parts[0]), float(parts[1])
    except ValueError:
        raise WarmstartError(f"band {text!r} is not LO,HI (two numbers, e.g. 0.2,0.6)") from None
    if not (0.0 <= lo <= hi <= 1.0):
        raise WarmstartError(f"band {text!r} needs 0 <= LO <= HI <= 1")
    return lo, hi


def _in_band(acc: float, band) -> bool:
    return band[0] <= acc <= band[1]


def sft_batch(problems) -> list[tuple[tuple[int, ...], list[int]]]:
    """(prompt ids, solution + EOS ids) per problem: what the warm start imitates."""
    from ..data import encode_prompt, encode_response  # deferred: tokenizers is heavy

    return [(encode_prompt(p.prompt), encode_response(p.solution)) for p in problems]


def sft_objective(out, rows=None) -> tuple[torch.Tensor, dict]:
    """Mean cross-entropy over response tokens (solution + EOS) given the prompt, from a trainer forward."""
    return -(masked_sum(out.logprobs, out.mask) / fsum(out.mask)), {}


def sft_loss(model, compute, problems) -> torch.Tensor:
    """Mean cross-entropy over response tokens (solution + EOS) given the prompt."""
    from ..trainer import sequence_logprobs  # deferred: tokenizers is heavy

    return sft_objective(sequence_logprobs(model, compute, sft_batch(problems), temperature=1.0))[0]


def warmstart(
    task: str,
    model: str = DEFAULT_MODEL,
    out: str | Path | None = None,
    seed: int = 0,
    band=(0.2, 0.6),
    eval_n: int = 256,
    max_steps: int = 1000,
    threads: int = 2,
    batch_size: int = 128,
    lr: float = 1e-3,
    eval_every: int = 10,
    probe_n: int = 128,
    progress: bool = True,
    command: str | None = None,
    init=None,
) -> dict:
    """Run a warm start; write the checkpoint (with card.json) to `out` if given; return the card.

    `init` (a Qwen3ForCausalLM, default None: a fresh `model` preset from `seed`) is trained in place
    instead, and `model` is then only its name on the card (a pruned proxy's recovery: timbench.warmstart.proxy).

    Phases: check the arguments, build the model / optimizer / engine, train until the eval accuracy
    is in the band (`_train_to_band`), write the card. Raises WarmstartError when the band is not
    reached within `max_steps` (or is overshot between two evaluations), UnknownTaskError for a bad
    task, ValueError for bad arguments.
    """
    from ..engine import make_engine  # deferred: tokenizers is heavy
    from ..evaluate import both_slots  # deferred: tokenizers is heavy
    from ..model import PRESETS, Compute, Qwen3ForCausalLM, save_checkpoint  # deferred: tokenizers is heavy
    from ..trainer.optim import AdamW  # deferred: tokenizers is heavy

    t_obj, band = _check_args(
        task,
        model if init is None else None,
        band,
        eval_n=eval_n,
        max_steps=max_steps,
        batch_size=batch_size,
        eval_every=eval_every,
        probe_n=probe_n,
        threads=threads,
    )
    set_threads(threads)
    t0 = time.perf_counter()
    net = Qwen3ForCausalLM(PRESETS[model], seed=seed) if init is None else init
    compute = Compute.from_spec(parse_spec(TRAINER_SPEC, "trainer spec", side="trainer"))
    opt = AdamW(net.parameters(), lr=lr, betas=(0.9, 0.99), weight_decay=0.0)
    eval_set = t_obj.eval_set(eval_n)
    probe = eval_set[: min(probe_n, eval_n)]
    engine = make_engine(
        net.config, parse_spec(ENGINE_SPEC, "engine spec", side="engine"), max_num_seqs=both_slots(eval_n), weights=net
    )
    final, history, step, loss_v = _train_to_band(
        net,
        opt,
        compute,
        engine,
        t_obj,
        eval_set,
        probe,
        band,
        (task, model),
        seed=seed,
        eval_n=eval_n,
        max_steps=max_steps,
        batch_size=batch_size,
        eval_every=eval_every,
        progress=progress,
    )
    wall = time.perf_counter() - t0
    card = {
        "task": t_obj.name,
        "task_version": t_obj.version,
        "model": model,
        "seed": seed,
        "steps": step,
        "wall_time_s": round(wall, 1),
        ACCURACY_T1: final[ACCURACY_T1],
        ACCURACY_GREEDY: final[ACCURACY_GREEDY],
        "mean_response_tokens_t1": final["mean_response_tokens_t1"],
        "eval_n": eval_n,
        "eval_seed": seed,
        "band": list(band),
        "command": command
        or shlex.join(
            [
                "timbench",
                "warmstart",
                "--task",
                task,
                "--model",
                model,
                "--out",
                str(out),
                "--seed",
                str(seed),
                "--band",
                f"{band[0]:g},{band[1]:g}",
                "--eval-n",
                str(eval_n),
                "--max-steps",
                str(max_steps),
                "--threads",
                str(threads),
                "--batch-size",
                str(batch_size),
                "--lr",
                f"{lr:g}",
                "--eval-every",
                str(eval_every),
                "--probe-n",
                str(probe_n),
            ]
        ),
        "threads": threads,
        "batch_size": batch_size,
        "lr": lr,
        "optimizer": "AdamW(betas=(0.9, 0.99), weight_decay=0), grad clip 1.0",
        "loss": "mean cross-entropy on response tokens (solution + EOS)",
        "final_train_loss": round(loss_v, 4),
        "trainer_spec": TRAINER_SPEC,
        "engine_spec": ENGINE_SPEC,
        "probe_n": len(probe),
        "eval_every": eval_every,
        "probe_history": history,
        "torch_version": torch.__version__,
    }
    if out is not None:
        save_checkpoint(net, out, card=card)
    return card


def _check_args(task: str, model: str | None, band, **counts: int):
    """The task object and the band as a (lo, hi) tuple; WarmstartError on a bad preset (None: no preset
    to check), band or count."""
    from ..model import PRESETS  # deferred: tokenizers is heavy

    t_obj = get_task(task)
    if model is not None and model not in PRESETS:
        raise WarmstartError(f"unknown model preset {model!r}; valid: {', '.join(PRESETS)}")
    band = parse_band(band) if isinstance(band, str) else tuple(float(b) for b in band)
    if len(band) != 2 or not (0.0 <= band[0] <= band[1] <= 1.0):
        raise WarmstartError(f"band {band} needs 0 <= LO <= HI <= 1")
    for name, v in counts.items():
        if int(v) < 1:
            raise WarmstartError(f"{name} must be >= 1, got {v}")
    return t_obj, band


def _train_to_band(
    net,
    opt,
    compute,
    engine,
    t_obj,
    eval_set,
    probe,
    band,
    task_model: tuple[str, str],
    *,
    seed: int,
    eval_n: int,
    max_steps: int,
    batch_size: int,
    eval_every: int,
    progress: bool,
):
    """SFT steps until the full eval's T=1 accuracy is in `band`: (final eval, probe history, steps, last loss).

    The cheap probe runs every `eval_every` steps; the full eval only once the probe reaches the band.
    """
    from ..evaluate import evaluate, evaluate_both  # deferred: tokenizers is heavy
    from ..trainer import MiniBatch, update_policy  # deferred: tokenizers is heavy

    history: list[list] = []  # [step, probe accuracy at T=1]
    loss_v = float("nan")
    last_acc = "-"
    step = 0
    what = "/".join(task_model)
    bar = tqdm(
        total=max_steps,
        desc=f"warmstart {' '.join(task_model)}",
        file=sys.stderr,
        disable=not progress,
        dynamic_ncols=True,
    )
    try:
        for step in range(1, max_steps + 1):
            net.train()
            seqs = sft_batch(t_obj.train_batch(seed, step, batch_size))
            loss_v = update_policy(
                net,
                opt,
                compute,
                [MiniBatch(slice(0, len(seqs)), seqs)],
                sft_objective,
                epochs=1,
                grad_clip=1.0,
                temperature=1.0,
            )[0]["actor/loss"]
            bar.update(1)
            if step % eval_every and step != max_steps:
                bar.set_postfix(loss=f"{loss_v:.3f}", acc_t1=last_acc, refresh=False)
                continue
            engine.load_weights(net)
            acc = evaluate(net, t_obj, probe, temperature=1.0, seed=seed, engine=engine)["accuracy"]
            history.append([step, round(acc, 4)])
            last_acc = f"{acc:.3f}"
            bar.set_postfix(loss=f"{loss_v:.3f}", acc_t1=last_acc)
            if acc < band[0] and step != max_steps:
                continue
            full = evaluate_both(net, t_obj, eval_set, seed=seed, engine=engine)
            if _in_band(full[ACCURACY_T1], band):
                return full, history, step, loss_v
            _check_not_past_band(full[ACCURACY_T1], band, what, step, eval_n, eval_every, max_steps)
    finally:
        bar.close()
    raise AssertionError("unreachable: the last step always evaluates")  # pragma: no cover


def _check_not_past_band(acc: float, band, what: str, step: int, eval_n: int, eval_every: int, max_steps: int) -> None:
    """WarmstartError when `acc` overshot the band, or is still below it at the last step."""
    if acc > band[1]:
        raise WarmstartError(
            f"{what}: T=1 accuracy {acc:.3f} on {eval_n} eval problems "
            f"overshot the band {band[0]:g}-{band[1]:g} at step {step}; "
            f"evaluate more often (eval_every={eval_every}) or widen the band"
        )
    if step == max_steps:
        raise WarmstartError(
            f"{what}: T=1 accuracy {acc:.3f} on {eval_n} eval problems is "
            f"below the band {band[0]:g}-{band[1]:g} after max_steps={max_steps}; raise --max-steps"
        )
