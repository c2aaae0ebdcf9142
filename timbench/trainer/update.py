"""The policy update: epochs over mini-batches of forward, loss, backward, clip and optimizer step.

The caller says what to minimise (`objective`, a function of one mini-batch's
forward output) and which rows form each mini-batch; this loop owns the order
of the optimizer's work, so every RL algorithm updates the same way. The loss
and grad norm are checked after every backward: a non-finite value stops the
run before the optimizer applies it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from ..metrics.schema import GRAD_NORM
from ..model import Compute, Qwen3ForCausalLM
from .forward import TrainerOutput, sequence_logprobs
from .optim import clip_grad_norm


class NonFiniteError(RuntimeError):
    """Loss or gradient became NaN/inf."""


@dataclass(frozen=True)
class MiniBatch:
    rows: slice
    """Rows of the step batch (contiguous, in batch order)."""
    seqs: Sequence[tuple[Sequence[int], Sequence[int]]]
    """(prompt_ids, response_ids) of those rows."""
    replay: torch.Tensor | None = None
    """MoE experts to replay in the forward (`timbench.remedies.replay_tensor`), or None."""
    support: torch.Tensor | None = None
    """[n, R, V] bool sampling support to renormalise the logprobs over (sampling replay), or None."""


Objective = Callable[[TrainerOutput, slice], tuple[torch.Tensor, dict]]
"""(forward output of a mini-batch, its rows) -> (scalar loss, metrics of that mini-batch)."""


def update_policy(
    model: Qwen3ForCausalLM,
    opt: torch.optim.Optimizer,
    compute: Compute,
    mini_batches: Sequence[MiniBatch],
    objective: Objective,
    *,
    epochs: int,
    grad_clip: float,
    temperature: float,
    first_forward: TrainerOutput | None = None,
) -> list[dict]:
    """`epochs` passes over `mini_batches`, one optimizer step each; returns one metrics row per step.

    Each row holds actor/loss, actor/grad_norm (before clipping) and the objective's metrics.
    Raises NonFiniteError (nothing applied) when the loss or the grad norm is NaN/inf.
    `first_forward`: the first mini-batch's forward on the current weights, already run with autograd on (the
    recompute's first chunk): the first optimizer step backpropagates through it instead of running it again.
    The exact kernels give the same bits with or without autograd, so only the time changes.
    """
    params = list(model.parameters())
    rows = []
    for _ in range(epochs):
        for mb in mini_batches:
            if first_forward is not None:  # the weights have not moved since it ran: no step has been taken yet
                out, first_forward = first_forward, None
            else:
                out = sequence_logprobs(model, compute, mb.seqs, temperature, replay=mb.replay, support=mb.support)
            loss, metrics = objective(out, mb.rows)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            gn = float(clip_grad_norm(params, grad_clip))
            if not (math.isfinite(float(loss.detach())) and math.isfinite(gn)):
                raise NonFiniteError(f"non-finite loss={float(loss.detach())} or grad_norm={gn}")
            opt.step()
            rows.append({"actor/loss": float(loss.detach()), GRAD_NORM: gn, **metrics})
    return rows
