"""The seed paper's dose-response (arXiv 2605.14220) as tests: damage rises with the noise dose, mean |delta| alone
predicts it (real conditions on the noise curve, by equivalence), bypass collapses at a lower dose than recompute.
Rules and words: timbench.studies.paper_claims; shared quantities: paper_evidence.
"""

from __future__ import annotations

import math

from ..metrics.schema import MEAN_MEAN_ABS_DELTA
from ..report.leaderboard import fmt
from ..report.verdict_rules import EQUIVALENT, NOT, combine, paired_effect, paired_no_difference, rate_vs_control
from .paper_evidence import (
    FLOOR,
    UNTESTED,
    PaperData,
    Sub,
    Verdict,
    _ci,
    at_floor,
    collapses,
    diffs,
    family,
    over_seeds,
    rel,
)


def dose_points(d: PaperData) -> list[dict]:
    pts = []
    for (cond, remedy, mode), rows in d.rows.items():
        if remedy != "none" or d.kinds.get(cond) == "reference":
            continue
        k, n = collapses(rows)
        pts.append(
            {
                "label": cond,
                "mode": mode,
                "kind": d.kinds.get(cond),
                "collapses": k,
                "seeds": n,
                "x": over_seeds(rows, lambda r: r.get(MEAN_MEAN_ABS_DELTA)),
                "y": over_seeds(rows, rel),
                "sigma": rows[0].get("noise_sigma"),
            }
        )
    return pts


def spearman(xs: list[float], ys: list[float]) -> float | None:
    """Rank correlation (no ties expected; ties get the order they come in)."""
    if len(xs) < 3:
        return None
    rank = lambda v: {i: r for r, i in enumerate(sorted(range(len(v)), key=lambda i: v[i]))}  # noqa: E731
    rx, ry = rank(xs), rank(ys)
    n = len(xs)
    return 1 - 6 * math.fsum((rx[i] - ry[i]) ** 2 for i in range(n)) / (n * (n * n - 1))


def dose(d: PaperData) -> Verdict:
    """Per mode, the noise sweep's damage rising with its dose is tested per seed (rel at the smallest sigma minus
    rel at the largest, paired; Spearman over the sweep's means is shown, not tested: 3-4 points)."""
    pts = dose_points(d)
    lr, learns, _ = d.learning()
    subs, thresholds = [], {}
    for mode in ("recompute", "bypass"):
        noise = sorted(
            (p for p in pts if p["mode"] == mode and p["kind"] == "noise" and p["y"].mean is not None),
            key=lambda p: p["sigma"] or 0,
        )
        rho = spearman([p["x"].mean for p in noise], [p["y"].mean for p in noise])
        tests = []
        if len(noise) >= 2:
            lo, hi = (d.setting(noise[i]["label"], mode=mode) for i in (0, -1))
            tests = [
                paired_effect(
                    f"sigma {noise[0]['sigma']:g} - sigma {noise[-1]['sigma']:g} rel",
                    diffs(lo, hi),
                    lr,
                    at_floor(lo, hi),
                    learns,
                )
            ]
        subs.append(
            Sub(
                f"{mode}: relative accuracy falls as the noise dose rises (smallest minus largest sigma > 0, paired)",
                UNTESTED,
                f"Spearman over sigma {fmt(rho, 2)} (not a test); "
                + ", ".join(
                    f"sigma {p['sigma']:g}: |delta| {fmt(p['x'].mean)} rel {_ci(p['y'])} "
                    f"({p['collapses']}/{p['seeds']})"
                    for p in noise
                ),
                tests=tests,
            )
        )
        thresholds[mode] = {p["sigma"]: p for p in noise}
    subs.append(_on_the_noise_curve(d, pts, lr, learns))
    common = sorted(set(thresholds.get("recompute", {})) & set(thresholds.get("bypass", {})))
    tests = [
        rate_vs_control(
            f"sigma {s:g}: bypass vs recompute collapses",
            thresholds["bypass"][s]["collapses"],
            thresholds["bypass"][s]["seeds"],
            thresholds["recompute"][s]["collapses"],
            thresholds["recompute"][s]["seeds"],
        )
        for s in common
    ]
    subs.append(
        Sub(
            "bypass collapses at a lower dose than recompute (literature's CPU-scale try: sigma 2 vs 3; "
            "bypass collapses more often at some sigma, Fisher)",
            UNTESTED,
            "" if tests else "no noise sigma in both modes",
            central=False,
            tests=tests,
        )
    )
    return family("dose-response", subs)


def noise_curve(noise: list[dict], x: float) -> float:
    """The noise sweep's relative accuracy at mean |delta| = x: linear in log |delta| between its points, the
    nearest point's value outside them."""
    pts = sorted((p["x"].mean, p["y"].mean) for p in noise)
    if x <= pts[0][0]:
        return pts[0][1]
    for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
        if x <= x1:
            t = (math.log(x) - math.log(x0)) / (math.log(x1) - math.log(x0))
            return y0 + t * (y1 - y0)
    return pts[-1][1]


def _on_the_noise_curve(d: PaperData, pts: list[dict], lr: float | None, learns: bool) -> Sub:
    """Each real setting's seeds against the noise sweep's value at the same |delta|: equivalence within half the
    learning range (TOST, one sample); the claim holds where >= 2/3 of the real settings are equivalent."""
    tests, parts = [], []
    real = [p for p in pts if p["kind"] not in ("noise", "reference") and p["x"].mean and p["y"].mean is not None]
    for p in real:
        noise = [
            q
            for q in pts
            if q["mode"] == p["mode"] and q["kind"] == "noise" and q["x"].mean and q["y"].mean is not None
        ]
        if len(noise) < 2:
            continue
        pred = noise_curve(noise, p["x"].mean)
        rows = d.setting(p["label"], mode=p["mode"])
        tests.append(
            paired_no_difference(
                f"{p['label']}/{p['mode']} rel - noise curve {fmt(pred)}",
                [rel(r) - pred for r in rows if rel(r) is not None],
                lr / 2 if lr and lr > 0 else None,
                lr,
                at_floor(rows) and pred <= FLOOR,
                learns,
            )
        )
        parts.append(f"{p['label']}/{p['mode']}: |delta| {fmt(p['x'].mean)}")

    def rule(words):
        if words.count(EQUIVALENT) * 3 >= 2 * len(words):
            return EQUIVALENT
        return NOT if words.count(NOT) * 3 > len(words) else combine([w for w in words if w != EQUIVALENT])

    return Sub(
        "mean |delta| alone predicts the damage: each real condition's relative accuracy is equivalent to "
        "the noise sweep's value at the same |delta| (>= 2/3 of real settings; TOST within half the learning "
        "range)",
        rule if tests else UNTESTED,
        "; ".join(parts),
        tests=tests,
    )
