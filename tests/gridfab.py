"""Hand-built grid result directories in the layout `timbench grid run` writes (the reports' input format).

Fabricating the input is legitimate here: it is the contract between the grid runner and the
reports, and writing it by hand pins every value the tests then read back.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from timbench.util.manifest import stamp_run

CONDITIONS = {
    "baseline": {"kind": "reference", "engine": "kernels=exact,dtype=fp32", "trainer": "kernels=exact,dtype=fp32"},
    "bf16-engine": {"kind": "precision", "engine": "kernels=exact,dtype=bf16", "trainer": "kernels=exact,dtype=fp32"},
    "fp8-rollout": {
        "kind": "quant",
        "engine": "kernels=exact,weight_quant=fp8,act_quant=fp8",
        "trainer": "kernels=exact,dtype=fp32",
    },
    "noise-1": {"kind": "noise", "engine": "kernels=exact,noise=gaussian:1.0", "trainer": "kernels=exact"},
    "noise-3": {"kind": "noise", "engine": "kernels=exact,noise=gaussian:3.0", "trainer": "kernels=exact"},
    "moe-router-bf16": {
        "kind": "moe",
        "engine": "dtype=bf16,router_dtype=bf16",
        "trainer": "dtype=bf16,router_dtype=fp32",
    },
    "moe-router-noise": {"kind": "moe", "engine": "router_noise=0.05", "trainer": "kernels=exact"},
}
STEPS = 30
COLLAPSE_AT = 16  # the reward drops to 0 here; smoothed (width 5) crosses half its peak at step 18


def cell_id(cond, remedy, mode="recompute", seed=0, model="tiny-dense"):
    return f"add-4d-v1.{model}.{cond}.{remedy}.{mode}.grpo.s{seed}"


def metrics_rows(delta: float, collapse: bool, k3_scale: float = 1.0, hist: bool = False, nan_at=None, extra=None):
    rows = []
    for i in range(STEPS):
        if nan_at is not None and i >= nan_at:
            break
        reward = 0.0 if collapse and i >= COLLAPSE_AT else 0.4 + 0.01 * i
        row = {
            "step": i,
            "critic/rewards/mean": reward,
            "actor/grad_norm": 1.0 + 0.1 * (i % 3),
            "actor/loss": 0.01,
            "rollout_corr/k3_kl": 0.5 * delta**2 * k3_scale,
            "mismatch/mean_abs_delta": delta,
            "mismatch/p99_abs_delta": 4 * delta,
            "mismatch/max_abs_delta": 10 * delta,
            "training/rollout_probs_diff_max": 0.5 * delta,
            "drift/diff_mean": delta * 0.1,
            "drift/diff_abs_mean": delta * 0.2,
            "drift/diff_pos_adv_mean": delta * 0.3,
            "drift/diff_neg_adv_mean": -delta * 0.1,
            "rollout_corr/rollout_is_mean": 1.0 - delta,
            "rollout_corr/rollout_rs_masked_fraction": delta / 2,
        }
        if hist:
            row["mismatch/abs_delta_hist"] = [0] * 8 + [i, 3, 2, 0] if delta else [50] + [0] * 11
        rows.append({**row, **(extra or {})})
    return rows


def write_cell(
    root: Path,
    cond: str,
    remedy: str,
    *,
    final_acc: float,
    delta: float,
    collapse=False,
    status="done",
    mode="recompute",
    failed_nan_at=None,
    hist=False,
    steps_written=None,
    seed=0,
    model="tiny-dense",
    extra=None,
):
    """One cell's run dir; `extra` adds constant keys to every metrics row (e.g. mismatch/routing_agreement)."""
    cid = cell_id(cond, remedy, mode, seed, model)
    d = root / "runs" / cid
    d.mkdir(parents=True, exist_ok=True)
    rows = metrics_rows(delta, collapse, hist=hist, nan_at=failed_nan_at, extra=extra)
    if steps_written is not None:
        rows = rows[:steps_written]
    (d / "metrics.jsonl").write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))
    evals = [
        {"step": s, "accuracy_t1": 0.37 + (final_acc - 0.37) * s / STEPS, "accuracy_greedy": 0.6}
        for s in range(0, len(rows) + 1, 10)
    ]
    if evals[-1]["step"] != len(rows) and status == "done":
        evals.append({"step": len(rows), "accuracy_t1": final_acc, "accuracy_greedy": 0.6})
    evals[-1]["accuracy_t1"] = final_acc
    (d / "eval.jsonl").write_text("".join(json.dumps(e) + "\n" for e in evals))
    error = None
    if failed_nan_at is not None:
        error = (
            f"step {failed_nan_at}: non-finite loss=nan or grad_norm=nan (lane main); metrics up to step "
            f"{failed_nan_at - 1} are kept"
        )
    if status in ("done", "failed"):
        summary = {
            "status": "finished" if status == "done" else "failed",
            "error": error,
            "steps_done": len(rows),
            "task": "add-4d-v1",
            "task_version": 1,
            "final_accuracy_t1": final_acc,
        }
        (d / "summary.json").write_text(json.dumps(summary))
    if status in ("done", "failed"):
        stamp_run(d)  # the run's integrity manifest, written last as timbench.rl.loop does
    if status != "pending":
        (d / "cell.json").write_text(json.dumps({"status": status, "error": error, "wall_s": 1.5, "attempts": 1}))
    return cid


