"""The RL training loop: rollout -> score -> advantages -> trainer logprobs -> updates -> weight sync.

A `Lane` is one RL system (policy, optimizer, engine, trainer spec). A run has
one lane, or two when it names a zero-mismatch twin: both see the same
problems and the same sampling noise, so the twin isolates what the mismatch
alone changed. Everything logged to metrics.jsonl is a deterministic function
of (config, seed); wall times go to timing.jsonl.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch

from ..engine import Engine, make_engine
from ..evaluate import evaluate_both
from ..metrics import abs_delta_histogram, mismatch_metrics, routing_agreement
from ..model import Compute, Qwen3ForCausalLM, load_checkpoint
from ..remedies import Remedy, RemedyBatch, check_result, load_remedy, per_sequence, replay_tensor
from ..spec import parse_spec
from ..tasks import get_task
from ..trainer import sequence_logprobs
from ..trainer.optim import AdamW, clip_grad_norm
from .algorithms import agg_loss, dynamic_sampling_mask, get_algorithm, kl_penalty
from .config import RunConfig
from .drift import objective_drift
from .rollout import Experience, collect
from .rundir import RunDir

ZERO_MISMATCH = {"kernels": "exact", "dtype": "fp32"}


class NonFiniteError(RuntimeError):
    """Loss or gradient became NaN/inf."""


@dataclass
class Lane:
    name: str
    model: Qwen3ForCausalLM
    opt: torch.optim.Optimizer
    ref: Qwen3ForCausalLM | None
    engine: Engine
    compute: Compute
    remedy: Remedy


def _lane(name, base: Qwen3ForCausalLM, cfg: RunConfig, engine_spec, trainer_spec, max_seqs, remedy) -> Lane:
    model = Qwen3ForCausalLM(base.config)
    model.load_state_dict(base.state_dict())
    opt = AdamW(model.parameters(), lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay)
    es = parse_spec(engine_spec, "engine spec", side="engine")
    ts = parse_spec(trainer_spec, "trainer spec", side="trainer")
    engine = make_engine(base.config, es, max_num_seqs=max_seqs)
    engine.load_weights(model)
    ref = base.eval().requires_grad_(False) if cfg.kl_coef > 0 else None  # the frozen warm start
    return Lane(name, model, opt, ref, engine, Compute.from_spec(ts), remedy)


def _mean(rows: list[dict]) -> dict:
    keys = rows[0].keys()
    return {k: sum(float(r[k]) for r in rows) / len(rows) for k in keys}


def _trainer_logprobs(lane: Lane, seqs, temperature, chunk: int, replay=None):
    """Chunked no-grad forward; `replay` is per-sequence routing to replay (R3), or None."""
    lps, ents, routes = [], [], []
    for i in range(0, len(seqs), chunk):
        rp = replay_tensor(seqs[i:i + chunk], None if replay is None else replay[i:i + chunk])
        out = sequence_logprobs(lane.model, lane.compute, seqs[i:i + chunk], temperature, replay=rp)
        lps.append(out.logprobs)
        ents.append(out.entropy)
        routes.append(out.routing)
    width = max(x.shape[1] for x in lps)
    pad = lambda xs: torch.cat([torch.nn.functional.pad(x, (0, width - x.shape[1])) for x in xs])
    return pad(lps), pad(ents), routes


def train_step(lane: Lane, cfg: RunConfig, task, algo, step: int) -> tuple[dict, Experience, dict]:
    """One RL step on one lane; returns (metrics, experience, timings)."""
    t0 = time.perf_counter()
    n = cfg.prompts_per_step * cfg.group_size
    exp = collect(lane.engine, task, task.train_batch(cfg.seed, step, cfg.prompts_per_step), cfg.group_size,
                  step, cfg.seed, cfg.temperature)
    t1 = time.perf_counter()
    adv = algo.advantage(exp.rewards, cfg.group_size)
    mask = exp.mask
    if algo.dynamic_sampling:
        mask = mask & dynamic_sampling_mask(exp.rewards, cfg.group_size)[:, None]
    mb = n // cfg.mini_batches
    lengths = [len(p) + len(r) for p, r in exp.seqs]
    with torch.no_grad():
        old_train, entropy, routes = _trainer_logprobs(
            lane, exp.seqs, cfg.temperature, mb, exp.routing if lane.remedy.replay == "engine" else None)
    old_train = old_train[:, : mask.shape[1]]
    trainer_routing = per_sequence(routes, lengths, mb)
    # Routing the update passes replay: R3 the engine's, R2 the trainer's own from the recompute above.
    replay = {"engine": exp.routing, "old": trainer_routing}.get(lane.remedy.replay)
    rb = RemedyBatch(old_train.detach(), exp.rollout_logprobs, adv, mask, cfg.group_size)
    remedy = check_result(lane.remedy(rb), rb, lane.remedy.name)
    mask, weights = mask & remedy.mask, remedy.weights
    t2 = time.perf_counter()
    old = old_train if cfg.mode == "recompute" else exp.rollout_logprobs
    loss_kw = algo.loss_kwargs | {k: v for k, v in (("eps_low", cfg.eps_low), ("eps_high", cfg.eps_high)) if v is not None}
    upd = []
    params = list(lane.model.parameters())
    for _ in range(cfg.epochs):
        for i in range(0, n, mb):
            sl = slice(i, i + mb)
            rp = replay_tensor(exp.seqs[sl], None if replay is None else replay[sl])
            out = sequence_logprobs(lane.model, lane.compute, exp.seqs[sl], cfg.temperature, replay=rp)
            w = out.logprobs.shape[1]
            loss, m = algo.loss(out.logprobs, old[sl, :w], adv[sl], mask[sl, :w],
                                weights=None if weights is None else weights[sl, :w], **loss_kw)
            if lane.ref is not None:
                with torch.no_grad():
                    ref_lp = sequence_logprobs(lane.ref, lane.compute, exp.seqs[sl], cfg.temperature).logprobs
                kl = agg_loss(kl_penalty(out.logprobs, ref_lp, cfg.kl_kind), mask[sl, :w], algo.agg)
                loss = loss + cfg.kl_coef * kl
                m = m | {"actor/kl_loss": float(kl.detach())}
            lane.opt.zero_grad(set_to_none=True)
            loss.backward()
            gn = float(clip_grad_norm(params, cfg.grad_clip))
            if not (math.isfinite(float(loss.detach())) and math.isfinite(gn)):
                raise NonFiniteError(f"step {step}: non-finite loss={float(loss.detach())} or grad_norm={gn} "
                                     f"(lane {lane.name}); metrics up to step {step - 1} are kept")
            lane.opt.step()
            d = objective_drift(out.logprobs.detach(), old_train[sl, :w], exp.rollout_logprobs[sl, :w],
                                adv[sl], mask[sl, :w])
            upd.append({"actor/loss": float(loss.detach()), "actor/grad_norm": gn, **m, **d})
    t3 = time.perf_counter()
    lane.engine.load_weights(lane.model)
    t4 = time.perf_counter()
    lens = exp.mask.sum(1).float()
    metrics = {
        "critic/rewards/mean": float(exp.rewards.mean()), "critic/rewards/std": float(exp.rewards.std()),
        "response_length/mean": float(lens.mean()), "response_length/max": float(lens.max()),
        "actor/entropy": float(entropy[:, : mask.shape[1]][exp.mask].mean()),
        "batch/kept_frac": float(mask.any(1).float().mean()),
        **_mean(upd),
        **{k: v for k, v in mismatch_metrics(old_train, exp.rollout_logprobs, exp.mask).items() if k != "tokens"},
        # counts in metrics.ABS_DELTA_BINS: the report's |delta| histograms sum these over steps
        "mismatch/abs_delta_hist": abs_delta_histogram(old_train, exp.rollout_logprobs, exp.mask),
    }
    clash = sorted(metrics.keys() & remedy.metrics.keys())
    if clash:
        raise ValueError(f"remedy {lane.remedy.name}: metric name(s) {clash} clash with the loop's metrics")
    metrics.update(remedy.metrics)
    if exp.routing[0] is not None:
        metrics["mismatch/routing_agreement"] = routing_agreement(torch.cat(trainer_routing), torch.cat(exp.routing))
    timing = {"time/rollout": t1 - t0, "time/recompute": t2 - t1, "time/update": t3 - t2, "time/sync": t4 - t3}
    return metrics, exp, timing


def _token_diff(a: Experience, b: Experience) -> float:
    """Fraction of sampled token positions where two lanes' responses differ (length differences count)."""
    diff = total = 0
    for (_, ra), (_, rb) in zip(a.seqs, b.seqs):
        width = max(len(ra), len(rb))
        total += width
        diff += sum(1 for j in range(width) if j >= len(ra) or j >= len(rb) or ra[j] != rb[j])
    return diff / max(total, 1)


