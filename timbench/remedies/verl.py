"""verl's rollout correction by its own names: `remedy: verl` (structured, verl's keys) and `verl:<preset>`.

verl configures the correction in `RolloutCorrectionConfig` (verl/trainer/config/algorithm.py) and applies it
in `compute_rollout_correction_and_rejection_mask` (verl/trainer/ppo/rollout_corr_helper.py); the keys and
presets are restated in shared/reference/tim-literature.md ("verl and TRL vocabularies"). What each key does
here, with log r_t = log pi_old - log mu (timbench.metrics.ratios):

- `rollout_is` token | sequence | null: IS weights w_t = exp(clamp(log r_t, +-20)) (token) or
  w_i = exp(clamp(sum_t log r_t, +-20)) on every token of sequence i (sequence: verl clamps the RAW sum of
  unclamped per-token log-ratios, not a sum of clamped ones: ratios.seq_log_ratio(ratios.delta(...))).
- `rollout_is_threshold`: a float C (TIS: w = min(w, C)) or "lower_upper" (IcePop: w = 0 outside
  [lower, upper]; the token stays in the loss with weight 0, as verl, rather than being masked).
- `rollout_is_batch_normalize`: divide the weights by their batch mean (token: over masked-in tokens;
  sequence: over sequences' mean weights) when that mean is > 1e-8.
- `rollout_rs`: comma-chained criteria, all must pass (a failing token or sequence is masked):
  token_k1|k2|k3, seq_sum_k1..k3, seq_mean_k1..k3, seq_max_k2|k3 of the per-token divergences of the clamped
  log-ratio (k1 = -log r, k2 = 0.5 (log r)^2, k3 = r - 1 - log r: timbench.metrics.ratios). `rollout_rs_threshold`
  gives one threshold per criterion (comma-separated) or one shared: k1 criteria take ratio bounds
  "lower_upper" (a lone float U means 1/U_U) and keep log(lower) <= k1-statistic <= log(upper), as verl;
  k2/k3 criteria take an upper bound (kept when <= it).
- `bypass_mode`: true -> timbench mode bypass (pi_old = mu), false -> recompute (verl's "decoupled" mode,
  three policies); a config whose `mode` differs is refused. `loss_type` (ppo_clip | reinforce) is recorded;
  timbench's loss stays the config's `algorithm` (bypass_pg_* presets run PPO-clip's ratio, not REINFORCE).

Thresholds are inclusive on the kept side, as verl's `<=` / `>=`. Metrics: the shared set (base.finish) plus
verl's per-criterion `rollout_corr/rollout_rs_<criterion>_masked_fraction` / `_seq_masked_fraction`,
`rollout_corr/rollout_is_ratio_fraction_low`, `rollout_is_oob_ratio` (IcePop) and
`rollout_is_batch_norm_factor`.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch

from ..kernels.pointwise import fexp
from ..kernels.reduce import fmean
from ..metrics import ratios
from .base import Remedy, RemedyBatch, finish, log_rho, param

IS_LEVELS = ("token", "sequence")
LOSS_TYPES = ("ppo_clip", "reinforce")
_DIVERGENCE = {"k1": ratios.k1, "k2": ratios.k2, "k3": ratios.k3}
_REDUCE = {"sum": ratios.seq_sum, "mean": ratios.seq_mean, "max": ratios.seq_max}
RS_OPTIONS = (
    ("token_k1", "token_k2", "token_k3")
    + tuple(f"seq_{r}_k{k}" for r in ("sum", "mean") for k in (1, 2, 3))
    + ("seq_max_k2", "seq_max_k3")
)
"""verl's SUPPORTED_ROLLOUT_RS_OPTIONS, in verl's order."""


def _positive_float(text: str, what: str) -> float:
    try:
        x = float(text)
    except ValueError:
        raise ValueError(f"{what}: {text!r} is not a number") from None
    if not (x > 0 and math.isfinite(x)):
        raise ValueError(f"{what}: {text!r} must be a finite number > 0")
    return x


def parse_is_threshold(spec: str) -> tuple[float, float | None]:
    """rollout_is_threshold -> (upper, lower or None): "2.0" is a TIS cap, "0.5_5.0" IcePop bounds."""
    text = str(spec).strip()
    lo_text, sep, hi_text = text.partition("_")
    if not sep:
        return _positive_float(text, "rollout_is_threshold"), None
    lo, hi = (_positive_float(t, "rollout_is_threshold") for t in (lo_text, hi_text))
    if lo > hi:
        raise ValueError(f"rollout_is_threshold {spec!r}: lower bound must be <= upper bound")
    return hi, lo


def parse_rs(rollout_rs: str, threshold: str | None) -> list[tuple[str, float | None, float]]:
    """rollout_rs + rollout_rs_threshold -> [(criterion, lower or None, upper)], verl's parsing rules."""
    options = list(dict.fromkeys(o.strip() for o in str(rollout_rs).split(",") if o.strip()))
    if not options:
        raise ValueError("rollout_rs is empty; valid criteria: " + ", ".join(RS_OPTIONS))
    bad = [o for o in options if o not in RS_OPTIONS]
    if bad:
        raise ValueError(f"rollout_rs criterion {bad[0]!r} is invalid; valid: {', '.join(RS_OPTIONS)}")
    if threshold is None:
        raise ValueError(f"rollout_rs={rollout_rs!r} needs rollout_rs_threshold (one per criterion, or one shared)")
    specs = [t.strip() for t in str(threshold).split(",") if t.strip()]
    if len(specs) not in (1, len(options)):
        raise ValueError(
            f"rollout_rs_threshold {threshold!r} gives {len(specs)} thresholds for {len(options)} "
            "criteria; give one shared or one per criterion"
        )
    specs = specs * len(options) if len(specs) == 1 else specs
    out = []
    for opt, spec in zip(options, specs):
        if opt.endswith("k1"):
            lo_text, sep, hi_text = spec.partition("_")
            hi = _positive_float(hi_text if sep else spec, f"rollout_rs_threshold for {opt}")
            lo = _positive_float(lo_text, f"rollout_rs_threshold for {opt}") if sep else 1.0 / hi
            if lo > hi:
                raise ValueError(f"rollout_rs_threshold {spec!r} for {opt}: lower bound must be <= upper bound")
            out.append((opt, lo, hi))
        else:
            if "_" in spec:
                raise ValueError(f"rollout_rs_threshold {spec!r} for {opt}: k2/k3 criteria take one upper bound")
            out.append((opt, None, _positive_float(spec, f"rollout_rs_threshold for {opt}")))
    return out


