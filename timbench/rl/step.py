"""One RL step on one lane: named phases over one `StepBatch`.

    collect    engine rollouts of B prompts x G responses, rewards, advantages, the loss mask
    recompute  the trainer's no-grad logprobs pi_old (and MoE routing) of the sampled tokens
    correct    the remedy's per-token weights and keep-mask from rho = pi_old / mu
    update     the trainer's policy update (`timbench.trainer.update_policy`), then weight sync
    metrics    one row of step metrics from the filled batch

A `Lane` is one RL system (policy, optimizer, engine, trainer compute); `timbench.rl.loop` runs one lane,
or two when the run names a zero-mismatch twin. Only the phases touch tensors; the loop logs and saves.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field

import torch

from ..engine import make_engine
from ..kernels.reduce import fmean, fstd, fsum, masked_mean
from ..metrics.direction import direction_metrics
from ..metrics.dist import distribution_metrics
from ..metrics.mismatch import abs_delta_histogram, mismatch_metrics, routing_agreement
from ..metrics.ratios import log_ratio, select
from ..metrics.schema import ABS_DELTA_HIST, REWARD_MEAN
from ..model import Compute, Qwen3ForCausalLM
from ..quant.aligned import RolloutCodes
from ..remedies import Remedy, RemedyBatch, RemedyResult, check_bool_mask, check_result, per_sequence, replay_tensor
from ..remedies.deadline import PLUGIN_CALL_TIMEOUT_S, call_hook
from ..replica import Replica, replica_metrics
from ..spec.keys import Spec
from ..trainer import MiniBatch, NonFiniteError, sequence_logprobs, update_policy
from ..trainer.forward import TrainerOutput
from ..trainer.optim import AdamW
from .algorithms import agg_loss, dynamic_sampling_mask, kl_penalty
from .config import Loaded, RunConfig
from .drift import objective_drift
from .rollout import Experience, collect
from .staleness import PolicyHistory, split_metrics


@dataclass
class Lane:
    name: str
    model: Qwen3ForCausalLM
    opt: torch.optim.Optimizer
    ref: Qwen3ForCausalLM | None
    """The frozen warm start, for a KL penalty (None when kl_coef is 0)."""
    engine: object
    """A rollout engine (`timbench.engine.make_engine`)."""
    compute: Compute
    """The trainer's arithmetic."""
    remedy: Remedy
    history: PolicyHistory | None = None
    """staleness=K > 0: the last K+1 policy versions; the engine samples with the oldest."""
    behavior: Qwen3ForCausalLM | None = None
    """staleness=K > 0: a trainer-side copy of the behavior policy (the weights that sampled)."""
    plugin_timeout: float = PLUGIN_CALL_TIMEOUT_S
    """Seconds one call of a plug-in remedy's hook may take (timbench.remedies.deadline; 0 = no limit)."""
    replica: Replica | None = None
    """A second, scoring-only trainer pass of each batch (timbench.replica; None: off)."""


def make_lane(
    name: str,
    base: Qwen3ForCausalLM,
    cfg: RunConfig,
    engine_spec: Spec,
    trainer_spec: Spec,
    max_seqs: int,
    remedy: Remedy,
    plugin_timeout: float = PLUGIN_CALL_TIMEOUT_S,
) -> Lane:
    model = Qwen3ForCausalLM(base.config)
    model.load_state_dict(base.state_dict())
    opt = AdamW(model.parameters(), lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay)
    engine = make_engine(base.config, engine_spec, max_num_seqs=max_seqs, weights=model)
    ref = base.eval().requires_grad_(False) if cfg.kl_coef > 0 else None  # the frozen warm start
    lane = Lane(name, model, opt, ref, engine, Compute.from_spec(trainer_spec), remedy, plugin_timeout=plugin_timeout)
    if engine_spec.staleness:
        lane.history = PolicyHistory(engine_spec.staleness, model)
        lane.behavior = Qwen3ForCausalLM(base.config)
    return lane


