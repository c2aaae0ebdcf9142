"""Which measured mismatch statistic predicts damage, validated leave-one-condition-out (LOCO).

Damage is two yes/no outcomes per seed (a `risk_data.RiskRow`): OUTCOMES["collapse"] (a collapse dated before
step risk_data.HORIZON) and OUTCOMES["loss"] (more than LOSS of the zero-mismatch run's endpoint accuracy lost).
For each statistic, two simple predictors are fitted per rollout mode (bypass and recompute differ by far more
than any statistic does at the same dose), on log10 of the statistic:

- `threshold`: damage iff the statistic is on the damaging side of one cut (the cut and its side chosen to
  maximise accuracy on the fitted rows);
- `logistic`: a one-variable logistic regression (a small ridge keeps separable data finite).

LOCO: a condition (its name, e.g. nvfp4-rollout, in every grid, model and mode) is held out, both predictors are
fitted on every other condition's rows, and only the held-out rows are scored; `loco_predictions` asserts the
split. The pooled out-of-fold predictions give the accuracy (threshold) and the AUC (logistic, ties count half),
with 95% percentile intervals from a bootstrap over conditions (seeded: the same numbers on every run). A
statistic that only some grids log is scored on the rows that have it, beside mean |delta| on those same rows, and
the paired bootstrap difference says whether it beats mean |delta|. `mode only` (a constant per mode) is the
no-statistic control. Each outcome is validated twice: on every condition, and without the synthetic-noise ones
(zero-mean noise does less damage than rounding at the same mean |delta|, so it may blur a real ranking).
"""

from __future__ import annotations

import math

import numpy as np

from .risk_data import DOSE, HORIZON, STATS, RiskRow

LOSS = 0.15
"""Accuracy lost (relative to the same seed's zero-mismatch endpoint) that counts as damage: half the zero-mismatch
run's own relative gain in results/paper (0.155 / 0.535 = 0.29), the margin the paper page's equivalence tests use."""
OUTCOMES = {
    "collapse": (f"collapse dated before step {HORIZON} (the grid's collapse rule)", lambda r: r.collapsed_within),
    "loss": (
        f"endpoint accuracy more than {LOSS:.0%} below the same seed's zero-mismatch run",
        lambda r: None if r.loss is None else r.loss > LOSS,
    ),
}
BOOT = 2000
SEED = 0
FLOOR = 1e-12
"""log10 of a statistic is taken of max(x, FLOOR): an exact 0 is a very small value, not a missing one."""
MODE_ONLY = "mode only"


def feature(x: float) -> float:
    return math.log10(max(float(x), FLOOR))


def fit_threshold(xs: list[float], ys: list[bool]) -> tuple[float, int]:
    """(cut, side): predict damage iff side * (x - cut) > 0, the most accurate cut on (xs, ys); side +1 preferred
    on ties, then the lowest cut. No rows: never damage."""
    if not xs:
        return math.inf, 1
    vals = sorted(set(xs))
    cuts = [vals[0] - 1.0] + [(a + b) / 2 for a, b in zip(vals, vals[1:])] + [vals[-1] + 1.0]
    best = None
    for side in (1, -1):
        for c in cuts:
            acc = sum((side * (x - c) > 0) == y for x, y in zip(xs, ys))
            if best is None or acc > best[0]:
                best = (acc, c, side)
    return best[1], best[2]


