"""Where an RL step's time goes, `exact` next to `torch` kernels: ms per phase and the top functions in each.

    python bench/profile_rl_step.py [--steps 3] [--threads 2] [--out results/bench/profile_rl_step]

One step of bench/runs/baseline.yaml (the RL-step benchmark's config, set up by its `rl_stepper`) is split
into the loop's phases in order: collect (engine rollout), recompute (trainer old logprobs), correct
(remedy), update (mini-batch forward/backward/AdamW), sync (weights to the engine), metrics. Each phase
runs under cProfile, so the table names the Python-level functions (numba kernels appear as their
dispatcher) that hold its time. One warm-up step (numba compile, allocator) is left out; the reported ms
are medians over `--steps` steps. Writes PREFIX.md (tables) and PREFIX.json (numbers + machine).
Measure on a quiet machine: another process on the cores inflates every phase.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

PHASES = ("collect", "recompute", "correct", "update", "sync", "metrics")


def profile_steps(kernels: str, steps: int) -> dict:
    """{phase: {"ms": [per step], "top": [(function, cumulative-own ms per step)]}} for one kernel set."""
    import torch
    from test_bench_rl_step import BASELINE, KERNELS

    from timbench.rl import step as rl_step
    from timbench.rl.config import load_config

    cfg = load_config(BASELINE, KERNELS[kernels])
    torch.use_deterministic_algorithms(True)
    lane_box = {}

    def setup():
        from timbench.model import load_checkpoint
        from timbench.warmstart.shipped import resolve_checkpoint

        base = load_checkpoint(resolve_checkpoint(cfg.model, cfg.task, cfg.preset))
        lane_box["lane"] = rl_step.make_lane(
            "main", base, cfg, cfg.main_engine, cfg.main_trainer, cfg.prompts_per_step * cfg.group_size, cfg.remedy_impl
        )

    setup()
    lane = lane_box["lane"]
    out = {p: {"ms": [], "prof": cProfile.Profile()} for p in PHASES}
    for step in range(steps + 1):  # step 0 warms up (numba compile), not recorded
        record = step > 0
        batch = None

        def phase(name, fn, *args):
            prof = out[name]["prof"]
            t0 = time.perf_counter()
            if record:
                prof.enable()
            result = fn(*args)
            if record:
                prof.disable()
                out[name]["ms"].append((time.perf_counter() - t0) * 1e3)
            return result

        batch = phase("collect", rl_step.collect_phase, lane, cfg, step)
        phase("recompute", rl_step.recompute_phase, lane, cfg, batch)
        phase("correct", rl_step.correct_phase, lane, cfg, batch)
        phase("update", rl_step.update_phase, lane, cfg, batch)
        phase("sync", rl_step.sync_engine, lane)
        phase("metrics", rl_step.metrics_phase, lane, batch)
    for name in PHASES:
        stats = pstats.Stats(out[name].pop("prof"))
        rows = sorted(((v[2], _fname(k)) for k, v in stats.stats.items()), reverse=True)[:5]  # v[2]: own time
        out[name]["top"] = [(f, round(t * 1e3 / steps, 1)) for t, f in rows]
    return out


def _fname(key) -> str:
    path, line, name = key
    if path == "~":
        return name  # a builtin or C function: '<built-in method ...>'
    parts = Path(path).parts
    short = "/".join(parts[parts.index("timbench") :]) if "timbench" in parts else Path(path).name
    return f"{short}:{name}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=3, help="recorded steps per kernel set (after one warm-up)")
    ap.add_argument("--threads", type=int, default=2, help="torch and numba threads")
    ap.add_argument("--out", default="build/bench/profile_rl_step", help="output prefix (.md and .json)")
    args = ap.parse_args(argv)
    from timbench.fingerprint import machine
    from timbench.util.threads import set_threads

    set_threads(args.threads)
    res = {k: profile_steps(k, args.steps) for k in ("exact", "torch")}
    med = {k: {p: statistics.median(res[k][p]["ms"]) for p in PHASES} for k in res}
    info = machine() | {"threads": args.threads, "steps": args.steps}
    cmd = f"python bench/profile_rl_step.py --steps {args.steps} --threads {args.threads} --out {args.out}"
    lines = [
        "# RL step profile: exact vs torch kernels",
        "",
        f"`{cmd}` on {info['cpu']} ({', '.join(info['isa'])}), {args.threads} threads; "
        f"bench/runs/baseline.yaml (tiny-dense, 32 prompts x 8, 2 mini-batches); median ms over "
        f"{args.steps} steps after one warm-up.",
        "",
        "| phase | exact ms | torch ms | exact/torch |",
        "|---|---:|---:|---:|",
    ]
    for p in PHASES + ("total",):
        e = sum(med["exact"].values()) if p == "total" else med["exact"][p]
        t = sum(med["torch"].values()) if p == "total" else med["torch"][p]
        lines.append(f"| {p} | {e:.0f} | {t:.0f} | {e / t:.2f} |" if t else f"| {p} | {e:.0f} | {t:.0f} | - |")
    for k in res:
        lines += [
            "",
            f"## Top functions by own time per step, {k} kernels",
            "",
            "| phase | function | ms/step |",
            "|---|---|---:|",
        ]
        for p in PHASES:
            lines += [f"| {p} | `{f}` | {ms} |" for f, ms in res[k][p]["top"]]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    out.with_suffix(".json").write_text(
        json.dumps(
            {
                "command": cmd,
                "machine": info,
                "median_ms": med,
                "top": {k: {p: res[k][p]["top"] for p in PHASES} for k in res},
            },
            indent=1,
        )
        + "\n"
    )
    print("\n".join(lines[:14]))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    sys.exit(main())
