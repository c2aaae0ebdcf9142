"""Which sequences does sequence-level K3 rejection keep, by advantage sign? (docs/findings/paper.md, F5)

On the paper grid's nvfp4-rollout recompute cells (bench/grids/paper.yaml), replays each seed's first 3 steps
with the grid's own phases (collect: the quantized engine samples; recompute: the fp32 trainer's pi_old) and
counts, for the K3 thresholds of the F5 ablation, the sequences kept among those with A > 0, A < 0 and A = 0,
and the mean advantage of the kept ones. Deterministic (exact kernels, seeded sampler): the same numbers on
any CPU. Writes results/paper/rejection_bias.json.

    .venv/bin/python bench/paper_rejection_bias.py
"""

from __future__ import annotations

import json
from pathlib import Path

from timbench.grid.spec import expand, load_grid
from timbench.metrics.ratios import k3, log_rho, seq_mean
from timbench.model import load_checkpoint
from timbench.rl.config import from_dict, load
from timbench.rl.step import collect_phase, make_lane, recompute_phase
from timbench.util.atomic import atomic_write
from timbench.util.shipped import default_checkpoint

ROOT = Path(__file__).resolve().parents[1]
THRESHOLDS = (0.001, 0.01)
STEPS = 3


def main() -> dict:
    grid = load_grid(ROOT / "bench/grids/paper.yaml")
    cells = [
        c
        for c in expand(grid)
        if c.axes["condition"] == "nvfp4-rollout" and c.axes["remedy"] == "none" and c.axes["mode"] == "recompute"
    ]
    counts = {str(t): {"A>0": [0, 0], "A<0": [0, 0], "A=0": [0, 0], "sum_adv_kept": 0.0} for t in THRESHOLDS}
    for c in cells:
        run = load(from_dict(c.config, c.id))
        base = load_checkpoint(default_checkpoint(run.task, run.preset))
        n = run.config.prompts_per_step * run.config.group_size
        lane = make_lane("main", base, run.config, run.main_engine, run.main_trainer, n, run.remedy_impl)
        for step in range(STEPS):  # no update in between: each step samples from the warm start
            b = collect_phase(lane, run, step)
            recompute_phase(lane, run, b)
            div = seq_mean(k3(log_rho(b.old_logprobs, b.exp.rollout_logprobs, b.mask)), b.mask)
            adv = b.advantages
            for t in THRESHOLDS:
                keep, row = div <= t, counts[str(t)]
                for name, sel in (("A>0", adv > 0), ("A<0", adv < 0), ("A=0", adv == 0)):
                    row[name][0] += int((keep & sel).sum())
                    row[name][1] += int(sel.sum())
                row["sum_adv_kept"] += float(adv[keep].double().sum())
    out = {
        "cells": [c.id for c in cells],
        "steps_per_cell": STEPS,
        "criterion": "mean_t k3(log rho) <= threshold",
        "thresholds": {},
    }
    for t, row in counts.items():
        kept = sum(row[k][0] for k in ("A>0", "A<0", "A=0"))
        out["thresholds"][t] = {
            **{f"kept {k} (kept, of)": row[k] for k in ("A>0", "A<0", "A=0")},
            **{f"kept fraction {k}": round(row[k][0] / max(1, row[k][1]), 4) for k in ("A>0", "A<0", "A=0")},
            "mean advantage of kept": round(row["sum_adv_kept"] / max(1, kept), 4),
        }
    atomic_write(ROOT / "results/paper/rejection_bias.json", json.dumps(out, indent=1, sort_keys=True) + "\n")
    return out


if __name__ == "__main__":
    print(json.dumps(main(), indent=1, sort_keys=True))