def fit_logistic(xs: list[float], ys: list[bool], ridge: float = 1e-2) -> tuple[float, float, float, float]:
    """(a, b, mu, sd): P(damage) = sigmoid(a + b (x - mu) / sd), by Newton's method with an L2 ridge on b."""
    n = len(xs)
    if n == 0:
        return 0.0, 0.0, 0.0, 1.0
    mu = math.fsum(xs) / n
    sd = math.sqrt(math.fsum((x - mu) ** 2 for x in xs) / n) or 1.0
    zs = [(x - mu) / sd for x in xs]
    a = b = 0.0
    for _ in range(50):
        ps = [1 / (1 + math.exp(-max(-30.0, min(30.0, a + b * z)))) for z in zs]
        ga = math.fsum(p - y for p, y in zip(ps, ys)) + ridge * a
        gb = math.fsum((p - y) * z for p, y, z in zip(ps, ys, zs)) + ridge * b
        w = [p * (1 - p) for p in ps]
        haa = math.fsum(w) + ridge
        hab = math.fsum(wi * z for wi, z in zip(w, zs))
        hbb = math.fsum(wi * z * z for wi, z in zip(w, zs)) + ridge
        det = haa * hbb - hab * hab
        if det <= 0:
            break
        da, db = (hbb * ga - hab * gb) / det, (haa * gb - hab * ga) / det
        a, b = a - da, b - db
        if abs(da) + abs(db) < 1e-10:
            break
    return a, b, mu, sd


def logistic_p(model: tuple, x: float) -> float:
    a, b, mu, sd = model
    return 1 / (1 + math.exp(-max(-30.0, min(30.0, a + b * (x - mu) / sd))))


def auc(ps: list[float], ys: list[bool]) -> float | None:
    """Mann-Whitney AUC (ties count half); None when one class is absent."""
    pos = [p for p, y in zip(ps, ys) if y]
    neg = [p for p, y in zip(ps, ys) if not y]
    if not pos or not neg:
        return None
    wins = sum(1.0 if p > q else 0.5 if p == q else 0.0 for p in pos for q in neg)
    return wins / (len(pos) * len(neg))


def loco_predictions(data: list[tuple[str, str, float, bool]]) -> list[tuple[str, bool, bool, float]]:
    """Out-of-fold predictions over (group, mode, x, y) rows: for each held-out group, per mode, a threshold and a
    logistic fitted on the other groups' rows of that mode (all modes when that mode has no other rows).
    Returns (group, y, threshold says damage, logistic P(damage)) per row, in `data` order."""
    out: list = [None] * len(data)
    for g in sorted({d[0] for d in data}):
        train = [d for d in data if d[0] != g]
        held = [i for i, d in enumerate(data) if d[0] == g]
        assert all(d[0] != g for d in train) and all(data[i][0] == g for i in held)  # never scores a fitted row
        for mode in sorted({data[i][1] for i in held}):
            fit = [d for d in train if d[1] == mode] or train
            xs, ys = [d[2] for d in fit], [d[3] for d in fit]
            cut, side = fit_threshold(xs, ys)
            model = fit_logistic(xs, ys)
            for i in held:
                if data[i][1] == mode:
                    x = data[i][2]
                    out[i] = (g, data[i][3], side * (x - cut) > 0, logistic_p(model, x))
    return out


def _scores(preds: list[tuple]) -> tuple[float | None, float | None]:
    """(threshold accuracy, logistic AUC) of pooled out-of-fold predictions."""
    if not preds:
        return None, None
    acc = sum(t == y for _, y, t, _ in preds) / len(preds)
    return acc, auc([p for *_, p in preds], [y for _, y, _, _ in preds])


def _weighted(preds: list[tuple], w):
    """(accuracy, AUC) of `preds` for each row of weights `w` (draws x rows: how often each row was drawn)."""
    y = np.array([p[1] for p in preds], dtype=bool)
    correct = np.array([p[2] == p[1] for p in preds], dtype=float)
    s = np.array([p[3] for p in preds])
    acc = (w @ correct) / w.sum(axis=1)
    pos, neg = s[y], s[~y]
    if not len(pos) or not len(neg):
        return acc, None
    m = (pos[:, None] > neg[None, :]) + 0.5 * (pos[:, None] == neg[None, :])  # pos x neg: wins, ties half
    wp, wn = w[:, y], w[:, ~y]
    denom = wp.sum(axis=1) * wn.sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        a = ((wp @ m) * wn).sum(axis=1) / denom
    return acc, np.where(denom > 0, a, np.nan)


