"""Run configuration: one dataclass, loaded from YAML, overridden with dotted `--set key=value`.

Every field is documented; unknown keys and bad values are one-line errors
naming the key and what is valid. The resolved config is written beside the
results, so a run directory says exactly what produced it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from ..spec import parse_spec
from ..readfile import read_yaml

MODES = ("recompute", "bypass")


@dataclass
class RunConfig:
    """One RL run: task + warm start + algorithm + engine/trainer specs + handling mode + seed + budget."""

    task: str = "add-4d-v1"
    """Registered task name (see `timbench tasks list`)."""
    model: str = "default"
    """Warm-start checkpoint directory, or `default` for the shipped checkpoint of (task, preset)."""
    preset: str = "tiny-dense"
    """Model preset of the default checkpoint (tiny-dense | tiny-moe)."""
    algorithm: str = "grpo"
    """RL algorithm (grpo, dapo, drgrpo, rloo, reinforce, reinforce_pp, gspo)."""
    mode: str = "recompute"
    """recompute: pi_old = trainer's recomputed logprobs; bypass: pi_old = engine's logprobs (paper Eq. 4)."""
    engine: dict = field(default_factory=lambda: {"kernels": "exact", "dtype": "fp32"})
    """Engine spec (keys as in `timbench align --engine`)."""
    trainer: dict = field(default_factory=lambda: {"kernels": "exact", "dtype": "fp32"})
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
    """AdamW learning rate."""
    betas: tuple = (0.9, 0.99)
    """AdamW betas."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    grad_clip: float = 1.0
    """Max global grad norm (the logged norm is taken before clipping)."""
    temperature: float = 1.0
    """Sampling temperature of rollouts (the trainer scores the same tempered distribution)."""
    eps_low: float | None = None
    """PPO lower clip; None = the algorithm's default."""
    eps_high: float | None = None
    """PPO upper clip; None = the algorithm's default."""
    kl_coef: float = 0.0
    """Weight of a KL(pi_theta || pi_ref) penalty to the warm start (0 = off, the GRPO/DAPO default here)."""
    kl_kind: str = "low_var_kl"
    """KL estimator for the penalty: k1, abs, mse (k2) or low_var_kl (k3)."""
    eval_every: int = 10
    """Evaluate every k steps (and at step 0 and the end)."""
    eval_n: int = 256
    """Eval problems (from the task's fixed eval set)."""
    checkpoint_every: int = 25
    """Save a resumable checkpoint every k steps."""
    twin: bool = False
    """Run a zero-mismatch twin (exact/exact fp32, same everything else) in lockstep."""
    threads: int = 1
    """Torch and numba threads for this run (two runs in parallel use both cores)."""

    def __post_init__(self):
        for f in dataclasses.fields(self):
            setattr(self, f.name, _typed(f, getattr(self, f.name)))
        from ..tasks import get_task
        from .algorithms import get_algorithm
        get_task(self.task)
        get_algorithm(self.algorithm)
        if self.mode not in MODES:
            raise ValueError(f"mode {self.mode!r} is invalid; valid: {', '.join(MODES)}")
        self.engine = _spec_dict(self.engine, "engine")
        self.trainer = _spec_dict(self.trainer, "trainer")
        from ..remedies import load_remedy
        if self.remedy_args is None:
            self.remedy_args = {}
        # Loading the remedy here makes a bad name, file or parameter fail before any work; the
        # coerced overrides are kept so config.yaml (and the resume check) sees one canonical form.
        self.remedy_args = load_remedy(self.remedy, self.remedy_args).args
        self.betas = tuple(float(b) for b in self.betas)
        for name in ("steps", "prompts_per_step", "group_size", "mini_batches", "epochs", "eval_every",
                     "eval_n", "checkpoint_every", "threads"):
            minimum = 0 if name == "steps" else 1
            if getattr(self, name) < minimum:
                raise ValueError(f"{name} must be >= {minimum}, got {getattr(self, name)}")
        if (self.prompts_per_step * self.group_size) % self.mini_batches:
            raise ValueError(f"prompts_per_step*group_size={self.prompts_per_step * self.group_size} "
                             f"is not divisible by mini_batches={self.mini_batches}")

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["betas"] = list(self.betas)
        return d


_BOOLS = {"true": True, "false": False, "1": True, "0": False, "yes": True, "no": False}


def _typed(f: dataclasses.Field, value):
    """Coerce a YAML / --set value to the field's type (YAML reads 1e-3 as a string)."""
    kind = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
    try:
        if kind == "bool" and not isinstance(value, bool):
            return _BOOLS[str(value).lower()]
        if kind == "int" and not isinstance(value, bool):
            if float(value) != int(float(value)):
                raise ValueError
            return int(float(value))
        if kind.startswith("float"):
            if kind.endswith("None") and value in (None, "None", "null"):
                return None
            return float(value)
    except (ValueError, TypeError, KeyError):
        raise ValueError(f"config key {f.name!r}: {value!r} is not a valid {kind}") from None
    return value


def _spec_dict(value, what: str) -> dict:
    return parse_spec(value, f"{what} spec", side=what).to_dict()


_FIELDS = {f.name: f for f in dataclasses.fields(RunConfig)}


def _coerce(raw: str):
    """Parse a --set value with YAML rules (numbers, bools, lists)."""
    return yaml.safe_load(raw) if raw != "" else ""


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
            base = d.get(top) or _FIELDS[top].default_factory()
            if top == "remedy_args":
                if not isinstance(base, dict):
                    raise ValueError(f"remedy_args must be a mapping of parameter names to values, got {base!r}")
                base = dict(base)
                base[sub] = _coerce(raw)
            else:
                base = _spec_dict(base, top) if not isinstance(base, dict) else dict(base)
                base[sub] = raw
            d[top] = base
        else:
            # Specs and remedy names stay raw strings (YAML would read `a:b` or `x=1` its own way).
            d[top] = raw if top in ("engine", "trainer", "remedy") else _coerce(raw)
    return d


def from_dict(d: dict, source: str = "config") -> RunConfig:
    unknown = sorted(set(d) - set(_FIELDS))
    if unknown:
        raise ValueError(f"{source}: unknown config key(s) {unknown}; valid: {', '.join(_FIELDS)}")
    try:
        return RunConfig(**d)
    except TypeError as e:
        raise ValueError(f"{source}: {e}") from None


def load_config(path: str | Path | None, overrides: list[str] = ()) -> RunConfig:
    d = {}
    if path is not None:
        p = Path(path)
        d = read_yaml(p, "config file") or {}
        if not isinstance(d, dict):
            raise ValueError(f"{p}: a run config is a mapping of keys to values")
    return from_dict(apply_overrides(d, list(overrides)), str(path or "config"))
