"""The gate's RL-outcome probe: short seeded RL runs with the engine under test learn and do not collapse.

Each seed is one `timbench.rl.loop.run` (what `timbench train` runs) of GRPO on add-4d-v1 from the
model's shipped warm start, with the engine spec under test on the rollout side and timbench's exact
fp32 trainer, in bypass mode (pi_old = the engine's logprobs, verl's bypass_mode), so both the engine's
samples and its logprobs reach the update. A run is judged on its training reward, the reward of the
engine's own rollouts: the mean over its first `window` steps (start) and its last `window` steps
(final). The probe passes when (a) it learns: the seeds' mean final reward is above their mean start;
(b) no seed collapses by the repo's collapse rule (`timbench.report.collapse`, default thresholds); and
(c) the seeds' mean final reward is not below the lower bound of the 95% interval of the stored
reference: the per-seed final rewards the exact fp32 engine gives on the same seeds, kept in the suite
(same config + seed -> byte-identical metrics on any x86-64 CPU, so the clean engine reproduces them
exactly; a suite whose probe config changes gets a new reference and a new version).
"""

from __future__ import annotations

import json
import math
import tempfile
from pathlib import Path

from ..metrics.schema import ACCURACY_T1, REWARD_MEAN
from ..report.collapse import detect_collapse
from ..report.stats import mean_interval

RL_TASK = "add-4d-v1"
"""The task of the shipped warm starts the gate's tiny models are."""


def one_run(preset: str, spec, seed: int, p: dict) -> dict:
    """One short RL run in a temporary directory: its per-step rewards, eval accuracies and collapse verdict."""
    import torch  # deferred: torch is heavy

    from ..rl.config import from_dict  # deferred: torch is heavy
    from ..rl.loop import NonFiniteError, run  # deferred: torch is heavy
    from ..util.threads import set_threads  # deferred: torch is heavy

    cfg = {
        "task": RL_TASK,
        "preset": preset,
        "algorithm": "grpo",
        "mode": p["mode"],
        "engine": str(spec),
        "trainer": "kernels=exact,dtype=fp32",
        "seed": seed,
        "steps": p["steps"],
        "prompts_per_step": p["prompts_per_step"],
        "group_size": p["group_size"],
        "lr": p["lr"],
        "eval_every": p["steps"],
        "eval_n": p["eval_n"],
        "checkpoint_every": p["steps"],
        "threads": 1,
    }  # as RL runs are configured (measured, a 3-step run on 2 busy cores: 1 thread 44 s, 2 threads 292 s)
    threads = torch.get_num_threads()
    with tempfile.TemporaryDirectory(prefix="timbench-gate-rl-") as d:
        try:
            run(from_dict(cfg, "gate rl_outcome"), d, progress=False)
        except NonFiniteError:
            pass  # summary.json says failed: the collapse rule calls it non_finite
        finally:
            set_threads(threads)  # run() pins the process's threads; the next probes get the gate's back
        read = lambda name: [json.loads(line) for line in (Path(d) / name).read_text().splitlines()]  # noqa: E731
        rows, evals = read("metrics.jsonl"), read("eval.jsonl")
        summary = json.loads((Path(d) / "summary.json").read_text())
    rewards = [r[REWARD_MEAN] for r in rows]
    w = p["window"]
    return {
        "start": math.fsum(rewards[:w]) / w,
        "final": math.fsum(rewards[-w:]) / w if len(rewards) >= w else 0.0,
        "collapse": detect_collapse(rows, evals, summary),
        "eval_t1": [e[ACCURACY_T1] for e in evals],
    }


def rl_outcome(make, model, p: dict, params, spec, runner=one_run):
    """`seeds` short RL runs (seeds suite seed + 0, 1, ...) on model `p["model"]`: learns, no collapse, mean
    final reward >= the lower bound of the stored reference's 95% interval (module docstring)."""
    from .probes import Probe  # cycle: probes imports this module (to register the probe)

    name, ref = p["model"], p["reference"]
    if name not in ref:
        raise ValueError(
            f"gate suite: rl_outcome has no stored reference for model {name!r}; it has "
            f"{', '.join(ref) or 'none'} (run the probe on the exact engine and store its finals)"
        )
    runs = [runner(name, spec, params.seed + i, p) for i in range(p["seeds"])]
    finals, starts = [r["final"] for r in runs], [r["start"] for r in runs]
    cand, base, start = mean_interval(finals), mean_interval(ref[name]), mean_interval(starts)
    collapsed = [params.seed + i for i, r in enumerate(runs) if r["collapse"]["collapsed"]]
    gain = cand.mean - start.mean
    numbers = {
        "seeds": [params.seed + i for i in range(len(runs))],
        "start_reward": [round(x, 4) for x in starts],
        "final_reward": [round(x, 4) for x in finals],
        "eval_t1_start_end": [[r["eval_t1"][0], r["eval_t1"][-1]] for r in runs],
        "start_mean": start.mean,
        "final_mean": cand.mean,
        "final_lo": cand.lo,
        "final_hi": cand.hi,
        "reference_mean": base.mean,
        "reference_lo": base.lo,
        "reference_hi": base.hi,
        "gain": gain,
        "collapses": len(collapsed),
        "collapsed_seeds": collapsed,
    }
    return Probe(
        gain > 0 and not collapsed and cand.mean >= base.lo,
        numbers,
        {"min_gain": 0.0, "min_final_mean": base.lo, "collapses": 0},
    )