def sync_engine(lane: Lane) -> None:
    """The trainer -> engine weight sync after an update: the new policy, or with staleness the K-old one."""
    if lane.history is None:
        lane.engine.load_weights(lane.model)
        return
    lane.history.push(lane.model)
    lane.engine.load_weights(lane.history.behavior)


@dataclass
class StepBatch:
    """One lane's step, filled phase by phase (each field names the phase that sets it)."""

    step: int
    exp: Experience
    """collect: sequences, rewards, engine logprobs mu (`exp.rollout_logprobs`), response mask, routing."""
    advantages: torch.Tensor
    """collect: [N] per-sequence advantages."""
    mask: torch.Tensor
    """collect: [N, R] tokens in the loss (response & dynamic sampling); correct: & the remedy's keep-mask."""
    mini_batch: int
    """Rows per optimizer step (N / mini_batches); also the recompute's chunk size."""
    old_logprobs: torch.Tensor | None = None
    """recompute: [N, R] the trainer's pi_old of the sampled tokens."""
    entropy: torch.Tensor | None = None
    """recompute: [N, R] entropy of the trainer's tempered distribution."""
    trainer_routing: list | None = None
    """recompute: per-sequence MoE routing of the trainer (None: dense)."""
    trainer_dist: torch.Tensor | None = None
    """recompute: [N, R, V] the trainer's full tempered log-distribution (None: the engine gave none to compare)."""
    weights: torch.Tensor | None = None
    """correct: [N, R] the remedy's per-token loss weights (None: all 1)."""
    remedy_metrics: dict = field(default_factory=dict)
    """correct: what the remedy logs."""
    staleness_metrics: dict = field(default_factory=dict)
    """recompute (staleness > 0): the ratio's mismatch and staleness factors."""
    replica_logprobs: torch.Tensor | None = None
    """recompute (replica on): [N, R] pi_old again from the replica pass (same weights, its own chunking)."""
    replica_metrics: dict = field(default_factory=dict)
    """correct (replica on): the replica pass's noise floor and the remedy's selection overlap."""
    first_forward: TrainerOutput | None = None
    """recompute: the policy's forward of the first mini-batch with its autograd graph, which the update's first
    optimizer step reuses (the same rows, weights and kernels: the same bits); update: consumed (None)."""
    updates: list[dict] = field(default_factory=list)
    """update: one metrics row per optimizer step."""
    timing: dict = field(default_factory=dict)
    """Wall seconds of each phase (timing.jsonl, never metrics.jsonl)."""


# ---- phases -------------------------------------------------------------------------------------


