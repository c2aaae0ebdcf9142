"""Structure-preserving expert pruning: a smaller Qwen3-MoE proxy that keeps each layer's most used experts.

After the MoE proxy models of arXiv 2608.10823, which select experts by activation
frequency *plus* multi-view consistency. Multi-view consistency would add a check
that the kept set is not an artefact of one measurement: that it agrees across
several views (other importance measures, other calibration slices) before it is
trusted (our reading of the term; the paper's exact procedure is not reproduced).
Only the first view is used here: per layer, how often the router selects each
expert (top-k selections, both ranks counted) over a calibration set of the task's
own problems. Nothing below measures or claims consistency across views.

The pruned model is the same architecture with `keep` experts per layer: the kept
experts (ascending original index, so the router's tie order is unchanged), the
router's rows sliced to them, top-k = min(k, keep), every other tensor copied bit
for bit. With keep = all experts the model is the original, bitwise.
"""

from __future__ import annotations

import dataclasses
import re

import torch

from ..model.config import ModelConfig
from ..model.qwen3 import Compute, Qwen3ForCausalLM
from ..spec.keys import parse_spec
from ..trainer.forward import pack
from .run import sft_batch

CALIBRATION_SPEC = "kernels=exact,dtype=fp32"
"""The forward that counts routes: the exact kernels, so the counts are the same on every machine."""
CALIBRATION_N = 512
"""Problems in the default calibration set."""
CALIBRATION_SEED = 0
"""Seed of the default calibration set (`task.train_batch(seed, 0, n)`: step 0, which no warm start trains on)."""

_EXPERT_KEY = re.compile(r"^model\.layers\.(\d+)\.mlp\.experts\.(\d+)\.(.+)$")
_ROUTER_KEY = re.compile(r"^model\.layers\.(\d+)\.mlp\.gate\.weight$")


def calibration_set(task, n: int = CALIBRATION_N, seed: int = CALIBRATION_SEED, batch: int = 128) -> list[list]:
    """Batches of (prompt ids, solution + EOS ids): `task.train_batch(seed, 0, n)`, in chunks of `batch`.

    Prompt and reference solution are what the warm start imitated, so the routes counted are the
    ones the policy takes on the task's own text.
    """
    if n < 1:
        raise ValueError(f"calibration set size must be >= 1, got {n}")
    seqs = sft_batch(task.train_batch(seed, 0, n))
    return [seqs[i : i + batch] for i in range(0, len(seqs), batch)]


def _check_moe(cfg: ModelConfig) -> None:
    if not cfg.is_moe:
        raise ValueError(f"expert pruning needs a qwen3_moe model; this one is {cfg.model_type!r} (dense, no experts)")


def expert_frequencies(model: Qwen3ForCausalLM, batches, compute: Compute | None = None) -> torch.Tensor:
    """Top-k selections per (layer, expert) over every non-padding token of `batches`: int64 [layers, experts].

    `batches` is an iterable of lists of (prompt ids, response ids); `compute` defaults to
    `CALIBRATION_SPEC`. Counts are integers, so their sum has no order to vary.
    """
    cfg = model.config
    _check_moe(cfg)
    c = compute or Compute.from_spec(parse_spec(CALIBRATION_SPEC, "calibration spec", side="trainer"))
    counts = torch.zeros(cfg.num_hidden_layers, cfg.num_experts, dtype=torch.int64)
    with torch.no_grad():
        for seqs in batches:
            ids, p_len, r_len = pack(seqs, cfg.pad_token_id)
            _, routing = model(ids, c)  # [B, T, layers, k]
            valid = torch.arange(ids.shape[1])[None, :] < (p_len + r_len)[:, None]
            for layer in range(cfg.num_hidden_layers):
                counts[layer] += torch.bincount(routing[..., layer, :][valid].reshape(-1), minlength=cfg.num_experts)
    return counts


def kept_experts(frequencies: torch.Tensor, keep: int) -> list[list[int]]:
    """Per layer, the `keep` most frequent experts (ties to the lower index), in ascending index order."""
    kept = []
    for row in frequencies.tolist():
        ranked = sorted(range(len(row)), key=lambda e: (-row[e], e))
        kept.append(sorted(ranked[:keep]))
    return kept


def check_keep(cfg: ModelConfig, keep) -> int:
    """`keep` as an int if 1 <= keep <= num_experts of an MoE config, else a one-line ValueError."""
    _check_moe(cfg)
    if isinstance(keep, bool) or not isinstance(keep, int) or not 1 <= keep <= cfg.num_experts:
        raise ValueError(f"keep={keep!r} is not valid; expected an integer from 1 to num_experts={cfg.num_experts}")
    return keep


def prune_experts(model: Qwen3ForCausalLM, keep: int, frequencies: torch.Tensor) -> Qwen3ForCausalLM:
    """A new model with only the `keep` most frequent experts per layer (see the module docstring).

    `frequencies` is `expert_frequencies`' [layers, experts] table (or any of that shape).
    """
    cfg = model.config
    keep = check_keep(cfg, keep)
    if tuple(frequencies.shape) != (cfg.num_hidden_layers, cfg.num_experts):
        raise ValueError(
            f"frequencies have shape {tuple(frequencies.shape)}; this model needs "
            f"({cfg.num_hidden_layers}, {cfg.num_experts}) (layers, experts)"
        )
    kept = kept_experts(frequencies, keep)
    new_cfg = dataclasses.replace(cfg, num_experts=keep, num_experts_per_tok=min(cfg.num_experts_per_tok, keep))
    pruned = Qwen3ForCausalLM(new_cfg)
    old = model.state_dict()
    with torch.no_grad():
        for key, dst in pruned.state_dict().items():
            dst.copy_(_source_tensor(key, old, kept))
    return pruned


def _source_tensor(key: str, old: dict, kept: list[list[int]]) -> torch.Tensor:
    """The original tensor behind the pruned model's `key`: an expert renumbered, a router's kept rows, or as is."""
    m = _EXPERT_KEY.match(key)
    if m:
        layer, j, rest = int(m[1]), int(m[2]), m[3]
        return old[f"model.layers.{layer}.mlp.experts.{kept[layer][j]}.{rest}"]
    m = _ROUTER_KEY.match(key)
    if m:
        return old[key][kept[int(m[1])]]
    return old[key]
