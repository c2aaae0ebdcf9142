"""Run configuration: one frozen dataclass, loaded from YAML, overridden with dotted `--set key=value`.

Two steps, each done once. Building a `RunConfig` parses every value at the edge
(types, ranges, the engine and trainer specs into `Spec` objects) and touches
nothing outside the config. `load` (what `load_config` and `from_dict` end
with) is the one step that loads what the config names: the task and its eval
set, the algorithm, the remedy (which may execute a user's plug-in file) and the
main lane's specs with the remedy's overrides applied. Unknown keys and bad
values are one-line errors naming the key and what is valid. The resolved
config is written beside the results, so a run directory says exactly what
produced it.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ..remedies import load_remedy
from ..replica import check_replica
from ..spec.keys import Spec, parse_spec
from ..tasks import get_task
from ..util.coerce import coerce, field_kind
from ..util.readfile import read_yaml
from .algorithms import ALGORITHMS, get_algorithm

MODES = ("recompute", "bypass")
MAX_EVAL_N = 4096
"""Largest eval_n: every eval samples each problem twice (T=1 and greedy) per lane, and a generated
task builds its eval set problem by problem, so a typo like 10**6 would run for hours instead of failing."""


@dataclass(frozen=True)
class RunConfig:
    """One RL run: task + warm start + algorithm + engine/trainer specs + handling mode + seed + budget."""

    task: str = "add-4d-v1"
    """Registered task name (see `timbench tasks list`)."""
    model: str = "default"
    """Warm-start checkpoint directory, or `default` for the shipped checkpoint of (task, preset)."""
    preset: str = "tiny-dense"
    """Model preset of the default checkpoint: a name in timbench.model.config.PRESETS (tiny-dense, small-dense,
    medium-dense, tiny-moe, tiny-moe-e4, tiny-moe-e2)."""
    algorithm: str = "grpo"
    """RL algorithm (grpo, dapo, drgrpo, rloo, reinforce, reinforce_pp, gspo)."""
    mode: str = "recompute"
    """recompute: pi_old = trainer's recomputed logprobs; bypass: pi_old = engine's logprobs (paper Eq. 4)."""
    engine: Spec = Spec()
    """Engine spec (keys as in `timbench align --engine`); YAML: a mapping or a `key=value,...` string."""
    trainer: Spec = Spec()
    """Trainer spec."""
    remedy: str = "none"
    """Mismatch remedy: a registered name (`timbench remedies list`), `path/to/file.py:Class` or `pkg.module:Class`."""
    remedy_args: dict = field(default_factory=dict)
    """Overrides of the remedy's parameters (e.g. {C: 3.0}); unknown names are rejected."""
    seed: int = 0
    """Seed of the training stream and the sampling noise."""
    steps: int = 200
    """RL steps (the budget)."""
    prompts_per_step: int = 32
    """B: prompts sampled per step."""
    group_size: int = 8
    """G: responses per prompt."""
    mini_batches: int = 2
    """Optimizer updates per epoch (the batch of B*G responses split evenly)."""
    epochs: int = 1
    """Passes over the batch per step."""
    lr: float = 1e-4
    """AdamW learning rate (>= 0)."""
    betas: tuple = (0.9, 0.99)
    """AdamW betas: a list of two numbers in [0, 1)."""
    weight_decay: float = 0.0
    """AdamW weight decay (>= 0)."""
    grad_clip: float = 1.0
    """Max global grad norm, > 0 (the logged norm is taken before clipping)."""
    temperature: float = 1.0
    """Sampling temperature of rollouts (the trainer scores the same tempered distribution)."""
    eps_low: float | None = None
    """PPO lower clip (>= 0); None = the algorithm's default."""
    eps_high: float | None = None
    """PPO upper clip (>= 0); None = the algorithm's default."""
    clip_ratio_c: float | None = None
    """Dual-clip bound c (verl actor clip_ratio_c, arXiv 1912.09729): a finite number > 1 bounds each A < 0 token's
    PPO loss at -A c, so a ratio >> 1 cannot grow it further; None = off (timbench's default; verl's is 3.0).
    PPO-clip algorithms only (not gspo, as verl)."""
    kl_coef: float = 0.0
    """Weight (>= 0) of a KL(pi_theta || pi_ref) penalty to the warm start (0 = off, the GRPO/DAPO default here)."""
    kl_kind: str = "low_var_kl"
    """KL estimator for the penalty: k1, abs, mse (k2) or low_var_kl (k3)."""
    eval_every: int = 10
    """Evaluate every k steps (and at step 0 and the end)."""
    eval_n: int = 256
    """Eval problems (from the task's fixed eval set; at most its size and MAX_EVAL_N)."""
    checkpoint_every: int = 25
    """Save a resumable checkpoint every k steps."""
    twin: bool = False
    """Run a zero-mismatch twin (exact/exact fp32, same everything else) in lockstep."""
    threads: int = 1
    """Torch and numba threads for this run (two runs in parallel use both cores)."""
    replica: str = "none"
    """A second, scoring-only trainer pass of each step's batch on the main lane (timbench.replica.REPLICAS):
    none (off), identical, microbatch1 or fullbatch; logs its noise floor and remedy mask overlap (replica/*)."""

    def __post_init__(self):
        # Frozen: the parsed values are set once, here, and never change afterwards.
        for f in dataclasses.fields(self):
            object.__setattr__(self, f.name, _typed(f, getattr(self, f.name)))
        for side in ("engine", "trainer"):
            object.__setattr__(self, side, parse_spec(getattr(self, side), f"{side} spec", side=side))
        object.__setattr__(self, "remedy_args", dict(self.remedy_args or {}))
        object.__setattr__(self, "betas", _betas(self.betas))
        _check_ranges(self)

    def to_dict(self) -> dict:
        """Plain YAML-ready values: what config.yaml holds (specs in their short dict form)."""
        d = {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if not (f.name in _WRITTEN_OFF_DEFAULT and getattr(self, f.name) == f.default)
        }
        d.update(
            engine=self.engine.to_dict(),
            trainer=self.trainer.to_dict(),
            betas=list(self.betas),
            remedy_args=dict(self.remedy_args),
        )
        return d


