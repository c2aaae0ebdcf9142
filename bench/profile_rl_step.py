"""Where an RL step's time goes, `exact` next to `torch` kernels: ms per phase and the top functions in each.

    python bench/profile_rl_step.py [--steps 3] [--threads 2] [--out results/bench/profile_rl_step]
    python bench/profile_rl_step.py --paper [--steps 16] [--out results/bench/profile_paper_cell]

One step of bench/runs/baseline.yaml (the RL-step benchmark's config, set up by its `rl_stepper`) is split
into the loop's phases in order: collect (engine rollout), recompute (trainer old logprobs), correct
(remedy), update (mini-batch forward/backward/AdamW), sync (weights to the engine), metrics. Each phase
runs under cProfile, so the table names the Python-level functions (numba kernels appear as their
dispatcher) that hold its time. One warm-up step (numba compile, allocator) is left out; the reported ms
are medians over `--steps` steps. Writes PREFIX.md (tables) and PREFIX.json (numbers + machine).
Measure on a quiet machine: another process on the cores inflates every phase.

`--paper` profiles the paper grid's unit of work instead: its reference cell (bench/grids/paper.yaml's base on
the baseline condition, 16 prompts x 8, 2 mini-batches, seed 0), exact kernels, one thread, with the loop's
eval (greedy and T=1 on `eval_n` problems, as `timbench.rl.loop` runs it) after every `eval_every`-th step.
There cProfile's per-call cost would inflate the Python-heavy phases, so recorded steps alternate: the ms come
from the unprofiled ones, the top functions from the profiled ones (and likewise for the evals); the table
also projects the cell (`steps` steps and `steps / eval_every + 1` evals) from the medians.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import json
import os
import pstats
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
# The benchmark's config (its conftest sets the benchmarks' thread count on import: main's --threads come after).
from test_bench_rl_step import BASELINE, KERNELS  # noqa: E402

PHASES = ("collect", "recompute", "correct", "update", "sync", "metrics")
PAPER_GRID = HERE / "grids" / "paper.yaml"
PAPER_CELL = "add-4d-v1.tiny-dense.baseline.none.recompute.grpo.s0"


def paper_config():
    """The paper grid's reference cell, loaded as `timbench grid run` loads it (one thread, eval every 8 steps)."""
    from timbench.grid.spec import expand, load_grid
    from timbench.rl.config import from_dict, load

    cell = next(c for c in expand(load_grid(PAPER_GRID)) if c.id == PAPER_CELL)
    return load(from_dict(cell.config, f"cell {cell.id}"))


def profile_steps(kernels: str, steps: int, cfg=None, alternate: bool = False, top: int = 5) -> dict:
    """{phase: {"ms": [per step], "top": [(function, own ms per profiled step)]}} for one kernel set.

    `cfg` None: bench/runs/baseline.yaml with `kernels`; else that loaded config, and its eval (phase "eval", every
    `cfg.eval_every` steps, as the loop runs it). `alternate`: time even recorded steps, profile odd ones.
    """
    import torch

    from timbench.engine import make_engine
    from timbench.evaluate import evaluate_both
    from timbench.model import load_checkpoint
    from timbench.rl import step as rl_step
    from timbench.rl.config import load_config
    from timbench.spec.keys import ZERO_MISMATCH
    from timbench.util.shipped import resolve_checkpoint

    with_eval = cfg is not None and cfg.eval_every > 0
    cfg = cfg or load_config(BASELINE, KERNELS[kernels])
    torch.use_deterministic_algorithms(True)
    base = load_checkpoint(resolve_checkpoint(cfg.model, cfg.task, cfg.preset))
    n = cfg.prompts_per_step * cfg.group_size
    lane = rl_step.make_lane("main", base, cfg, cfg.main_engine, cfg.main_trainer, n, cfg.remedy_impl)
    eval_engine = make_engine(base.config, ZERO_MISMATCH, max_num_seqs=2 * min(256, cfg.eval_n)) if with_eval else None

    def run_eval():  # timbench.rl.loop._Session.evaluate, main lane only
        eval_engine.load_weights(lane.model)
        evaluate_both(lane.model, cfg.task_impl, cfg.eval_problems, seed=cfg.seed, engine=eval_engine)

    phases = PHASES + (("eval",) if with_eval else ())
    out = {p: {"ms": [], "cpu_ms": [], "prof": cProfile.Profile(), "profiled": 0} for p in phases}
    counts = dict.fromkeys(phases, 0)

    def phase(name, record, fn, *args):
        # alternate: the phase's own count decides (evals are rarer than steps), timed first, then profiled
        profiled = record and alternate and counts[name] % 2 == 1
        timed = record and not profiled
        if record:
            counts[name] += 1
        prof = out[name]["prof"]
        t0, c0 = time.perf_counter(), time.process_time()
        if record and (profiled or not alternate):
            prof.enable()
        result = fn(*args)
        if record and (profiled or not alternate):
            prof.disable()
            out[name]["profiled"] += 1
        if timed:
            out[name]["ms"].append((time.perf_counter() - t0) * 1e3)
            out[name]["cpu_ms"].append((time.process_time() - c0) * 1e3)
        return result

    if with_eval:
        phase("eval", False, run_eval)  # the loop's step-0 eval: warms the eval engine up
        gc.collect()  # as timbench.rl.loop does after its set-up
        gc.freeze()
    for step in range(steps + 1):  # step 0 warms up (numba compile), not recorded
        record = step > 0
        batch = phase("collect", record, rl_step.collect_phase, lane, cfg, step)
        phase("recompute", record, rl_step.recompute_phase, lane, cfg, batch)
        phase("correct", record, rl_step.correct_phase, lane, cfg, batch)
        phase("update", record, rl_step.update_phase, lane, cfg, batch)
        phase("sync", record, rl_step.sync_engine, lane)
        phase("metrics", record, rl_step.metrics_phase, lane, batch)
        if with_eval and (step + 1) % cfg.eval_every == 0:
            phase("eval", record, run_eval)
    for name in phases:
        stats = pstats.Stats(out[name].pop("prof"))
        per = max(1, out[name].pop("profiled"))
        rows = sorted(((v[2], _fname(k)) for k, v in stats.stats.items()), reverse=True)[:top]  # v[2]: own time
        out[name]["top"] = [(f, round(t * 1e3 / per, 1)) for t, f in rows]
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
    ap.add_argument("--steps", type=int, default=None, help="recorded steps per kernel set (after one warm-up)")
    ap.add_argument("--threads", type=int, default=None, help="torch and numba threads")
    ap.add_argument("--out", default=None, help="output prefix (.md and .json)")
    ap.add_argument(
        "--paper", action="store_true", help="the paper grid's cell (16x8, 1 thread, with its eval), exact kernels"
    )
    args = ap.parse_args(argv)
    if args.paper:
        args.steps, args.threads = args.steps or 16, args.threads or 1
        args.out = args.out or "build/bench/profile_paper_cell"
    else:
        args.steps, args.threads = args.steps or 3, args.threads or 2
        args.out = args.out or "build/bench/profile_rl_step"
    if args.steps < 1 or args.threads < 1:
        ap.error(f"--steps and --threads must be >= 1, got {args.steps} and {args.threads}")
    from timbench.fingerprint import machine
    from timbench.util.threads import set_threads

    set_threads(args.threads)
    if args.paper:
        return paper_main(args, machine())
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
    write(
        args.out,
        lines,
        {
            "command": cmd,
            "machine": info,
            "median_ms": med,
            "top": {k: {p: res[k][p]["top"] for p in PHASES} for k in res},
        },
    )
    print("\n".join(lines[:14]))
    return 0


