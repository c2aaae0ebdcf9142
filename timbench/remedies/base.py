"""The remedy plug-in API: the batch a remedy sees, what it returns, the base class, the shared metrics.

A remedy turns one step's correction ratios rho_t = pi_old / mu (trainer's recomputed logprob over
the engine's; the quantities and their names are timbench.metrics.ratios') into per-token loss weights and a keep-mask,
as a pure function of the batch. It may also act earlier through declarative hooks: `replay` (MoE routing replay) and
spec overrides for the engine / trainer (e.g. fp16 on both sides). The loop reads the hooks; the remedy never
touches the loop.

Metric names follow verl's `rollout_corr/*` (verl/trainer/ppo/rollout_corr_helper.py); every
remedy logs the same set through `finish`, so runs with different remedies line up column for
column. The mapping from the generic names:

    remedy/token_masked_frac    -> rollout_corr/rollout_rs_masked_fraction
    remedy/seq_masked_frac      -> rollout_corr/rollout_rs_seq_masked_fraction
    remedy/token_truncated_frac -> rollout_corr/rollout_is_ratio_fraction_high
    remedy/is_weight_{mean,min,max} -> rollout_corr/rollout_is_{mean,min,max}
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from ..kernels.reduce import fmean
from ..metrics import ratios
from ..metrics.schema import METRIC_NAMES  # noqa: F401  (re-exported: remedies import it from here)
from ..util.coerce import coerce, field_kind

REPLAY_MODES = (None, "engine", "old")


@dataclass(frozen=True)
class RemedyBatch:
    """One step's batch as a remedy sees it (all tensors detached)."""

    old_logprobs: torch.Tensor
    """[N, T] trainer's recomputed logprobs pi_old of the sampled tokens."""
    rollout_logprobs: torch.Tensor
    """[N, T] engine logprobs mu the tokens were sampled with."""
    advantages: torch.Tensor
    """[N] per-sequence advantages."""
    mask: torch.Tensor
    """[N, T] bool, the tokens in the loss before the remedy."""
    group_size: int
    """G: responses per prompt (groups of G contiguous rows)."""


@dataclass(frozen=True)
class RemedyResult:
    """What a remedy returns."""

    weights: torch.Tensor | None
    """[N, T] float per-token loss multipliers (detached), or None for all ones."""
    mask: torch.Tensor
    """[N, T] bool, the tokens kept; the loop ANDs it into the loss mask."""
    metrics: dict[str, float]
    """Scalar metrics for this step's row (the shared set from `finish`, plus any of the remedy's own)."""


def param(default: Any, doc: str) -> Any:
    """A remedy parameter with its default and one-line doc (shown by `timbench remedies list`)."""
    return field(default=default, metadata={"doc": doc})


@dataclass(frozen=True)
class NoParams:
    """A remedy without parameters."""


