"""Collapse detection: when did an RL run fall apart, and did the KL warn before it did?

Pure functions over a run's logged rows (metrics.jsonl, eval.jsonl, summary.json). The rule,
applied in step order, calls a collapse at the earliest step where one of these holds:

1. reward_drop: the training reward `critic/rewards/mean`, smoothed by a trailing moving average
   over `smooth` steps, falls below (1 - alpha) x its running peak (the peak of the smoothed
   curve up to that step, which must be >= `min_peak`), and does not climb back above that same
   level within the next `window` steps. Near the end of a run, a drop that stays below the level
   to the last step counts if it lasted at least ceil(window / 2) steps (the run ended collapsed);
   a shorter tail is undecided and not called. A dip that recovers inside the window never counts.
2. non_finite: a metrics row whose `actor/loss` or `actor/grad_norm` is NaN/inf, or a run whose
   summary.json says status "failed" with a non-finite error (the loop raises before logging the
   step, so the collapse step is `steps_done`, the first step without a row).
3. grad spike, confirmed: `actor/grad_norm` exceeds `grad_spike` x the median of all earlier
   grad norms (at least 3 of them), AND criterion 1 is met at the spike or within `window` steps
   after it. The collapse is then dated at the spike (the earlier, causal sign) with reason
   reward_drop, and the spike step is reported as `grad_spike_step`. A lone spike whose reward
   holds is not a collapse.

4. accuracy_drop: the clean evaluation accuracy `accuracy_t1` (eval.jsonl; the evaluation engine
   has no mismatch) falls below (1 - alpha) x its running peak (>= `min_peak`) at an eval step and
   stays at or below that level at every later eval, over at least `window` steps to the run's end.
   This catches runs whose *training* reward says nothing: under heavy sampler noise the rollouts are
   garbage from step 0, so the training reward never has a peak to fall from, while the policy the
   trainer is fitting to them degrades (measured: gaussian sigma 2, bypass, eval 0.31 -> 0.06 in 40
   steps with a training reward below 0.04 throughout).

The seed paper (arXiv 2605.14220) finds K1/K3 KL "nearly flat" while reward already falls, so
the KL warning (`rollout_corr/k3_kl` > kl_warn) is reported beside the collapse, never used to
call one: kl_lead_steps = collapse_step - kl_warning_step is negative when the warning came late.
"""

from __future__ import annotations

import dataclasses
import math
import re
import statistics
from dataclasses import dataclass

from ..metrics.schema import ACCURACY_T1, GRAD_NORM, K3_KL, REWARD_MEAN

REWARD = REWARD_MEAN
GRAD = GRAD_NORM
LOSS = "actor/loss"
K3 = K3_KL
_MIN_MEDIAN_HISTORY = 3  # a median of one or two grad norms is too jumpy to call spikes against


@dataclass(frozen=True)
class CollapseRule:
    """Thresholds of the collapse rule (module docstring); a grid spec may override any of them."""

    alpha: float = 0.5
    """Relative drop from the running peak of the smoothed reward that counts: below (1 - alpha) x peak."""
    window: int = 10
    """Steps the reward must stay below that level (or until the run ends) for the drop to count."""
    smooth: int = 5
    """Trailing moving-average width (steps) applied to `critic/rewards/mean` before anything else."""
    grad_spike: float = 10.0
    """A grad-norm spike is `actor/grad_norm` > grad_spike x the running median of earlier steps."""
    min_peak: float = 0.05
    """No collapse is called while the smoothed reward's running peak is below this (nothing to lose)."""
    kl_warn: float = 1e-3
    """`rollout_corr/k3_kl` above this is a KL warning (reported, not used to call a collapse)."""