def paper_main(args, info: dict) -> int:
    """The paper cell's profile: ms per phase (steps and evals), the projected cell, the top functions."""
    cfg = paper_config()
    res = profile_steps("exact", args.steps, cfg, alternate=True, top=8)
    phases = PHASES + ("eval",)
    med = {p: statistics.median(res[p]["ms"]) for p in phases}
    cpu = {p: statistics.median(res[p]["cpu_ms"]) for p in phases}
    evals = cfg.steps // cfg.eval_every + 1
    # The projection reads CPU time: on a shared machine wall time also counts the other processes' turns.
    cell = {p: cpu[p] * (evals if p == "eval" else cfg.steps) / 1e3 for p in phases}
    total = sum(cell.values())
    import numba
    import torch

    # what ran, not what was asked: a thread count set behind main's back would show here
    info = info | {"threads": args.threads, "steps": args.steps}
    info |= {"numba_threads": numba.get_num_threads(), "torch_threads": torch.get_num_threads()}
    cmd = f"python bench/profile_rl_step.py --paper --steps {args.steps} --threads {args.threads} --out {args.out}"
    lines = [
        "# Paper-grid cell profile (exact kernels, one thread)",
        "",
        f"`{cmd}` on {info['cpu']} ({', '.join(info['isa'])}), {args.threads} thread(s); the paper grid's cell "
        f"{PAPER_CELL} (tiny-dense, {cfg.prompts_per_step} prompts x {cfg.group_size}, {cfg.mini_batches} "
        f"mini-batches, eval of greedy and T=1 on {cfg.eval_n} problems every {cfg.eval_every} steps). "
        f"{args.steps} steps after one warm-up step, alternately timed and profiled: median wall and process-CPU "
        f"ms over the {len(res['collect']['ms'])} timed steps and {len(res['eval']['ms'])} timed eval(s); the "
        f"cell column projects {cfg.steps} steps and {evals} evals from the CPU ms (no start-up, checkpoints or "
        "logs). The top functions are cProfile's own (wall) time in the profiled steps: numba kernels count "
        "under their dispatcher, C tiles under `native.py:_run` / `attend_causal*`.",
        "",
        "| phase | wall ms | CPU ms | per cell CPU s | share |",
        "|---|---:|---:|---:|---:|",
    ]
    for p in phases:
        label = p + (" (per eval)" if p == "eval" else "")
        lines.append(f"| {label} | {med[p]:.0f} | {cpu[p]:.0f} | {cell[p]:.1f} | {cell[p] / total:.0%} |")
    step_w, step_c = sum(med[p] for p in PHASES), sum(cpu[p] for p in PHASES)
    lines.append(f"| step (all but eval) | {step_w:.0f} | {step_c:.0f} | {step_c * cfg.steps / 1e3:.1f} | |")
    lines.append(f"| cell | | | {total:.1f} | 100% |")
    lines += ["", "## Top functions by own time, per profiled step (eval: per eval)", "", "| phase | function | ms |"]
    lines.append("|---|---|---:|")
    for p in phases:
        lines += [f"| {p} | `{f}` | {ms} |" for f, ms in res[p]["top"]]
    data = {
        "command": cmd,
        "machine": info,
        "cell": PAPER_CELL,
        "median_ms": med,
        "median_cpu_ms": cpu,
        "samples_ms": {p: res[p]["ms"] for p in phases},
        "samples_cpu_ms": {p: res[p]["cpu_ms"] for p in phases},
        "projected_cell_s": cell | {"total": total},
        "top": {p: res[p]["top"] for p in phases},
    }
    write(args.out, lines, data)
    print("\n".join(lines))
    return 0


def write(prefix: str, lines: list[str], data: dict) -> None:
    out = Path(prefix)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    out.with_suffix(".json").write_text(json.dumps(data, indent=1) + "\n")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    sys.exit(main())