def _param_distance(a: torch.nn.Module, b: torch.nn.Module) -> float:
    with torch.no_grad():
        return math.sqrt(sum(float(((p - q).double() ** 2).sum()) for p, q in zip(a.parameters(), b.parameters())))


def resolve_checkpoint(cfg: RunConfig):
    from ..warmstart import default_checkpoint
    return default_checkpoint(cfg.task, cfg.preset) if cfg.model == "default" else cfg.model


def run(cfg: RunConfig, out, progress: bool = True) -> dict:
    """Run (or resume) a training run into directory `out`; returns the summary."""
    from ..warmstart import set_threads
    from tqdm import tqdm

    set_threads(cfg.threads)
    # Some CPU backward kernels (index_put_/scatter with accumulate) otherwise add in a
    # run-dependent order: measured, two identical runs drifted by 1e-8 in step 0's update.
    torch.use_deterministic_algorithms(True)
    task, algo = get_task(cfg.task), get_algorithm(cfg.algorithm)
    rd = RunDir(out, cfg.to_dict())
    base = load_checkpoint(resolve_checkpoint(cfg))
    n = cfg.prompts_per_step * cfg.group_size
    # The remedy's spec overrides (e.g. fp16) apply to the main lane only: the twin is the zero-mismatch
    # reference by definition, and its other hooks are no-ops there (rho == 1, routings agree).
    remedy = load_remedy(cfg.remedy, cfg.remedy_args)
    lanes = [_lane("main", base, cfg, cfg.engine | remedy.engine_override, cfg.trainer | remedy.trainer_override, n,
                   remedy)]
    if cfg.twin:
        lanes.append(_lane("twin", base, cfg, ZERO_MISMATCH, ZERO_MISMATCH, n, remedy))
    eval_problems = task.eval_set(cfg.eval_n)
    eval_engine = Engine(base.config, "kernels=exact", max_num_seqs=min(256, cfg.eval_n))
    state = rd.load_state()
    start, extra = 0, {"first_divergence_step": None}
    if state is not None:
        for lane, s in zip(lanes, state["lanes"]):
            lane.model.load_state_dict(s["model"])
            lane.opt.load_state_dict(s["opt"])
            lane.engine.load_weights(lane.model)
        start, extra = state["step"], state["extra"]
    logs = rd.logs(start)

    def evaluate(step):
        row = {"step": step}
        for lane in lanes:
            eval_engine.load_weights(lane.model)
            r = evaluate_both(lane.model, task, eval_problems, seed=cfg.seed, engine=eval_engine)
            prefix = "" if lane.name == "main" else "twin/"
            row.update({prefix + "accuracy_t1": r["accuracy_t1"], prefix + "accuracy_greedy": r["accuracy_greedy"]})
        logs["eval"].write(row)
        return row

    status, error = "finished", None
    if start == 0:
        evaluate(0)
    bar = tqdm(range(start, cfg.steps), initial=start, total=cfg.steps, disable=not progress, desc="train",
               dynamic_ncols=True)
    try:
        for step in bar:
            results = [train_step(lane, cfg, task, algo, step) for lane in lanes]
            metrics, exp, timing = results[0]
            row = {"step": step, **metrics}
            if cfg.twin:
                twin_m, twin_exp, twin_t = results[1]
                row["twin/critic/rewards/mean"] = twin_m["critic/rewards/mean"]
                row["twin/frac_tokens_differ"] = _token_diff(exp, twin_exp)
                if extra["first_divergence_step"] is None and row["twin/frac_tokens_differ"] > 0:
                    extra["first_divergence_step"] = step
                timing = timing | {"twin/" + k: v for k, v in twin_t.items()}
            logs["metrics"].write(row)
            logs["timing"].write({"step": step, **timing})
            done = step + 1
            if done % cfg.eval_every == 0 or done == cfg.steps:
                evaluate(done)
            if done % cfg.checkpoint_every == 0 or done == cfg.steps:
                rd.save_state({"step": done, "extra": extra,
                               "lanes": [{"model": l.model.state_dict(), "opt": l.opt.state_dict()} for l in lanes]})
            bar.set_postfix(reward=f"{metrics['critic/rewards/mean']:.3f}", k3=f"{metrics['rollout_corr/k3_kl']:.1e}")
    except NonFiniteError as e:
        status, error = "failed", str(e)
    finally:
        for log in logs.values():
            log.close()
    summary = summarize(rd.path, cfg, status, error, extra)
    if cfg.twin:
        summary["twin/param_distance"] = _param_distance(lanes[0].model, lanes[1].model)
    rd.write_summary(summary)
    if status == "failed":
        raise NonFiniteError(error)
    return summary