_WRITTEN_OFF_DEFAULT = ("replica", "clip_ratio_c")
"""Keys newer than committed results: in config.yaml only when set, so a run without them writes the same
config (and grid fingerprint) as before they existed, and older run directories still resume and merge."""


# key -> (check, valid range) for the float keys whose bad values would train silently wrong
# (grad_clip <= 0 flips or zeroes every gradient, negative eps inverts the PPO clip range).
_FLOAT_RANGES = {
    "lr": (lambda x: 0 <= x < math.inf, "a finite number >= 0"),
    "weight_decay": (lambda x: 0 <= x < math.inf, "a finite number >= 0"),
    "grad_clip": (lambda x: x > 0, "a number > 0 (inf = no clipping)"),
    "eps_low": (lambda x: x is None or 0 <= x < math.inf, "None or a finite number >= 0"),
    "eps_high": (lambda x: x is None or 0 <= x < math.inf, "None or a finite number >= 0"),
    # c <= 1 would cap A < 0 tokens below their unclipped loss at r = 1 (verl asserts clip_ratio_c > 1.0).
    "clip_ratio_c": (lambda x: x is None or 1 < x < math.inf, "None (dual-clip off) or a finite number > 1, e.g. 3.0"),
    "kl_coef": (lambda x: 0 <= x < math.inf, "a finite number >= 0"),
    # T = 0 (greedy) would give every response of a group the same tokens: GRPO advantages all 0, nothing trains.
    "temperature": (lambda x: 0 < x < math.inf, "a finite number > 0 (greedy rollouts train nothing)"),
}


MAX_SEED = 2**32 - 1
"""Seeds are 0..MAX_SEED: numpy's range, and every seed derived from one fits numba's int64."""


def check_seed(seed, what: str) -> int:
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
        raise ValueError(f"{what}: {seed!r} is out of range; valid: an integer 0..{MAX_SEED}")
    return seed


