"""Routing replay: per-sequence MoE routing -> the replay tensor one trainer forward takes.

The engine records the experts it chose at every position it processed: a (prompt, response) pair
of lengths P and R gives [P + R - 1, layers, k] (the last response token is sampled but never fed
back). The trainer forward packs sequences right-padded to width T and needs a choice at every
position, so the missing ones are filled with experts 0..k-1. That fill is never observable: the
last real position's logits would score a token after the response, and padded positions come after
every real one, so under causal attention neither reaches a scored logprob.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def per_sequence(chunks: list[torch.Tensor | None], lengths: Sequence[int], chunk: int) -> list | None:
    """Split chunked trainer routing [B, T, layers, k] (chunks of `chunk` rows) into per-sequence
    [length - 1, layers, k] tensors, the engine's layout; None for a dense model."""
    if not chunks or chunks[0] is None:
        return None
    return [chunks[i // chunk][i % chunk, : n - 1] for i, n in enumerate(lengths)]


def replay_tensor(seqs: Sequence[tuple[Sequence[int], Sequence[int]]], routes: Sequence | None) -> torch.Tensor | None:
    """Replay experts for `seqs` packed as the trainer packs them, flattened to [B * T, layers, k].

    `routes[i]` is sequence i's routing [len(prompt) + len(response) - 1, layers, k] (or None: dense,
    nothing to replay). Flattened because the model hands `replay[..., layer, :]` straight to the
    router, whose token rows are flat [B * T]; a flat tensor is also what a reshape there would give.
    """
    if routes is None or len(routes) == 0 or routes[0] is None:
        return None
    if len(routes) != len(seqs):
        raise ValueError(f"routing replay: {len(routes)} routings for {len(seqs)} sequences")
    width = max(len(p) + len(r) for p, r in seqs)
    layers, k = routes[0].shape[1:]
    out = torch.arange(k, dtype=torch.long).expand(len(seqs), width, layers, k).clone()
    for i, ((p, r), route) in enumerate(zip(seqs, routes)):
        n = len(p) + len(r) - 1
        if route.shape[0] < n or tuple(route.shape[1:]) != (layers, k):
            raise ValueError(
                f"routing replay: sequence {i} has routing {tuple(route.shape)}, needs [{n}, {layers}, {k}]"
            )
        out[i, :n] = route[:n]
    return out.reshape(len(seqs) * width, layers, k)