def summarize(path, cfg: RunConfig, status: str, error, extra: dict) -> dict:
    import json
    rows = [json.loads(l) for l in (path / "metrics.jsonl").read_text().splitlines()]
    evals = [json.loads(l) for l in (path / "eval.jsonl").read_text().splitlines()]
    s = {"status": status, "error": error, "steps_done": len(rows), "task": cfg.task,
         "task_version": get_task(cfg.task).version, "algorithm": cfg.algorithm, "mode": cfg.mode,
         "engine": cfg.engine, "trainer": cfg.trainer, "seed": cfg.seed, **extra}
    if evals:
        s.update(initial_accuracy_t1=evals[0]["accuracy_t1"], final_accuracy_t1=evals[-1]["accuracy_t1"],
                 final_accuracy_greedy=evals[-1]["accuracy_greedy"],
                 peak_accuracy_t1=max(e["accuracy_t1"] for e in evals))
    if rows:
        for k in ("rollout_corr/k3_kl", "training/rollout_probs_diff_max", "mismatch/mean_abs_delta",
                  "drift/diff_mean", "drift/diff_abs_mean"):
            s[f"mean/{k}"] = sum(r[k] for r in rows) / len(rows)
        s["final/critic/rewards/mean"] = rows[-1]["critic/rewards/mean"]
    return s
