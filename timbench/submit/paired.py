"""Paired comparison of two remedies on the same seeds (the submission's verdict against none and the best built-in).

Per seed, a remedy's score is the leaderboard's (timbench.report.leaderboard: the mean over its scored
mismatched cells, on the settings every remedy ran, of final accuracy / the same seed's reference, a
collapsed cell capped at 0.5). The paired difference is score_A(seed) - score_B(seed) over the seeds both
have, with a 95% Student t interval over seeds: same warm start, prompts and sampler keys per seed, so the
seed-to-seed spread common to both cancels. Verdict: "better" when the interval lies above 0, "worse" when
below, else "tied" (with one seed there is no interval, so never better or worse). `paired_by_setting` does
the same per (condition, mode) setting, on each cell's score, so a loss under one condition is not hidden
by an overall tie.
"""

from __future__ import annotations

from ..report import stats
from ..report.leaderboard import _setting, cell_score, is_scored, shared_settings


def seed_scores(rows: list[dict], remedy: str) -> dict:
    """{seed: score} of one remedy on the settings every remedy with a scored cell ran."""
    common = shared_settings(rows)
    per_seed: dict = {}
    for r in rows:
        if (
            r["remedy"] == remedy
            and r["kind"] != "reference"
            and is_scored(r)
            and (common is None or _setting(r) in common)
        ):
            per_seed.setdefault(r["seed"], []).append(cell_score(r))
    return {s: stats.mean(v) for s, v in per_seed.items()}


def paired(rows: list[dict], a: str, b: str) -> dict:
    """score(a) - score(b) per shared seed, its mean and 95% t interval, and the verdict."""
    return _compare(seed_scores(rows, a), seed_scores(rows, b), a, b)


def paired_by_setting(rows: list[dict], a: str, b: str) -> list[dict]:
    """`paired` per mismatched (condition, mode) setting both remedies ran, each with the two remedies' own
    mean score and 95% interval over seeds (`a_interval`, `b_interval`) and a `setting` label."""
    out = []
    settings = sorted({(r["condition"], r["mode"]) for r in rows if r["remedy"] == a and r["kind"] != "reference"})
    for cond, mode in settings:

        def scores(remedy):
            return {
                r["seed"]: cell_score(r)
                for r in rows
                if (r["remedy"], r["condition"], r["mode"]) == (remedy, cond, mode) and is_scored(r)
            }

        sa, sb = scores(a), scores(b)
        if not sb:
            continue
        cmp = _compare(sa, sb, a, b)
        cmp.update(
            setting=f"{cond}/{mode}",
            a_interval=stats.mean_interval(list(sa.values())),
            b_interval=stats.mean_interval(list(sb.values())),
        )
        out.append(cmp)
    return out


def _compare(sa: dict, sb: dict, a: str, b: str) -> dict:
    seeds = sorted(set(sa) & set(sb), key=str)
    diffs = [sa[s] - sb[s] for s in seeds]
    iv = stats.mean_interval(diffs) if diffs else stats.Interval(None)
    verdict = "tied"
    if iv.lo is not None and iv.lo > 0:
        verdict = "better"
    elif iv.hi is not None and iv.hi < 0:
        verdict = "worse"
    return {
        "a": a,
        "b": b,
        "seeds": seeds,
        "diffs": diffs,
        "interval": iv,
        "verdict": verdict if diffs else "no shared scored seeds",
    }
