"""The RL training run: lanes stepped by `timbench.rl.step`, evaluated, logged and checkpointed.

A run has one lane, or two when it names a zero-mismatch twin: both see the same
problems and the same sampling noise, so the twin isolates what the mismatch
alone changed. Everything logged to metrics.jsonl is a deterministic function
of (config, seed); wall times go to timing.jsonl. The run directory's
status.json says whether the run is running, finished or failed (and why).
"""

from __future__ import annotations

import gc
import math
from pathlib import Path

import torch
from tqdm import tqdm

from ..engine import make_engine
from ..evaluate import both_slots, evaluate, evaluate_both
from ..kernels.reduce import fsum
from ..metrics.schema import ACCURACY_GREEDY, ACCURACY_T1, K3_KL, QUANTIZED_ACCURACY_GREEDY, REWARD_MEAN, TWIN
from ..model import Qwen3ForCausalLM, load_checkpoint
from ..remedies.deadline import PLUGIN_CALL_TIMEOUT_S, last_words
from ..replica import REPLICAS
from ..spec.keys import ZERO_MISMATCH, quantized_reference
from ..trainer import NonFiniteError
from ..util.dirlock import DirLock
from ..util.shipped import resolve_checkpoint
from ..util.threads import set_threads
from .config import Loaded, RunConfig, load
from .rollout import Experience
from .rundir import RunDir, one_line, status_text, summarize
from .step import make_lane, train_step

__all__ = ["NonFiniteError", "run", "summarize"]


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
        return math.sqrt(sum(float(fsum((p - q).double() ** 2)) for p, q in zip(a.parameters(), b.parameters())))


class _Session:
    """A run's lanes, evaluator and logs, restored from `state` (the run directory's checkpoint) if there is one."""

    def __init__(self, run: Loaded, rd: RunDir, base: Qwen3ForCausalLM, plugin_timeout: float, state: dict | None):
        cfg = run.config
        self.run, self.rd = run, rd
        n = cfg.prompts_per_step * cfg.group_size
        # The remedy's spec overrides (e.g. fp16) apply to the main lane only: the twin is the zero-mismatch
        # reference by definition, and its other hooks are no-ops there (rho == 1, routings agree).
        self.lanes = [
            make_lane("main", base, cfg, run.main_engine, run.main_trainer, n, run.remedy_impl, plugin_timeout)
        ]
        self.lanes[0].replica = REPLICAS[cfg.replica]  # main lane only: the twin lane is the zero-mismatch reference
        if cfg.twin:
            self.lanes.append(
                make_lane("twin", base, cfg, ZERO_MISMATCH, ZERO_MISMATCH, n, run.remedy_impl, plugin_timeout)
            )
        # With all of evaluate_both's forks in flight the eval is one prefill and one decode loop.
        self.eval_engine = make_engine(base.config, ZERO_MISMATCH, max_num_seqs=both_slots(cfg.eval_n))
        # A quantized rollout engine also gets its policy measured on its own (greedy, fp32 exact otherwise):
        # "quantization hurt the policy" vs "mismatch hurt training".
        quant = quantized_reference(run.main_engine)
        self.quant_engine = (
            None if quant is None else make_engine(base.config, quant, max_num_seqs=min(256, cfg.eval_n))
        )
        self.start, self.extra = 0, {"first_divergence_step": None}
        if state is not None:
            for lane, s in zip(self.lanes, state["lanes"]):
                lane.model.load_state_dict(s["model"])
                lane.opt.load_state_dict(s["opt"])
                if lane.history is not None:
                    lane.history.restore(s["history"])
                lane.engine.load_weights(lane.model if lane.history is None else lane.history.behavior)
            self.start, self.extra = state["step"], state["extra"]
        self.logs = rd.logs(self.start)

    def evaluate(self, step: int) -> None:
        row = {"step": step}
        for lane in self.lanes:
            self.eval_engine.load_weights(lane.model)
            r = evaluate_both(
                lane.model, self.run.task_impl, self.run.eval_problems, seed=self.run.seed, engine=self.eval_engine
            )
            prefix = "" if lane.name == "main" else TWIN
            row.update({prefix + ACCURACY_T1: r[ACCURACY_T1], prefix + ACCURACY_GREEDY: r[ACCURACY_GREEDY]})
            if lane.name == "main" and self.quant_engine is not None:
                self.quant_engine.load_weights(lane.model)
                q = evaluate(
                    lane.model,
                    self.run.task_impl,
                    self.run.eval_problems,
                    temperature=0.0,
                    seed=self.run.seed,
                    engine=self.quant_engine,
                )
                row[QUANTIZED_ACCURACY_GREEDY] = q["accuracy"]
        self.logs["eval"].write(row)

    def step(self, step: int) -> dict:
        """Train every lane one step and log it; returns the main lane's metrics."""
        results = [train_step(lane, self.run, step) for lane in self.lanes]
        metrics, batch = results[0]
        row, timing = {"step": step, **metrics}, batch.timing
        if self.run.twin:
            twin_m, twin_batch = results[1]
            row[TWIN + REWARD_MEAN] = twin_m[REWARD_MEAN]
            row["twin/frac_tokens_differ"] = _token_diff(batch.exp, twin_batch.exp)
            if self.extra["first_divergence_step"] is None and row["twin/frac_tokens_differ"] > 0:
                self.extra["first_divergence_step"] = step
            timing = timing | {"twin/" + k: v for k, v in twin_batch.timing.items()}
        self.logs["metrics"].write(row)
        self.logs["timing"].write({"step": step, **timing})
        return metrics

    def save(self, done: int) -> None:
        self.rd.save_state(
            {
                "step": done,
                "extra": self.extra,
                "lanes": [
                    {
                        "model": l.model.state_dict(),
                        "opt": l.opt.state_dict(),
                        **({} if l.history is None else {"history": l.history.state()}),
                    }
                    for l in self.lanes
                ],
            }
        )

    def close(self) -> None:
        for log in self.logs.values():
            log.close()