class Remedy:
    """Base class of all remedies (built-in and plug-in).

    Subclasses set `name`, `doc` (one paragraph: formula, defaults, source), `Params` (a dataclass
    of parameters built with `param`), optionally the hooks, and implement `__call__`.
    """

    name: ClassVar[str] = ""
    doc: ClassVar[str] = ""
    Params: ClassVar[type] = NoParams
    replay: ClassVar[str | None] = None
    """MoE routing replay: None; "engine" (R3: the engine's routing in the recompute and update passes);
    "old" (R2: the trainer's own recompute-pass routing in the update passes)."""
    engine_override: ClassVar[dict] = {}
    """Spec keys forced on the engine, e.g. {"dtype": "fp16"} (read-only)."""
    trainer_override: ClassVar[dict] = {}
    """Spec keys forced on the trainer (read-only)."""
    trainer_follows_engine: ClassVar[tuple[str, ...]] = ()
    """Spec keys the trainer takes from the (overridden) engine spec, e.g. ("weight_quant", "act_quant"):
    unified precision, whatever format the condition's engine uses."""
    sampling_replay: ClassVar[bool] = False
    """Sampling replay: the trainer scores every response token over the engine's sampling support (the
    tokens top-k / top-p kept there) instead of the whole vocabulary, in the recompute and the update passes."""
    rollout_rounding: ClassVar[bool] = False
    """Rounding-aligned quantization: the trainer's quantized weights round toward the codewords the rollout's
    weights used (timbench.quant.aligned) instead of to the nearest grid value."""
    mode: str | None = None
    """Handling mode the remedy implies (verl's bypass_mode: "bypass", decoupled: "recompute"), or None for
    any; a config whose mode differs is refused with a one-line error (timbench.rl.config.load)."""

    def __init__(self, **args):
        self.args = coerce_params(self.Params, args, self.name or type(self).__name__)
        self.params = self.Params(**self.args)

    def __init_subclass__(cls, **kwargs):
        # A shape error raised inside `finish` (a plug-in passing wrongly shaped weights or masks) does not
        # know which remedy called it; every subclass's __call__ adds the name, so the error is one line.
        super().__init_subclass__(**kwargs)
        call = cls.__dict__.get("__call__")
        if call is not None:

            @functools.wraps(call)
            def named(self, batch):
                try:
                    return call(self, batch)
                except RemedyShapeError as e:
                    raise RemedyShapeError(f"remedy {self.name or type(self).__name__}: {e}") from None

            cls.__call__ = named

    def __call__(self, batch: RemedyBatch) -> RemedyResult:
        raise NotImplementedError

    def check_engine(self, engine) -> None:
        """Raise a one-line ValueError when this remedy cannot run against `engine` (the main lane's engine
        Spec after the overrides), e.g. a hook that needs information that engine does not give. Default: none."""

    def update_keep(self, log_r: torch.Tensor, mask: torch.Tensor) -> torch.Tensor | None:
        """Optional rejection inside each update pass, on the PPO ratio r = pi_theta / pi_old.

        `log_r` [n, T] = clamp(log pi_theta - log pi_old) of one mini-batch (detached), `mask` [n, T] its
        loss mask after `__call__`'s keep-mask. Return an [n, T] bool keep-mask that the loop ANDs into
        that pass's loss, or None (the default: the update rejects nothing). This is the ablation the seed
        paper runs against rejection on the correction ratio rho.
        """
        return None

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.params})"


def _coerce(f: dataclasses.Field, value, owner: str):
    kind = field_kind(f)
    try:
        return coerce(value, kind)
    except ValueError:
        raise ValueError(f"remedy {owner}: parameter {f.name}={value!r} is not a valid {kind}") from None


def coerce_params(params_cls: type, args: dict, owner: str) -> dict:
    """Validate and type-coerce parameter overrides; unknown names are a one-line error listing the valid ones."""
    if not isinstance(args, dict):
        raise ValueError(f"remedy {owner}: remedy_args must be a mapping of parameter names to values, got {args!r}")
    fields = {f.name: f for f in dataclasses.fields(params_cls)}
    unknown = sorted(set(map(str, args)) - set(fields))
    if unknown:
        raise ValueError(f"remedy {owner}: unknown parameter(s) {unknown}; valid: {', '.join(fields) or '(none)'}")
    out = {k: _coerce(fields[k], v, owner) for k, v in args.items()}
    try:
        params_cls(**out)  # the dataclass's own range checks (__post_init__)
    except (ValueError, TypeError) as e:
        raise ValueError(f"remedy {owner}: {e}") from None
    return out


def describe_params(params_cls: type) -> dict[str, dict]:
    """{name: {"default": ..., "doc": ...}} of a params dataclass."""
    return {f.name: {"default": f.default, "doc": f.metadata.get("doc", "")} for f in dataclasses.fields(params_cls)}


# ---------------------------------------------------------------- formula helpers (pure)


def log_rho(batch: RemedyBatch) -> torch.Tensor:
    """[N, T] float64 log rho_t = clamp(log pi_old - log mu, +-20), 0 outside the mask.

    The definition is timbench.metrics.ratios.log_rho."""
    return ratios.log_rho(batch.old_logprobs, batch.rollout_logprobs, batch.mask)


# ---------------------------------------------------------------- the shared result + metrics


def _ratio(num: torch.Tensor, den: torch.Tensor) -> float:
    return float(num.sum()) / float(den.sum()) if bool(den.any()) else 0.0


class RemedyShapeError(ValueError):
    """A remedy's weights or masks do not have the batch's [N, T] shape."""


