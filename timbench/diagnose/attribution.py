"""Per-side attribution of the engine-trainer gap against the float64 reference (pure functions).

Per token: e_engine = lp_engine - lp_ref, e_trainer = lp_trainer - lp_ref and
gap = lp_engine - lp_trainer = e_engine - e_trainer. Hence
gap_rms^2 = e_engine_rms^2 + e_trainer_rms^2 - 2 E[e_engine e_trainer]: the
quadrature model (gap^2 ~ e_engine^2 + e_trainer^2) holds exactly when the two
sides' errors are uncorrelated; fully correlated same-sign errors cancel
(gap_rms ~ |e_engine_rms - e_trainer_rms|, the "same-sign" linear model),
opposite-sign ones add (gap_rms ~ e_engine_rms + e_trainer_rms). `attribute`
reports all three and which fits best. `key_groups` / `key_shares` split a
side's error over the spec keys that differ from the reference, one key at a
time, for whatever keys `timbench.spec.keys` defines. Sums use `kernels.reduce`.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from ..kernels.reduce import fmean
from ..spec.keys import Spec, SpecError


def _ms(x: torch.Tensor) -> float:
    return float(fmean(x * x)) if x.numel() else 0.0


def side_stats(x: torch.Tensor) -> dict:
    """mean |x|, rms, max |x| of a float64 per-token error."""
    return {
        "mean_abs": float(fmean(x.abs())) if x.numel() else 0.0,
        "rms": math.sqrt(_ms(x)),
        "max_abs": float(x.abs().max()) if x.numel() else 0.0,
    }


def errors(lp_engine, lp_trainer, lp_ref) -> dict[str, torch.Tensor]:
    """The three per-token float64 differences."""
    e, t, r = lp_engine.double(), lp_trainer.double(), lp_ref.double()
    return {"e_engine": e - r, "e_trainer": t - r, "gap": e - t}


def attribute(lp_engine: torch.Tensor, lp_trainer: torch.Tensor, lp_ref: torch.Tensor) -> dict:
    """Side errors, gap and how well the quadrature / linear models explain the gap."""
    d = errors(lp_engine, lp_trainer, lp_ref)
    out = {k: side_stats(v) for k, v in d.items()}
    ms_e, ms_t, ms_g = _ms(d["e_engine"]), _ms(d["e_trainer"]), _ms(d["gap"])
    re_, rt, rg = math.sqrt(ms_e), math.sqrt(ms_t), math.sqrt(ms_g)
    # Uncentred correlation: the cross term of gap^2 = e^2 + t^2 - 2et, in units of rms_e * rms_t.
    out["correlation"] = float(fmean(d["e_engine"] * d["e_trainer"])) / (re_ * rt) if re_ > 0 and rt > 0 else None
    preds = {"quadrature": math.sqrt(ms_e + ms_t), "same_sign": abs(re_ - rt), "opposite_sign": re_ + rt}
    models = {}
    for name, p in preds.items():
        models[name] = {"predicted_gap_rms": p, "ratio": rg / p if p > 0 else (1.0 if rg == 0 else None)}
    out["models"] = models
    # gap_rms^2 / (e_engine_rms^2 + e_trainer_rms^2): 1 when the quadrature model holds.
    out["quadrature_ratio"] = ms_g / (ms_e + ms_t) if ms_e + ms_t > 0 else None
    # The closest model, if any is within a factor 2 of the measured gap (else neither explains it:
    # the sides' errors are partly correlated, see `correlation`). An exactly zero gap fits same_sign only.
    fits = {k: abs(math.log(m["ratio"])) for k, m in models.items() if m["ratio"] not in (None, 0.0)}
    best = min(fits, key=fits.get) if fits else None
    out["best_model"] = best if best is not None and fits[best] <= math.log(2.0) else None
    return out


def changed_keys(spec: Spec) -> list[tuple[str, object]]:
    """(key, value) of every Spec field that differs from the reference default, in field order."""
    return [(f.name, getattr(spec, f.name)) for f in dataclasses.fields(spec) if getattr(spec, f.name) != f.default]


def key_groups(spec: Spec, side: str) -> list[tuple[str, Spec]]:
    """One spec per changed key: the reference with only that key set.

    A key that is invalid alone (tp_reduce needs tp > 1) joins the group before it,
    so groups follow the spec's own validity rules with no per-key code here.
    """
    groups: list[tuple[list[str], dict]] = []
    for name, value in changed_keys(spec):
        try:
            Spec().override({name: value}, f"{side} key {name}", side)
            groups.append(([name], {name: value}))
        except SpecError:
            if not groups:
                raise
            groups[-1][0].append(name)
            groups[-1][1][name] = value
    out = []
    for names, changes in groups:
        s = Spec().override(changes, f"{side} keys {names}", side)
        out.append((",".join(f"{k}={s.to_dict()[k]}" for k in names), s))
    return out


def key_shares(base_ms: float, entries: list[dict]) -> list[dict]:
    """Each key's share of the error it adds over the fp32 exact floor.

    entries: {"side", "key", "ms"} with ms the mean-square error vs the reference of the
    spec with only that key. excess = ms - base_ms (the fp32 exact spec's own error);
    share = excess / sum of excesses (the quadrature bookkeeping: independent sources add
    in mean square).
    """
    exc = [max(e["ms"] - base_ms, 0.0) for e in entries]
    total = sum(exc)
    # gap_share: the same over keys set on one side only; a key both sides share (same value)
    # adds error to both and largely cancels in the gap, so it gets none.
    own = sum(x for e, x in zip(entries, exc) if not e.get("shared"))
    return [
        {
            **{k: v for k, v in e.items() if k != "ms"},
            "rms": math.sqrt(e["ms"]),
            "excess_ms": x,
            "share": x / total if total > 0 else None,
            "gap_share": None if e.get("shared") else (x / own if own > 0 else None),
        }
        for e, x in zip(entries, exc)
    ]