def cell_decl(cond, remedy, mode="recompute", seed=0, eval_n=None, model="tiny-dense"):
    c = CONDITIONS[cond]
    ref = None if c["kind"] == "reference" else cell_id("baseline", "none", mode, seed, model)
    config = {"task": "add-4d-v1", "remedy": remedy, "mode": mode, "steps": STEPS, "seed": seed}
    if eval_n is not None:
        config["eval_n"] = eval_n
    return {
        "id": cell_id(cond, remedy, mode, seed, model),
        "axes": {
            "task": "add-4d-v1",
            "model": model,
            "condition": cond,
            "remedy": remedy,
            "mode": mode,
            "algorithm": "grpo",
            "seed": seed,
        },
        "condition": {"name": cond, "doc": f"{cond} condition", **c},
        "reference": ref,
        "config": config,
    }


def write_cells_json(root: Path, decls: list[dict], name="fab", collapse=None):
    root.mkdir(parents=True, exist_ok=True)
    (root / "cells.json").write_text(
        json.dumps(
            {"grid": name, "reference_condition": "baseline", "collapse": collapse or {}, "cells": decls}, indent=1
        )
    )


def standard_grid(root: Path, hist: bool = False) -> Path:
    """baseline + bf16 + two noise levels x remedies none / tis_token, recompute; plus a failed and a pending cell.

    none collapses at noise sigma 3 (reward drop) and fails non-finite on bf16 under bypass;
    tis_token never collapses. A pending cell (mis_seq, noise-3) has no run directory.
    """
    spec = [  # cond, remedy, final acc, mean |delta|, collapse
        ("baseline", "none", 0.80, 0.0, False),
        ("bf16-engine", "none", 0.76, 2e-3, False),
        ("noise-1", "none", 0.72, 0.11, False),
        ("noise-3", "none", 0.60, 0.9, True),
        ("bf16-engine", "tis_token", 0.78, 2e-3, False),
        ("noise-1", "tis_token", 0.74, 0.11, False),
        ("noise-3", "tis_token", 0.64, 0.9, False),
    ]
    decls = []
    for cond, remedy, acc, delta, collapse in spec:
        write_cell(root, cond, remedy, final_acc=acc, delta=delta, collapse=collapse, hist=hist)
        decls.append(cell_decl(cond, remedy))
    write_cell(root, "baseline", "none", mode="bypass", final_acc=0.80, delta=0.0)
    decls.append(cell_decl("baseline", "none", "bypass"))
    write_cell(root, "bf16-engine", "none", mode="bypass", final_acc=0.5, delta=2e-3, status="failed", failed_nan_at=12)
    decls.append(cell_decl("bf16-engine", "none", "bypass"))
    decls.append(cell_decl("noise-3", "mis_seq"))  # pending: never started
    write_cells_json(root, decls)
    return root


def seeded_grid(root: Path, cells: dict[tuple, list[tuple]], eval_n: int = 512) -> Path:
    """A grid of recompute cells with several seeds: {(cond, remedy): [(final_acc, delta, collapse), ...]}.

    Entry i of each list is seed i; every mismatched cell's reference is the baseline cell of its seed.
    """
    decls = []
    for (cond, remedy), per_seed in cells.items():
        for seed, (acc, delta, collapse) in enumerate(per_seed):
            write_cell(root, cond, remedy, final_acc=acc, delta=delta, collapse=collapse, seed=seed)
            decls.append(cell_decl(cond, remedy, seed=seed, eval_n=eval_n))
    write_cells_json(root, decls)
    return root


def group_id(cond, remedy, mode="recompute"):
    """The seed group of cell_id(cond, remedy, mode, seed): the cell id without its seed."""
    return cell_id(cond, remedy, mode).rsplit(".", 1)[0]


def read_csv(path: Path) -> list[dict]:
    import csv

    with open(path) as f:
        return list(csv.DictReader(f))


def isclose(a: str, b: float) -> bool:
    return math.isclose(float(a), b, rel_tol=1e-12)