def _check_ranges(cfg: RunConfig) -> None:
    if cfg.mode not in MODES:
        raise ValueError(f"mode {cfg.mode!r} is invalid; valid: {', '.join(MODES)}")
    check_replica(cfg.replica)
    for name, (ok, valid) in _FLOAT_RANGES.items():
        if not ok(getattr(cfg, name)):
            raise ValueError(f"config key {name!r}: {getattr(cfg, name)!r} is out of range; valid: {valid}")
    check_seed(cfg.seed, "config key 'seed'")
    if cfg.eval_n > MAX_EVAL_N:
        raise ValueError(
            f"config key 'eval_n': {cfg.eval_n} is out of range; valid: 1..{MAX_EVAL_N} "
            "(and at most the task's eval set size)"
        )
    for name in (
        "steps",
        "prompts_per_step",
        "group_size",
        "mini_batches",
        "epochs",
        "eval_every",
        "eval_n",
        "checkpoint_every",
        "threads",
    ):
        minimum = 0 if name == "steps" else 1
        if getattr(cfg, name) < minimum:
            raise ValueError(f"{name} must be >= {minimum}, got {getattr(cfg, name)}")
    if (cfg.prompts_per_step * cfg.group_size) % cfg.mini_batches:
        raise ValueError(
            f"prompts_per_step*group_size={cfg.prompts_per_step * cfg.group_size} "
            f"is not divisible by mini_batches={cfg.mini_batches}"
        )


def _betas(value) -> tuple[float, float]:
    bad = ValueError(
        f"config key 'betas': {value!r} is invalid; valid: a list of two numbers in [0, 1), e.g. [0.9, 0.99]"
    )
    if not isinstance(value, (list, tuple)) or len(value) != 2:
        raise bad
    try:
        betas = tuple(float(b) for b in value if not isinstance(b, bool))
    except (TypeError, ValueError):
        raise bad from None
    if len(betas) != 2 or not all(0 <= b < 1 for b in betas):
        raise bad
    return betas


@dataclass(frozen=True)
class Loaded:
    """A RunConfig with everything it names loaded and checked: what `run` consumes.

    Its own fields have names no config key has, and every other attribute read falls
    through to `config`, so a Loaded reads like the RunConfig it was loaded from
    (`loaded.steps`, `loaded.task`, `loaded.to_dict()`).
    """

    config: RunConfig
    task_impl: Any
    """The task object (`timbench.tasks.Task`) named by config.task."""
    algo: Any
    """The `timbench.rl.algorithms.Algorithm` named by config.algorithm."""
    remedy_impl: Any
    """The `timbench.remedies.Remedy` instance named by config.remedy (loaded once per run)."""
    main_engine: Spec
    """The main lane's engine spec: config.engine with the remedy's engine_override applied."""
    main_trainer: Spec
    """The main lane's trainer spec: config.trainer with the remedy's trainer_override (and
    trainer_follows_engine keys) applied."""
    eval_problems: list
    """The first eval_n problems of the task's eval set."""

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.config, name)

    def to_dict(self) -> dict:
        return self.config.to_dict()


def load(cfg: RunConfig | Loaded) -> Loaded:
    """The one step that loads the task, algorithm and remedy a config names (a Loaded passes through)."""
    if isinstance(cfg, Loaded):
        return cfg
    task = get_task(cfg.task)
    algorithm = get_algorithm(cfg.algorithm)
    if cfg.clip_ratio_c is not None and not algorithm.dual_clip:
        valid = ", ".join(n for n, a in ALGORITHMS.items() if a.dual_clip)
        raise ValueError(
            f"config key 'clip_ratio_c': algorithm {cfg.algorithm} has no dual-clip (verl's "
            f"{cfg.algorithm} loss has none); valid with: {valid}"
        )
    remedy = load_remedy(cfg.remedy, cfg.remedy_args)
    if remedy.mode is not None and remedy.mode != cfg.mode:  # e.g. a verl bypass_mode preset (remedies/verl.py)
        raise ValueError(
            f"remedy {cfg.remedy!r} implies mode={remedy.mode} (verl bypass_mode="
            f"{remedy.mode == 'bypass'}), but the config says mode={cfg.mode}; set mode: {remedy.mode}"
        )
    # The coerced remedy overrides are kept so config.yaml (and the resume check) sees one canonical form.
    cfg = dataclasses.replace(cfg, remedy_args=remedy.args)
    engine = cfg.engine.override(remedy.engine_override, f"remedy {cfg.remedy!r} engine_override", "engine")
    trainer = cfg.trainer.override(remedy.trainer_override, f"remedy {cfg.remedy!r} trainer_override", "trainer")
    follow = {k: str(getattr(engine, k)) for k in remedy.trainer_follows_engine}
    trainer = trainer.override(follow, f"remedy {cfg.remedy!r} trainer_follows_engine", "trainer")
    remedy.check_engine(engine)
    return Loaded(cfg, task, algorithm, remedy, engine, trainer, _eval_problems(task, cfg.eval_n))