def bootstrap(preds_by_name: dict[str, list[tuple]], ref: str, boot: int = BOOT, seed: int = SEED) -> dict:
    """95% percentile intervals of each predictor's accuracy and AUC, and of its difference from `ref`'s,
    resampling conditions (groups) with replacement (numpy's seeded generator: the same numbers on every run);
    every predictor's list must cover the same rows in the same order."""
    groups = sorted({p[0] for p in preds_by_name[ref]})
    gi = np.array([groups.index(p[0]) for p in preds_by_name[ref]])
    counts = np.random.default_rng(seed).multinomial(len(groups), [1 / len(groups)] * len(groups), size=boot)
    w = counts[:, gi].astype(float)
    base = _weighted(preds_by_name[ref], w)
    out = {}
    for name, preds in preds_by_name.items():
        mine = _weighted(preds, w)
        for k, v, b in (("accuracy", mine[0], base[0]), ("auc", mine[1], base[1])):
            if v is None:
                continue
            for key, xs in ((k, v), (k + "_diff", None if b is None else v - b)):
                if xs is not None:
                    xs = xs[np.isfinite(xs)]
                    out[(name, key)] = (
                        [float(np.percentile(xs, 2.5)), float(np.percentile(xs, 97.5))] if len(xs) >= 20 else None
                    )
    return out


def validate_outcome(rows: list[RiskRow], outcome: str) -> list[dict]:
    """One dict per statistic (and the mode-only control): LOCO accuracy / AUC with intervals, and the same for
    mean |delta| on the statistic's rows with the paired difference. Sorted best first (AUC, then accuracy)."""
    y_of = OUTCOMES[outcome][1]
    base = [r for r in rows if y_of(r) is not None]
    results = []
    for name in [MODE_ONLY, *STATS]:
        stat = DOSE if name == MODE_ONLY else name
        have = [r for r in base if stat in r.stats]
        if len({r.condition for r in have}) < 3 or len({y_of(r) for r in have}) < 2:
            continue
        data = {
            n: [(r.condition, r.mode, 0.0 if n == MODE_ONLY else feature(r.stats[n]), bool(y_of(r))) for r in have]
            for n in {name, DOSE}
        }
        preds = {n: loco_predictions(d) for n, d in data.items()}
        ivs = bootstrap(preds, DOSE)
        acc, a = _scores(preds[name])
        dacc, da = _scores(preds[DOSE])
        results.append(
            {
                "statistic": name,
                "rows": len(have),
                "conditions": len({r.condition for r in have}),
                "grids": sorted({r.grid for r in have}),
                "damaged": sum(bool(y_of(r)) for r in have),
                "accuracy": acc,
                "accuracy_ci": ivs.get((name, "accuracy")),
                "auc": a,
                "auc_ci": ivs.get((name, "auc")),
                "dose_accuracy": dacc,
                "dose_auc": da,
                "auc_minus_dose": None if a is None or da is None else a - da,
                "auc_minus_dose_ci": ivs.get((name, "auc_diff")) if name != DOSE else None,
                "accuracy_minus_dose": None if acc is None or dacc is None else acc - dacc,
                "accuracy_minus_dose_ci": ivs.get((name, "accuracy_diff")) if name != DOSE else None,
            }
        )
    results.sort(key=lambda d: (-(d["auc"] if d["auc"] is not None else -1), -(d["accuracy"] or 0), d["statistic"]))
    return results