def rs_keep(criterion: str, lower: float | None, upper: float, lr: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[N, T] bool: tokens that pass one verl rollout_rs criterion on the clamped log-ratio `lr`."""
    level, _, k = criterion.rpartition("_")
    stat = _DIVERGENCE[k](lr)
    if level != "token":
        stat = ratios.per_token(_REDUCE[level.removeprefix("seq_")](stat, mask), mask)
    if lower is None:
        return stat <= upper
    return (stat >= math.log(lower)) & (stat <= math.log(upper))


def _fraction(flags: torch.Tensor, over: torch.Tensor) -> float:
    return float(flags[over].double().sum()) / int(over.sum()) if bool(over.any()) else 0.0


@dataclass(frozen=True)
class VerlParams:
    rollout_is: str | None = param("sequence", "IS weight level: token | sequence | null (verl's default sequence)")
    rollout_is_threshold: str = param("2.0", "IS cap C (TIS), or 'lower_upper' bounds (IcePop: weight 0 outside)")
    rollout_is_batch_normalize: bool = param(False, "normalize the IS weights to batch mean 1")
    rollout_rs: str | None = param(None, "comma-chained rejection criteria (token_k1, seq_mean_k3, ...) or null")
    rollout_rs_threshold: str | None = param(None, "one threshold per criterion (k1: 'lower_upper'), or one shared")
    bypass_mode: bool = param(False, "true: timbench mode bypass; false: recompute (verl's decoupled mode)")
    loss_type: str = param(
        "ppo_clip", "verl's bypass loss (ppo_clip | reinforce); recorded, timbench keeps the config's algorithm"
    )

    def __post_init__(self):
        is_level = None if self.rollout_is in (None, "null", "none", "None") else self.rollout_is
        object.__setattr__(self, "rollout_is", is_level)
        if is_level is not None and is_level not in IS_LEVELS:
            raise ValueError(f"rollout_is {is_level!r} is invalid; valid: token, sequence, null")
        parse_is_threshold(self.rollout_is_threshold)
        if self.rollout_rs not in (None, "null", "none", "None"):
            parse_rs(self.rollout_rs, self.rollout_rs_threshold)
        else:
            object.__setattr__(self, "rollout_rs", None)
        if self.loss_type not in LOSS_TYPES:
            raise ValueError(f"loss_type {self.loss_type!r} is invalid; valid: {', '.join(LOSS_TYPES)}")


class Verl(Remedy):
    name = "verl"
    doc = (
        "verl's rollout correction with verl's own keys (rollout_is, rollout_is_threshold, "
        "rollout_is_batch_normalize, rollout_rs chains, rollout_rs_threshold, bypass_mode); defaults as verl's "
        "RolloutCorrectionConfig (sequence-level TIS at 2.0). See timbench/remedies/verl.py."
    )
    Params = VerlParams

    def __init__(self, **args):
        super().__init__(**args)
        self.mode = "bypass" if self.params.bypass_mode else "recompute"

    def __call__(self, batch: RemedyBatch):
        p, mask = self.params, batch.mask
        lr = log_rho(batch)  # per-token clamped at +-20 (verl's log_ratio_safe)
        extra: dict[str, float] = {}
        weights = truncated = None
        if p.rollout_is is not None:
            weights, truncated = self._weights(batch, lr, extra)
        keep = torch.ones_like(mask)
        rows = mask.any(-1)
        for crit, lower, upper in parse_rs(p.rollout_rs, p.rollout_rs_threshold) if p.rollout_rs else []:
            ok = rs_keep(crit, lower, upper, lr, mask)
            extra[f"rollout_corr/rollout_rs_{crit}_masked_fraction"] = _fraction(~ok, mask)
            extra[f"rollout_corr/rollout_rs_{crit}_seq_masked_fraction"] = _fraction((~ok & mask).any(-1), rows)
            keep = keep & ok
        return finish(batch, weights=weights, keep=keep, truncated=truncated, extra=extra)

    def _weights(self, batch: RemedyBatch, lr: torch.Tensor, extra: dict) -> tuple[torch.Tensor, torch.Tensor]:
        p, mask = self.params, batch.mask
        upper, lower = parse_is_threshold(p.rollout_is_threshold)
        if p.rollout_is == "token":
            log_w = lr
        else:  # the raw sum of unclamped log-ratios, clamped once (verl's log_ratio_sum_safe)
            log_w = ratios.per_token(
                ratios.seq_log_ratio(ratios.delta(batch.old_logprobs, batch.rollout_logprobs, mask), mask), mask
            )
        raw = torch.where(mask, fexp(log_w), torch.zeros((), dtype=torch.float64))
        high = raw > upper
        low = raw < (1.0 / upper if lower is None else lower)
        extra["rollout_corr/rollout_is_ratio_fraction_low"] = _fraction(low, mask)
        if lower is None:
            w = raw.clamp(max=upper)
        else:
            w = torch.where(high | (raw < lower), torch.zeros((), dtype=torch.float64), raw)
            extra["rollout_corr/rollout_is_oob_ratio"] = _fraction(high | (raw < lower), mask)
        if p.rollout_is_batch_normalize:
            if p.rollout_is == "token":
                norm = float(ratios.masked_mean(w, mask))
            else:
                rows = mask.any(-1)
                norm = float(fmean(ratios.seq_mean(w, mask)[rows])) if bool(rows.any()) else 0.0
            factor = norm if norm > 1e-8 else 1.0
            w = w / factor
            extra["rollout_corr/rollout_is_batch_norm_factor"] = factor
        return w, high


VERL_PRESETS: dict[str, dict] = {
    "decoupled_token_is": {"rollout_is": "token", "rollout_is_threshold": "2.0"},
    "decoupled_seq_is": {"rollout_is": "sequence", "rollout_is_threshold": "2.0"},
    "decoupled_token_icepop": {"rollout_is": "token", "rollout_is_threshold": "0.5_5.0"},
    "decoupled_seq_is_rs": {
        "rollout_is": "sequence",
        "rollout_is_threshold": "2.0",
        "rollout_rs": "seq_sum_k1",
        "rollout_rs_threshold": "0.5_2.0",
    },
    "decoupled_geo_rs": {"rollout_is": None, "rollout_rs": "seq_mean_k1", "rollout_rs_threshold": "0.999_1.001"},
    "decoupled_geo_rs_seq_tis": {
        "rollout_is": "sequence",
        "rollout_rs": "seq_mean_k1",
        "rollout_rs_threshold": "0.999_1.001",
    },
    "decoupled_geo_rs_token_tis": {
        "rollout_is": "token",
        "rollout_rs": "seq_mean_k1",
        "rollout_rs_threshold": "0.999_1.001",
    },
    "decoupled_k3_rs": {"rollout_is": None, "rollout_rs": "seq_mean_k3", "rollout_rs_threshold": "0.01"},
    "decoupled_k3_rs_seq_tis": {"rollout_is": "sequence", "rollout_rs": "seq_mean_k3", "rollout_rs_threshold": "0.01"},
    "decoupled_k3_rs_token_tis": {"rollout_is": "token", "rollout_rs": "seq_mean_k3", "rollout_rs_threshold": "0.01"},
    "bypass_ppo_clip": {"rollout_is": None, "bypass_mode": True},
    "bypass_ppo_clip_geo_rs": {
        "rollout_is": None,
        "rollout_rs": "seq_mean_k1",
        "rollout_rs_threshold": "0.999_1.001",
        "bypass_mode": True,
    },
    "bypass_ppo_clip_k3_rs": {
        "rollout_is": None,
        "rollout_rs": "seq_mean_k3",
        "rollout_rs_threshold": "0.01",
        "bypass_mode": True,
    },
    "bypass_pg_is": {"rollout_is": "sequence", "bypass_mode": True, "loss_type": "reinforce"},
    "bypass_pg_token_icepop": {
        "rollout_is": "token",
        "rollout_is_threshold": "0.5_5.0",
        "bypass_mode": True,
        "loss_type": "reinforce",
    },
    "bypass_pg_geo_rs": {
        "rollout_is": None,
        "rollout_rs": "seq_mean_k1",
        "rollout_rs_threshold": "0.999_1.001",
        "bypass_mode": True,
        "loss_type": "reinforce",
    },
    "bypass_pg_geo_rs_seq_tis": {
        "rollout_is": "sequence",
        "rollout_rs": "seq_mean_k1",
        "rollout_rs_threshold": "0.999_1.001",
        "bypass_mode": True,
        "loss_type": "reinforce",
    },
    "bypass_pg_geo_rs_token_tis": {
        "rollout_is": "token",
        "rollout_rs": "seq_mean_k1",
        "rollout_rs_threshold": "0.999_1.001",
        "bypass_mode": True,
        "loss_type": "reinforce",
    },
    "disabled": {"rollout_is": None},
}
"""verl's RolloutCorrectionConfig class-method presets (verl names, verl defaults); unset keys keep VerlParams'."""


def _preset_params(name: str, values: dict) -> type:
    fields = [
        (f.name, f.type, dataclasses.field(default=values.get(f.name, f.default), metadata=f.metadata))
        for f in dataclasses.fields(VerlParams)
    ]
    return dataclasses.make_dataclass(
        f"VerlParams_{name}", fields, frozen=True, namespace={"__post_init__": VerlParams.__post_init__}
    )


def _preset_doc(values: dict) -> str:
    keys = {**{f.name: f.default for f in dataclasses.fields(VerlParams)}, **values}
    parts = [f"rollout_is={keys['rollout_is']}"]
    if keys["rollout_is"]:
        parts.append(f"rollout_is_threshold={keys['rollout_is_threshold']}")
    if keys["rollout_rs"]:
        parts.append(f"rollout_rs={keys['rollout_rs']}@{keys['rollout_rs_threshold']}")
    parts.append(f"bypass_mode={keys['bypass_mode']}")
    if keys["bypass_mode"]:
        parts.append(f"loss_type={keys['loss_type']} (timbench keeps the config's algorithm)")
    return "verl preset: " + ", ".join(parts) + "."


VERL_REMEDIES: dict[str, type[Remedy]] = {
    f"verl:{name}": type(
        f"Verl_{name}",
        (Verl,),
        {
            "name": f"verl:{name}",
            "doc": _preset_doc(values),
            "Params": _preset_params(name, values),
            "__module__": __name__,
        },
    )
    for name, values in VERL_PRESETS.items()
}
"""`verl:<preset>` -> a Verl subclass whose parameter defaults are the preset's."""
