"""In-task dose of rollout conditions on the dense size ladder: the grid's own first RL batch, measured.

`timbench align` places a condition on a random-prompt workload; the grid's cells see add-4d-v1 prompts from
their warm starts, where the same condition moves the logprobs by a different amount (NVFP4 on tiny-dense: 0.11
mean |delta| on the align workload, 0.05 on the task). This script rebuilds a cell's step-0 batch exactly as
the RL loop does (`task.train_batch(seed, 0, 16)` x 8 responses through `collect`, T=1, the condition's engine
against the exact fp32 trainer), and reports per (model, condition, seed): mean |delta|, mean K3, and the
per-sequence K3 (mean_t k3_t, the `tis_token+seq_rs` criterion) at the 70% quantile, i.e. the rejection
threshold that keeps ~70% of the sequences, plus the fraction kept at fixed thresholds.

    python bench/size_ladder_dose.py --out results/size_ladder/dose
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from timbench.engine import make_engine
from timbench.metrics.ratios import k3, seq_mean
from timbench.model import Compute
from timbench.model.checkpoint import load_checkpoint
from timbench.rl.rollout import collect
from timbench.spec.keys import parse_spec
from timbench.tasks import get_task
from timbench.trainer import sequence_logprobs
from timbench.util.shipped import default_checkpoint
from timbench.util.threads import set_threads

MODELS = ("tiny-dense", "small-dense", "medium-dense")
CONDITIONS = {
    "nvfp4-rollout": "weight_quant=nvfp4",
    "fp8-rollout": "weight_quant=fp8_block,act_quant=fp8_block",
    "noise-g0.1": "noise=gaussian:0.1",
    "noise-g0.3": "noise=gaussian:0.3",
    "noise-g0.5": "noise=gaussian:0.5",
    "noise-g0.55": "noise=gaussian:0.55",
    "noise-g0.6": "noise=gaussian:0.6",
    "noise-g0.65": "noise=gaussian:0.65",
    "noise-g0.7": "noise=gaussian:0.7",
    "noise-g0.75": "noise=gaussian:0.75",
}
THRESHOLDS = (0.003, 0.005, 0.01, 0.02)
PROMPTS, GROUP = 16, 8  # the grid's base: GRPO 16 prompts x 8 responses


def measure(model: str, engine_spec: str, seed: int, task_name: str = "add-4d-v1") -> dict:
    """The step-0 batch of a cell (task, model, condition, seed) and its engine-vs-trainer divergence."""
    net = load_checkpoint(default_checkpoint(task_name, model))
    task = get_task(task_name)
    engine = make_engine(net.config, parse_spec(engine_spec, "engine spec", side="engine"), weights=net)
    exp = collect(engine, task, task.train_batch(seed, 0, PROMPTS), GROUP, 0, seed, 1.0)
    compute = Compute.from_spec(parse_spec("kernels=exact,dtype=fp32", "trainer spec", side="trainer"))
    with torch.no_grad():
        out = sequence_logprobs(net, compute, exp.seqs, 1.0)
    width = exp.rollout_logprobs.shape[1]
    train = out.logprobs[:, :width].double()
    log_r = torch.where(exp.mask, train - exp.rollout_logprobs.double(), torch.zeros_like(train))
    seq_k3 = seq_mean(k3(log_r), exp.mask)
    return {
        "model": model,
        "engine": engine_spec,
        "seed": seed,
        "sequences": int(exp.mask.shape[0]),
        "tokens": int(exp.mask.sum()),
        "mean_abs_delta": float(log_r.abs()[exp.mask].mean()),
        "k3_mean": float(k3(log_r)[exp.mask].mean()),
        "seq_k3_q70": float(torch.quantile(seq_k3, 0.7)),
        "kept": {str(t): float((seq_k3 <= t).double().mean()) for t in THRESHOLDS},
    }


def _order(r: dict) -> tuple:
    m, c = r["model"], r["condition"]
    return (MODELS.index(m) if m in MODELS else len(MODELS), m, list(CONDITIONS).index(c), r["seed"])


def to_markdown(rows: list[dict]) -> str:
    head = "| model | condition | seeds | mean \\|delta\\| | K3 | seq K3 q70 | " + " | ".join(
        f"kept @{t}" for t in THRESHOLDS
    )
    lines = [
        "In-task dose of rollout conditions on the dense size ladder: each grid cell's step-0 batch (add-4d-v1, GRPO "
        f"{PROMPTS}x{GROUP}, T=1) against the exact fp32 trainer, mean over seeds. Regenerate: "
        "`python bench/size_ladder_dose.py --out results/size_ladder/dose`.",
        "",
        head + " |",
        "|---|---|---:|---:|---:|---:|" + "---:|" * len(THRESHOLDS),
    ]
    groups: dict[tuple, list] = {}
    for r in sorted(rows, key=_order):
        groups.setdefault((r["model"], r["condition"]), []).append(r)
    mean = lambda xs: sum(xs) / len(xs)
    for (m, c), rs in groups.items():
        kept = " | ".join(f"{mean([r['kept'][str(t)] for r in rs]):.2f}" for t in THRESHOLDS)
        lines.append(
            f"| {m} | {c} | {len(rs)} | {mean([r['mean_abs_delta'] for r in rs]):.4f} | "
            f"{mean([r['k3_mean'] for r in rs]):.4f} | {mean([r['seq_k3_q70'] for r in rs]):.4f} | {kept} |"
        )
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="directory for dose.json and dose.md (resumed row by row)")
    ap.add_argument("--models", default=",".join(MODELS), help="comma-separated dense presets")
    ap.add_argument("--conditions", default=",".join(CONDITIONS), help=f"comma-separated, of {', '.join(CONDITIONS)}")
    ap.add_argument("--seeds", default="0,1,2", help="comma-separated cell seeds")
    a = ap.parse_args(argv)
    bad = [c for c in a.conditions.split(",") if c not in CONDITIONS]
    if bad:
        print(f"size_ladder_dose: unknown condition {bad[0]!r}; valid: {', '.join(CONDITIONS)}", file=sys.stderr)
        return 2
    set_threads(1)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "dose.json"
    rows = json.loads(path.read_text()) if path.is_file() else []
    done = {(r["model"], r["condition"], r["seed"]) for r in rows}
    for m in a.models.split(","):
        for c in a.conditions.split(","):
            for s in map(int, a.seeds.split(",")):
                if (m, c, s) in done:
                    continue
                r = {"condition": c, **measure(m, CONDITIONS[c], s)}
                rows.append(r)
                rows.sort(key=_order)  # the file does not depend on which rows an earlier, resumed call ran
                path.write_text(json.dumps(rows, indent=1, sort_keys=True) + "\n")
                print(f"{m:13s} {c:14s} s{s} |delta|={r['mean_abs_delta']:.4f} q70={r['seq_k3_q70']:.4f}", flush=True)
    rows.sort(key=_order)
    path.write_text(json.dumps(rows, indent=1, sort_keys=True) + "\n")
    (out / "dose.md").write_text(to_markdown(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