def verdict(ranked: list[dict]) -> str:
    """One sentence: the best statistic and whether it beats mean |delta| (its paired AUC difference's interval
    above 0), or that the data cannot tell them apart."""
    stats = [d for d in ranked if d["statistic"] != MODE_ONLY]
    if not stats:
        return "no statistic could be validated (fewer than 3 conditions or one outcome class only)"
    best = stats[0]
    if best["statistic"] == DOSE:
        return f"mean |delta| ranks first (LOCO AUC {best['auc']:.3f})"
    ci = best["auc_minus_dose_ci"]
    beats = ci is not None and ci[0] > 0
    tail = (
        f"it beats mean |delta| on the same {best['rows']} rows (AUC difference {best['auc_minus_dose']:+.3f}, "
        f"95% CI [{ci[0]:+.3f}, {ci[1]:+.3f}])"
        if beats
        else f"the data cannot tell it apart from mean |delta| on the same {best['rows']} rows (AUC "
        f"{best['auc']:.3f} vs {best['dose_auc']:.3f}, difference 95% CI "
        + (f"[{ci[0]:+.3f}, {ci[1]:+.3f}])" if ci else "not estimable)")
    )
    head = f"{best['statistic']} ranks first (LOCO AUC {best['auc']:.3f}); {tail}"
    dose = next((d for d in stats if d["statistic"] == DOSE), None)
    full = [d for d in stats if dose and d["rows"] == dose["rows"] and d["statistic"] != DOSE]
    if dose and best["rows"] < dose["rows"] and full:  # the leader was scored on fewer rows: say who leads on all
        f, ci = full[0], full[0]["auc_minus_dose_ci"]
        head += (
            f"; on all {dose['rows']} rows ({dose['conditions']} conditions) {f['statistic']} leads (AUC "
            f"{f['auc']:.3f} vs mean |delta| {dose['auc']:.3f}"
            + (f", difference 95% CI [{ci[0]:+.3f}, {ci[1]:+.3f}])" if ci else ")")
        )
    above = [d for d in stats if d["auc_minus_dose_ci"] and d["auc_minus_dose_ci"][0] > 0]
    if not above:
        return head + "; no statistic's AUC difference from mean |delta| has its interval above 0"
    return (
        head
        + "; AUC above mean |delta|'s with the interval above 0: "
        + ", ".join(
            f"{d['statistic']} ({d['auc_minus_dose']:+.3f} [{d['auc_minus_dose_ci'][0]:+.3f}, "
            f"{d['auc_minus_dose_ci'][1]:+.3f}])"
            for d in above
        )
    )


def distinct(rows: list[RiskRow]) -> list[RiskRow]:
    """The rows without repeats: grids replay each other's cells (paper's seeds 0-2 are claims_grid's and
    proxy_dense's, bit for bit), and one run counted twice would weigh twice."""
    # Keyed on the dose, K3 and endpoint, not every statistic: a replay logs the tim/* statistics an older grid
    # lacks (dual_clip's copies of paper's seeds 0-2); of two copies the one with more statistics stays.
    seen: dict = {}
    for r in rows:
        key = (
            r.task,
            r.model,
            r.condition,
            r.remedy,
            r.mode,
            r.seed,
            r.steps,
            r.stats.get("mean_abs_delta"),
            r.stats.get("k3_kl"),
            r.endpoint_t1,
        )
        if key not in seen or len(r.stats) > len(seen[key].stats):
            seen[key] = r
    return list(seen.values())


def validate(rows: list[RiskRow]) -> dict:
    """The validation report of the map's rows (risk_data.mapped): per outcome, the ranked statistics and a verdict."""
    rows = distinct(rows)
    out = {
        "outcomes": {},
        "loss_threshold": LOSS,
        "horizon": HORIZON,
        "bootstrap": BOOT,
        "seed": SEED,
        "rows": len(rows),
        "conditions": sorted({r.condition for r in rows}),
        "grids": sorted({r.grid for r in rows}),
    }
    real = [r for r in rows if r.kind != "noise"]
    for name, (doc, _) in OUTCOMES.items():
        for key, subset in ((name, rows), (f"{name}, real conditions only", real)):
            ranked = validate_outcome(subset, name)
            out["outcomes"][key] = {
                "definition": doc + ("" if subset is rows else "; synthetic noise left out"),
                "ranked": ranked,
                "verdict": verdict(ranked),
            }
    return out