def _eval_problems(task, n: int) -> list:
    try:
        problems = task.eval_set(n)
    except ValueError:  # a generator that ran out of distinct problems
        problems = []
    if len(problems) < n:
        have = f"{len(problems)} problems" if problems else "fewer problems"
        raise ValueError(
            f"config key 'eval_n': {n} is more than task {task.name}'s eval set holds ({have}); "
            "valid: 1 up to that size"
        )
    return problems


_INF_MEANS_OFF = ("grad_clip",)
"""Float keys whose infinite value is meaningful (grad_clip=inf: no clipping); every other float is finite."""


def _typed(f: dataclasses.Field, value):
    """Coerce a YAML / --set value to the field's type (YAML reads 1e-3 as a string): `timbench.util.coerce`."""
    kind = field_kind(f)
    if kind.split("|")[0].strip() not in ("bool", "int", "float"):
        return value  # strings, specs, lists and mappings are checked where they are parsed
    if f.name in _INF_MEANS_OFF and str(value).lower().lstrip("+.") in ("inf", "infinity"):
        return math.inf
    try:
        return coerce(value, kind)
    except ValueError:
        raise ValueError(f"config key {f.name!r}: {value!r} is not a valid {kind}") from None


_FIELDS = {f.name: f for f in dataclasses.fields(RunConfig)}


def _coerce(raw: str, key: str = "KEY"):
    """Parse a --set value with YAML rules (numbers, bools, lists); a malformed one is a one-line ValueError."""
    if raw == "":
        return ""
    try:
        return yaml.safe_load(raw)
    except yaml.YAMLError as e:
        problem = getattr(e, "problem", None) or type(e).__name__
        raise ValueError(
            f"--set {key}={raw!r}: not a YAML value ({problem}); quote it or give e.g. 3, 1e-3, true, [0.9, 0.99]"
        ) from None


def apply_overrides(d: dict, overrides: list[str]) -> dict:
    """Apply `key=value` / `engine.kernels=torch` overrides to a raw config dict."""
    d = {k: (dict(v) if isinstance(v, dict) else v) for k, v in d.items()}
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep:
            raise ValueError(f"--set {item!r} is not KEY=VALUE")
        top, _, sub = key.partition(".")
        if top not in _FIELDS:
            raise ValueError(f"--set: unknown config key {top!r}; valid: {', '.join(_FIELDS)}")
        if sub:
            if top not in ("engine", "trainer", "remedy_args"):
                raise ValueError(f"--set: {top!r} has no sub-keys (only engine.*, trainer.* and remedy_args.* do)")
            base = d.get(top) or {}
            if top == "remedy_args":
                if not isinstance(base, dict):
                    raise ValueError(f"remedy_args must be a mapping of parameter names to values, got {base!r}")
                base = dict(base)
                base[sub] = _coerce(raw, key)
            else:
                base = dict(base) if isinstance(base, dict) else parse_spec(base, f"{top} spec", side=top).to_dict()
                base[sub] = raw
            d[top] = base
        else:
            # Specs and remedy names stay raw strings (YAML would read `a:b` or `x=1` its own way).
            d[top] = raw if top in ("engine", "trainer", "remedy") else _coerce(raw, key)
    return d


def parse_config(d: dict, source: str = "config") -> RunConfig:
    """A raw config mapping -> RunConfig (values parsed, nothing loaded)."""
    unknown = sorted(set(d) - set(_FIELDS))
    if unknown:
        raise ValueError(f"{source}: unknown config key(s) {unknown}; valid: {', '.join(_FIELDS)}")
    try:
        return RunConfig(**d)
    except TypeError as e:
        raise ValueError(f"{source}: {e}") from None


def from_dict(d: dict, source: str = "config") -> Loaded:
    """A raw config mapping (a grid cell's, say) parsed and loaded: ready for `run`."""
    return load(parse_config(d, source))


def load_config(path: str | Path | None, overrides: list[str] = ()) -> Loaded:
    """Read a YAML config, apply `--set` overrides, parse and load it: the whole edge, once."""
    d = {}
    if path is not None:
        p = Path(path)
        d = read_yaml(p, "config file") or {}
        if not isinstance(d, dict):
            raise ValueError(f"{p}: a run config is a mapping of keys to values")
    return from_dict(apply_overrides(d, list(overrides)), str(path or "config"))
