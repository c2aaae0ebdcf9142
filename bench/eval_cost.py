"""Process CPU of the paper-grid cell's eval (`evaluate_both`, greedy and T=1 on its 256 problems), by engine phase.

    python bench/eval_cost.py [--slots 512] [--reps 3]

The cell's warm start, eval set and seed (the config of results/dual_clip's baseline cell), exact kernels, one
thread, the loop's eval engine with `--slots` cache slots (the loop's: 2 per problem; 256 gives the two forks
of half the problems at a time). One warm-up eval, then `--reps` timed ones: CPU ms each, and per eval the CPU
ms inside the engine's prefills and decode steps and how many ran. Prints the accuracies too: they must not move
with `--slots`.
"""

from __future__ import annotations

import argparse
import collections
import time

CELL = "results/dual_clip/runs/add-4d-v1.tiny-dense.baseline.none.recompute.grpo.s3/config.yaml"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--slots", type=int, default=512)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    import torch

    from timbench.engine import engine as engine_mod
    from timbench.engine import make_engine
    from timbench.evaluate import evaluate_both
    from timbench.model import load_checkpoint
    from timbench.rl.config import load_config
    from timbench.spec.keys import ZERO_MISMATCH
    from timbench.util.shipped import resolve_checkpoint
    from timbench.util.threads import set_threads

    set_threads(1)
    torch.use_deterministic_algorithms(True)
    cfg = load_config(CELL)
    base = load_checkpoint(resolve_checkpoint(cfg.model, cfg.task, cfg.preset))
    engine = make_engine(base.config, ZERO_MISMATCH, max_num_seqs=args.slots, weights=base)
    cpu, calls = collections.defaultdict(float), collections.Counter()
    for name in ("_prefill", "_decode"):
        real = getattr(engine_mod.Engine, name)

        def timed(*a, _real=real, _name=name, **k):
            t = time.process_time()
            out = _real(*a, **k)
            cpu[_name] += time.process_time() - t
            calls[_name] += 1
            return out

        setattr(engine_mod.Engine, name, timed)
    first = evaluate_both(base, cfg.task_impl, cfg.eval_problems, seed=cfg.seed, engine=engine)
    cpu.clear()
    calls.clear()
    times = []
    for _ in range(args.reps):
        t = time.process_time()
        assert evaluate_both(base, cfg.task_impl, cfg.eval_problems, seed=cfg.seed, engine=engine) == first
        times.append(round((time.process_time() - t) * 1000))
    print(first)
    print(f"eval CPU ms: {times} (median {sorted(times)[len(times) // 2]})")
    for name in cpu:
        print(f"  {name}: {cpu[name] / args.reps * 1000:.0f} ms in {calls[name] // args.reps} calls per eval")


if __name__ == "__main__":
    main()