def run(cfg: RunConfig | Loaded, out, progress: bool = True, plugin_timeout: float = PLUGIN_CALL_TIMEOUT_S) -> dict:
    """Run (or resume) a training run into directory `out`; returns the summary.

    `cfg` is loaded here if it is a plain RunConfig (`load_config` already returns a Loaded). An exclusive
    lock on `out` is taken before anything is written there: a second run on the same directory is a
    one-line error instead of truncating the first one's logs. `plugin_timeout` bounds each call of a plug-in
    remedy's hooks (seconds, 0 = none; timbench.remedies.deadline): a hung plug-in fails the run.
    """
    loaded = load(cfg)
    with DirLock(out, "timbench train"), last_words(lambda reason: _record_kill(out, reason)):
        return _run(loaded, out, progress, plugin_timeout)


def _run(loaded: Loaded, out, progress: bool, plugin_timeout: float) -> dict:
    set_threads(loaded.threads)
    # Some CPU backward kernels (index_put_/scatter with accumulate) otherwise add in a
    # run-dependent order: measured, two identical runs drifted by 1e-8 in step 0's update.
    torch.use_deterministic_algorithms(True)
    base = load_checkpoint(resolve_checkpoint(loaded.model, loaded.task, loaded.preset))
    rd = RunDir(out, loaded.to_dict())
    # Verify before touching anything: an ended run's files against its manifest, then the checkpoint, so a
    # damaged file fails the rerun with the finished result (summary.json, manifest.json) still in place.
    rd.check_sealed()
    state = rd.load_state()
    summary = rd.sealed_summary(state, loaded.steps)
    if summary is not None:
        return summary
    rd.begin()
    try:
        session = _Session(loaded, rd, base, plugin_timeout, state)
    except BaseException as e:
        _record_failure(rd, e)
        raise
    status, error = "finished", None
    # What is alive now (modules, models, engines, numba's dispatchers: ~330k objects) lives as long as the run;
    # frozen, the cyclic GC's full collections stop rescanning it (measured 176 ms each, about one per three
    # paper-grid steps). Speed only: no value depends on when garbage is collected.
    gc.collect()
    gc.freeze()
    try:
        if session.start == 0:
            session.evaluate(0)
        bar = tqdm(
            range(session.start, loaded.steps),
            initial=session.start,
            total=loaded.steps,
            disable=not progress,
            desc="train",
            dynamic_ncols=True,
        )
        for step in bar:
            metrics = session.step(step)
            done = step + 1
            if done % loaded.eval_every == 0 or done == loaded.steps:
                session.evaluate(done)
            if done % loaded.checkpoint_every == 0 or done == loaded.steps:
                session.save(done)
            bar.set_postfix(reward=f"{metrics[REWARD_MEAN]:.3f}", k3=f"{metrics[K3_KL]:.1e}")
    except NonFiniteError as e:
        status, error = "failed", str(e)
    except BaseException as e:  # a crash or a kill: the status says so; rerunning resumes from the checkpoint
        try:
            session.close()
        except OSError:  # a log that cannot flush (the disk that failed the step): the error below says so
            pass
        _record_failure(rd, e)
        raise
    finally:
        gc.unfreeze()
    session.close()
    summary = summarize(rd.path, loaded, status, error, session.extra)
    if loaded.twin:
        summary["twin/param_distance"] = _param_distance(session.lanes[0].model, session.lanes[1].model)
    rd.write_summary(summary)
    rd.write_status(status, error)
    rd.seal()
    if status == "failed":
        raise NonFiniteError(error)
    return summary


def _record_kill(out, reason: str) -> dict:
    """A plug-in outlived its limit and the process is about to end (remedies.deadline): the files to leave,
    status failed and error.txt saying so (there is no traceback to keep)."""
    return {
        Path(out) / "error.txt": f"PluginTimeout: {reason}\n",
        Path(out) / "status.json": status_text("failed", f"PluginTimeout: {reason}"),
    }


def _record_failure(rd: RunDir, e: BaseException) -> None:
    """status.json := failed with the error's one line; on a disk too full even for that, the run's own error
    (the one that names the path) is what the caller raises, not this write's."""
    try:
        rd.write_status("failed", one_line(e))
    except OSError:
        pass