def rule_from_dict(overrides: dict | None) -> CollapseRule:
    """CollapseRule with `overrides` (e.g. the grid spec's `collapse:` block); unknown keys or bad values raise."""
    overrides = overrides or {}
    if not isinstance(overrides, dict):
        raise ValueError(f"collapse rule: expected a mapping of overrides, got {type(overrides).__name__}")
    fields = {f.name: f for f in dataclasses.fields(CollapseRule)}
    values = {}
    for key, raw in overrides.items():
        if key not in fields:
            raise ValueError(f"collapse rule: unknown key {key!r}; valid: {', '.join(fields)}")
        want = int if key in ("window", "smooth") else float
        if isinstance(raw, bool) or not isinstance(raw, (int, float)) or (want is int and int(raw) != raw):
            raise ValueError(f"collapse rule: {key} must be {want.__name__}, got {raw!r}")
        v = want(raw)
        ok = math.isfinite(v) and (0 < v < 1 if key == "alpha" else v >= (1 if want is int else 0))
        if not ok:
            raise ValueError(
                f"collapse rule: invalid {key}={raw!r}; valid: "
                + ("0 < alpha < 1" if key == "alpha" else "a finite number >= " + ("1" if want is int else "0"))
            )
        values[key] = v
    return CollapseRule(**values)


def moving_average(xs: list[float], width: int) -> list[float]:
    """Trailing mean over the last `width` values (fewer at the start); same length as xs.

    Each mean is an fsum of its own window (not a running sum), so a flat stretch is exactly flat.
    """
    return [math.fsum(xs[max(0, i - width + 1) : i + 1]) / min(i + 1, width) for i in range(len(xs))]


def reward_drop_index(smoothed: list[float], rule: CollapseRule, start: int = 0) -> int | None:
    """First index >= start where criterion 1 holds (a drop below (1-alpha) x running peak that persists)."""
    peak = -math.inf
    for i, s in enumerate(smoothed):
        peak = max(peak, s)
        if i < start or peak < rule.min_peak:
            continue
        level = (1 - rule.alpha) * peak
        after = smoothed[i + 1 : i + 1 + rule.window]
        long_enough = len(after) == rule.window or len(after) + 1 >= math.ceil(rule.window / 2)
        if s < level and long_enough and all(u <= level for u in after):
            return i
    return None


def grad_spike_indices(grads: list[float], rule: CollapseRule) -> list[int]:
    """Indices where a finite grad norm exceeds grad_spike x the median of all earlier finite ones."""
    out, seen = [], []
    for i, g in enumerate(grads):
        if not math.isfinite(g):
            continue
        if len(seen) >= _MIN_MEDIAN_HISTORY and g > rule.grad_spike * statistics.median(seen):
            out.append(i)
        seen.append(g)
    return out


def _column(rows: list[dict], key: str, required: bool) -> list[float]:
    out = []
    for r in rows:
        if key not in r or r[key] is None:
            if required:
                raise ValueError(
                    f"metrics row for step {r.get('step')} has no {key!r}; "
                    f"every metrics.jsonl row needs {REWARD!r} and 'step'"
                )
            out.append(math.nan)
            continue
        try:
            out.append(float(r[key]))
        except (TypeError, ValueError):
            raise ValueError(f"metrics row for step {r.get('step')}: {key}={r[key]!r} is not a number") from None
    return out


def _steps(rows: list[dict]) -> list[int]:
    steps = []
    for r in rows:
        s = r.get("step")
        if isinstance(s, bool) or not isinstance(s, int):
            raise ValueError(f"metrics row without an integer 'step': {str(r)[:80]}")
        if steps and s <= steps[-1]:
            raise ValueError(f"metrics rows out of order: step {s} after step {steps[-1]}; steps must increase")
        steps.append(s)
    return steps


def _non_finite_steps(rows: list[dict]) -> list[int]:
    """Steps whose logged loss or grad norm is NaN/inf (json reads NaN/Infinity as floats)."""
    return [
        r["step"] for r in rows if any(r.get(k) is not None and not math.isfinite(float(r[k])) for k in (GRAD, LOSS))
    ]


def _non_finite_failure(summary: dict | None) -> bool:
    """A failed run whose error is the loop's NonFiniteError ("non-finite loss=nan or grad_norm=inf")."""
    if not summary or summary.get("status") != "failed":
        return False
    return re.search(r"non-finite|\bnan\b|\binf\b", str(summary.get("error") or "").lower()) is not None