def _check_shape(what: str, t: torch.Tensor | None, shape: tuple) -> None:
    got = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
    if t is not None and got != shape:
        raise RemedyShapeError(f"{what} has shape {got}, expected the batch's [N, T] = {shape}")


def finish(
    batch: RemedyBatch,
    weights: torch.Tensor | None = None,
    keep: torch.Tensor | None = None,
    truncated: torch.Tensor | None = None,
    extra: dict[str, float] | None = None,
) -> RemedyResult:
    """Build a RemedyResult and the metrics every remedy logs.

    `keep` [N, T] bool (tokens kept), `truncated` [N, T] bool (weight capped) and `weights` [N, T];
    fractions are over the batch's masked-in tokens / non-empty sequences, as verl's masked_mean over
    response_mask. Weight statistics run over the kept masked-in tokens (a missing weight counts as
    1.0; no kept token gives 1.0, the neutral weight). Shapes are checked first: a wrong one is a
    one-line RemedyShapeError naming the argument, the shape received and the one expected.
    """
    shape = tuple(batch.mask.shape)
    for what, t in (("weights", weights), ("keep", keep), ("truncated", truncated)):
        _check_shape(f"finish({what}=...)", t, shape)
    m = batch.mask
    kept = m if keep is None else (m & keep)
    dropped = m & ~kept
    rows = m.any(-1)
    w = torch.ones_like(batch.old_logprobs, dtype=torch.float64) if weights is None else weights.detach().double()
    wk = w[kept]
    metrics = {
        METRIC_NAMES["remedy/token_masked_frac"]: _ratio(dropped, m),
        METRIC_NAMES["remedy/seq_masked_frac"]: _ratio(dropped.any(-1) & rows, rows),
        METRIC_NAMES["remedy/token_truncated_frac"]: 0.0 if truncated is None else _ratio(truncated & m, m),
        METRIC_NAMES["remedy/is_weight_mean"]: float(fmean(wk)) if wk.numel() else 1.0,
        METRIC_NAMES["remedy/is_weight_min"]: float(wk.min()) if wk.numel() else 1.0,
        METRIC_NAMES["remedy/is_weight_max"]: float(wk.max()) if wk.numel() else 1.0,
    }
    out_w = None if weights is None else weights.detach().to(batch.old_logprobs.dtype)
    return RemedyResult(out_w, kept, metrics | dict(extra or {}))


def _describe(t) -> str:
    return f"{t.dtype} {tuple(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__


def check_bool_mask(t, shape: tuple, requirement: str) -> None:
    """One-line ValueError "<requirement> a bool tensor of shape ..., got ..." unless `t` is one."""
    if not isinstance(t, torch.Tensor) or t.dtype != torch.bool or tuple(t.shape) != tuple(shape):
        raise ValueError(f"{requirement} a bool tensor of shape {tuple(shape)}, got {_describe(t)}")


def check_result(result: RemedyResult, batch: RemedyBatch, name: str) -> RemedyResult:
    """Validate what a (possibly third-party) remedy returned; one-line ValueError on any defect."""
    where = f"remedy {name}"
    if not isinstance(result, RemedyResult):
        raise ValueError(f"{where} returned {type(result).__name__}, not a RemedyResult")
    shape = tuple(batch.mask.shape)
    check_bool_mask(result.mask, shape, f"{where}: mask must be")
    if result.weights is not None:
        w = result.weights
        if not isinstance(w, torch.Tensor) or not w.is_floating_point() or tuple(w.shape) != shape:
            raise ValueError(f"{where}: weights must be None or a float tensor of shape {shape}, got {_describe(w)}")
        kept = w[batch.mask & result.mask]
        if not bool(torch.isfinite(kept).all()):
            raise ValueError(f"{where}: weights are NaN or infinite on kept tokens")
        if kept.numel() and float(kept.min()) < 0:
            raise ValueError(
                f"{where}: weights must be >= 0 on kept tokens (a negative weight flips that "
                f"token's policy gradient), got min {float(kept.min()):g}"
            )
    for k, v in result.metrics.items():
        if not isinstance(k, str) or not isinstance(v, (int, float)) or not math.isfinite(float(v)):
            raise ValueError(f"{where}: metric {k!r}={v!r} is not a finite number")
    return result