def collect_phase(lane: Lane, run: Loaded, step: int) -> StepBatch:
    cfg, task = run.config, run.task_impl
    exp = collect(
        lane.engine,
        task,
        task.train_batch(cfg.seed, step, cfg.prompts_per_step),
        cfg.group_size,
        step,
        cfg.seed,
        cfg.temperature,
    )
    adv = run.algo.advantage(exp.rewards, cfg.group_size)
    mask = exp.mask
    if run.algo.dynamic_sampling:
        mask = mask & dynamic_sampling_mask(exp.rewards, cfg.group_size)[:, None]
    n = cfg.prompts_per_step * cfg.group_size
    return StepBatch(step, exp, adv, mask, n // cfg.mini_batches)


def _trainer_pass(
    model: Qwen3ForCausalLM,
    lane: Lane,
    run: Loaded,
    batch: StepBatch,
    chunk: int | None = None,
    keep_first: bool = False,
):
    """Chunked no-grad trainer forward of the batch: (logprobs [N, R], entropy, per-sequence routing, the full
    distribution [N, R, V] over the whole vocabulary, as the engine's `rollout_dist`, or None when that is None);
    `chunk` rows per forward call (default the mini-batch). `keep_first`: the first chunk runs with autograd on
    and its forward goes to `batch.first_forward` (same values: the update backpropagates through it)."""
    exp, chunk = batch.exp, chunk or batch.mini_batch
    replay = exp.routing if lane.remedy.replay == "engine" else None
    support = _support(lane, exp)
    full = exp.rollout_dist is not None
    lps, ents, routes, dists = [], [], [], []
    for i in range(0, len(exp.seqs), chunk):
        rp = replay_tensor(exp.seqs[i : i + chunk], None if replay is None else replay[i : i + chunk])
        graph = keep_first and i == 0
        with torch.set_grad_enabled(graph):
            out = sequence_logprobs(
                model,
                lane.compute,
                exp.seqs[i : i + chunk],
                run.temperature,
                replay=rp,
                support=None if support is None else support[i : i + chunk],
                full_dist=full,
            )
        if graph:
            batch.first_forward = out
            out = dataclasses.replace(out, logprobs=out.logprobs.detach())
        lps.append(out.logprobs)
        ents.append(out.entropy)
        routes.append(out.routing)
        dists.append(out.dist)
    width = max(x.shape[1] for x in lps)
    # chunks differ in response width (dim 1); a distribution chunk [b, r, V] pads dim 1 too, never V
    pad = lambda xs: torch.cat(
        [torch.nn.functional.pad(x, (0, 0) * (x.dim() - 2) + (0, width - x.shape[1])) for x in xs]
    )
    lengths = [len(p) + len(r) for p, r in exp.seqs]
    return (
        pad(lps)[:, : batch.mask.shape[1]],
        pad(ents),
        per_sequence(routes, lengths, chunk),
        pad(dists)[:, : batch.mask.shape[1]] if full else None,
    )


def _support(lane: Lane, exp: Experience) -> torch.Tensor | None:
    """The engine's sampling support [N, R, V] when the remedy replays it (sampling replay), else None."""
    return exp.support if lane.remedy.sampling_replay else None


def rollout_codes(lane: Lane) -> RolloutCodes | None:
    """The codewords of the weights this step's rollout sampled with, when the remedy aligns rounding to them:
    the trainer's own weights (synchronous: the engine got them at the last sync) or the stale behavior ones."""
    if not lane.remedy.rollout_rounding or lane.compute.weight_quant == "none":
        return None
    weights = lane.model.state_dict() if lane.history is None else lane.history.behavior
    return RolloutCodes(
        lane.model,
        weights,
        lane.compute.weight_quant,
        lane.compute.dtype,
        getattr(lane.remedy.params, "outside", "clamp"),
    )


def recompute_phase(lane: Lane, run: Loaded, batch: StepBatch) -> None:
    """The trainer's pi_old; R3 replays the engine's routing here already. With a stale engine the trainer
    scores the batch under both its current and the behavior weights and keeps the one `stale_old` names."""
    lane.compute.rollout_codes = rollout_codes(lane)  # before any trainer pass of this step
    # The update's first mini-batch is this pass's first chunk on the same weights, unless the update replays
    # the routing this pass chooses (R2: its forward then differs from this one).
    keep = lane.remedy.replay != "old"
    current, model = _trainer_pass(lane.model, lane, run, batch, keep_first=keep), lane.model
    if lane.history is not None:
        lane.behavior.load_state_dict(lane.history.behavior)
        behavior = _trainer_pass(lane.behavior, lane, run, batch)
        batch.staleness_metrics = split_metrics(
            current[0], behavior[0], batch.exp.rollout_logprobs, batch.exp.mask, lane.history.lag
        )
        if lane.compute.stale_old == "behavior":
            current, model = behavior, lane.behavior
    batch.old_logprobs, batch.entropy, batch.trainer_routing, batch.trainer_dist = current
    if lane.replica is not None:  # the same weights as pi_old's pass, re-fed in the replica's chunks
        chunk = lane.replica.chunk(batch.mini_batch, len(batch.exp.seqs))
        batch.replica_logprobs = _trainer_pass(model, lane, run, batch, chunk)[0]


def _remedy(lane: Lane, run: Loaded, batch: StepBatch, old_logprobs: torch.Tensor) -> RemedyResult:
    """The lane's remedy on (old_logprobs, mu) and the batch's loss mask before it, checked."""
    rb = RemedyBatch(old_logprobs.detach(), batch.exp.rollout_logprobs, batch.advantages, batch.mask, run.group_size)
    return check_result(call_hook(lane.remedy, "__call__", rb, limit_s=lane.plugin_timeout), rb, lane.remedy.name)


def correct_phase(lane: Lane, run: Loaded, batch: StepBatch) -> None:
    result = _remedy(lane, run, batch, batch.old_logprobs)
    if batch.replica_logprobs is not None:  # the same remedy on the replica's pi_old: does it pick the same tokens?
        twin = _remedy(lane, run, batch, batch.replica_logprobs)
        batch.replica_metrics = replica_metrics(
            batch.old_logprobs,
            batch.replica_logprobs,
            batch.exp.mask,
            batch.mask,
            result.mask,
            twin.mask,
            result.weights,
            twin.weights,
        )
    batch.mask, batch.weights, batch.remedy_metrics = batch.mask & result.mask, result.weights, result.metrics


def update_phase(lane: Lane, run: Loaded, batch: StepBatch) -> None:
    """The policy update on this batch; pi_old is the recompute's (recompute mode) or mu (bypass)."""
    cfg, algo, exp = run.config, run.algo, batch.exp
    adv, mask, weights, old_logprobs = batch.advantages, batch.mask, batch.weights, batch.old_logprobs
    old = old_logprobs if cfg.mode == "recompute" else exp.rollout_logprobs
    loss_kw = algo.loss_kwargs | {
        k: v
        for k, v in (("eps_low", cfg.eps_low), ("eps_high", cfg.eps_high), ("clip_ratio_c", cfg.clip_ratio_c))
        if v is not None
    }
    # Routing the update passes replay: R3 the engine's, R2 the trainer's own from the recompute.
    replay = {"engine": exp.routing, "old": batch.trainer_routing}.get(lane.remedy.replay)
    n, mb = len(exp.seqs), batch.mini_batch
    support = _support(lane, exp)
    minis = [
        MiniBatch(
            slice(i, i + mb),
            exp.seqs[i : i + mb],
            replay_tensor(exp.seqs[i : i + mb], None if replay is None else replay[i : i + mb]),
            None if support is None else support[i : i + mb],
        )
        for i in range(0, n, mb)
    ]

    def objective(out, sl):
        w = out.logprobs.shape[1]
        msk, extra = mask[sl, :w], {}
        # A remedy may also reject inside the update, on the PPO ratio of this pass (Remedy.update_keep).
        keep = call_hook(
            lane.remedy,
            "update_keep",
            select(log_ratio(out.logprobs.detach(), old[sl, :w]), msk),
            msk,
            limit_s=lane.plugin_timeout,
        )
        if keep is not None:
            check_bool_mask(keep, msk.shape, f"remedy {lane.remedy.name}: update_keep must return None or")
            rows = msk.any(-1)
            dropped = rows & ~(msk & keep).any(-1)
            msk = msk & keep
            extra = {"actor/ppo_rs_seq_masked_fraction": float(fsum(dropped.double()) / max(1, int(rows.sum())))}
        loss, m = algo.loss(
            out.logprobs, old[sl, :w], adv[sl], msk, weights=None if weights is None else weights[sl, :w], **loss_kw
        )
        m = m | extra
        if lane.ref is not None:
            with torch.no_grad():
                ref_lp = sequence_logprobs(lane.ref, lane.compute, exp.seqs[sl], cfg.temperature).logprobs
            kl = agg_loss(kl_penalty(out.logprobs, ref_lp, cfg.kl_kind), msk, algo.agg)
            loss = loss + cfg.kl_coef * kl
            m = m | {"actor/kl_loss": float(kl.detach())}
        drift = objective_drift(out.logprobs.detach(), old_logprobs[sl, :w], exp.rollout_logprobs[sl, :w], adv[sl], msk)
        return loss, m | drift

    try:
        batch.updates = update_policy(
            lane.model,
            lane.opt,
            lane.compute,
            minis,
            objective,
            epochs=cfg.epochs,
            grad_clip=cfg.grad_clip,
            temperature=cfg.temperature,
            first_forward=batch.first_forward,
        )
    except NonFiniteError as e:
        raise NonFiniteError(
            f"step {batch.step}: {e} (lane {lane.name}); metrics up to step {batch.step - 1} are kept"
        ) from None
    finally:
        batch.first_forward = None  # its graph holds the mini-batch's activations


def metrics_phase(lane: Lane, batch: StepBatch) -> dict:
    # Every float reduction here is fixed-order (kernels.reduce): torch's sum order varies by CPU.
    exp, mask, old_logprobs = batch.exp, batch.mask, batch.old_logprobs
    lens = fsum(exp.mask, 1)
    metrics = {
        REWARD_MEAN: float(fmean(exp.rewards)),
        "critic/rewards/std": float(fstd(exp.rewards.double())),
        "response_length/mean": float(fmean(lens)),
        "response_length/max": float(lens.max()),
        "actor/entropy": float(masked_mean(batch.entropy[:, : mask.shape[1]], exp.mask)),
        "batch/kept_frac": float(fmean(mask.any(1).float())),
        **_mean(batch.updates),
        **{k: v for k, v in mismatch_metrics(old_logprobs, exp.rollout_logprobs, exp.mask).items() if k != "tokens"},
        # counts in metrics.ABS_DELTA_BINS: the report's |delta| histograms sum these over steps
        ABS_DELTA_HIST: abs_delta_histogram(old_logprobs, exp.rollout_logprobs, exp.mask),
        **direction_metrics(old_logprobs, exp.rollout_logprobs, batch.advantages, exp.mask),
    }
    if batch.trainer_dist is not None:  # full distributions on both sides (timbench engine; vLLM gives top-K only)
        metrics.update(distribution_metrics(batch.trainer_dist, exp.rollout_dist, exp.mask))
    clash = sorted(metrics.keys() & batch.remedy_metrics.keys())
    if clash:
        raise ValueError(f"remedy {lane.remedy.name}: metric name(s) {clash} clash with the loop's metrics")
    metrics.update(batch.remedy_metrics)
    metrics.update(batch.staleness_metrics)
    metrics.update(batch.replica_metrics)
    if exp.routing[0] is not None:
        metrics["mismatch/routing_agreement"] = routing_agreement(
            torch.cat(batch.trainer_routing), torch.cat(exp.routing)
        )
    return metrics


def _mean(rows: list[dict]) -> dict:
    keys = rows[0].keys()
    return {k: sum(float(r[k]) for r in rows) / len(rows) for k in keys}


def train_step(lane: Lane, run: Loaded, step: int) -> tuple[dict, StepBatch]:
    """One RL step on one lane: the phases in order; returns (metrics, the filled batch)."""
    t0 = time.perf_counter()
    batch = collect_phase(lane, run, step)
    t1 = time.perf_counter()
    recompute_phase(lane, run, batch)
    correct_phase(lane, run, batch)
    t2 = time.perf_counter()
    update_phase(lane, run, batch)
    t3 = time.perf_counter()
    sync_engine(lane)  # weight sync: the next step samples from the updated (or, stale, a K-old) policy
    t4 = time.perf_counter()
    batch.timing = {"time/rollout": t1 - t0, "time/recompute": t2 - t1, "time/update": t3 - t2, "time/sync": t4 - t3}
    return metrics_phase(lane, batch), batch