def accuracy_drop_step(eval_rows: list[dict], rule: CollapseRule) -> int | None:
    """First eval step where criterion 4 holds (a persistent drop of eval accuracy_t1 below (1-alpha) x peak)."""
    pts = [(int(e["step"]), float(e[ACCURACY_T1])) for e in eval_rows if e.get(ACCURACY_T1) is not None]
    peak = -math.inf
    for i, (step, acc) in enumerate(pts):
        peak = max(peak, acc)
        level = (1 - rule.alpha) * peak
        if (
            peak >= rule.min_peak
            and acc < level
            and pts[-1][0] - step >= rule.window
            and all(a <= level for _, a in pts[i + 1 :])
        ):
            return step
    return None


def _acc(eval_rows: list[dict]) -> tuple[float | None, float | None]:
    accs = [float(e[ACCURACY_T1]) for e in eval_rows if e.get(ACCURACY_T1) is not None]
    return (max(accs), accs[-1]) if accs else (None, None)


def detect_collapse(
    metrics_rows: list[dict],
    eval_rows: list[dict] | None = None,
    summary: dict | None = None,
    rule: CollapseRule = CollapseRule(),
) -> dict:
    """Apply the collapse rule (module docstring) to one run's logged rows.

    Returns collapsed, collapse_step, collapse_reason (reward_drop | accuracy_drop | non_finite | None), grad_spike_step
    (the confirmed spike that dates the collapse, else None), peak_reward / final_reward (max and last of
    the smoothed training reward), peak_accuracy_t1 / final_accuracy_t1 (from eval rows), kl_warning_step
    (first step with k3_kl > kl_warn) and kl_lead_steps (collapse_step - kl_warning_step, or None).
    """
    steps = _steps(metrics_rows)
    rewards = _column(metrics_rows, REWARD, required=True)
    if any(not math.isfinite(x) for x in rewards):
        bad = next(s for s, x in zip(steps, rewards) if not math.isfinite(x))
        raise ValueError(f"metrics row for step {bad}: {REWARD} is not finite; a reward is a mean of verifier scores")
    grads, losses, k3 = (_column(metrics_rows, k, required=False) for k in (GRAD, LOSS, K3))
    smoothed = moving_average(rewards, rule.smooth)

    candidates: list[tuple[int, int, str, int | None]] = []  # (step, priority, reason, spike step)
    drop = reward_drop_index(smoothed, rule)
    if drop is not None:
        candidates.append((steps[drop], 1, "reward_drop", None))
    for i in grad_spike_indices(grads, rule):
        confirmed = reward_drop_index(smoothed, rule, start=i)
        if confirmed is not None and confirmed - i <= rule.window:
            candidates.append((steps[i], 1, "reward_drop", steps[i]))
            break  # later spikes can only date a later collapse
    acc_step = accuracy_drop_step(eval_rows or [], rule)
    if acc_step is not None:
        candidates.append((acc_step, 2, "accuracy_drop", None))
    bad = _non_finite_steps(metrics_rows)
    if bad:
        candidates.append((bad[0], 0, "non_finite", None))
    if _non_finite_failure(summary):
        done = summary.get("steps_done", len(steps))
        candidates.append((int(done) if isinstance(done, int) else len(steps), 0, "non_finite", None))
    # Earliest step wins; at equal steps a non-finite loss outranks the reward, the reward the eval evidence.
    step, _, reason, spike = min(candidates) if candidates else (None, None, None, None)

    kl_step = next((s for s, k in zip(steps, k3) if k == k and k > rule.kl_warn), None)
    peak_acc, final_acc = _acc(eval_rows or [])
    return {
        "collapsed": step is not None,
        "collapse_step": step,
        "collapse_reason": reason,
        "grad_spike_step": spike,
        "peak_reward": max(smoothed) if smoothed else None,
        "final_reward": smoothed[-1] if smoothed else None,
        "peak_accuracy_t1": peak_acc,
        "final_accuracy_t1": final_acc,
        "kl_warning_step": kl_step,
        "kl_lead_steps": step - kl_step if step is not None and kl_step is not None else None,
    }
