"""The seed paper's claims (arXiv 2605.14220) as tests over a grid's results: one verdict per claim.

Each claim is a *family* of sub-claims; each sub-claim is decided by one or more tests of
timbench.report.verdict_rules (paired t tests over seeds, TOST with a stated margin for a claim of no
difference, Fisher's exact test for a rate against its control, the exact binomial test for a share), Holm's
correction over the family's tests, and that module's one rule from tests to words: reproduced, reversed,
equivalent, not reproduced, inconclusive, not tested (fewer than 2 seeds, both arms at the floor, a baseline
that does not learn, or a smallest detectable difference above the learning range). Every accuracy is the
grid's endpoint (timbench.grid.endpoint; default the mean eval accuracy T=1 over the last half of the run),
relative to the same seed's zero-mismatch run; the learning range is the zero-mismatch run's own relative gain
(endpoint - the step-0 eval, over the endpoint) and the equivalence margin half of it. Implementation checks
(zero mismatch gives exactly 0.0) are listed apart and do not count as claims. A claim's headline is its weakest
central sub-claim (verdict_rules.STRENGTH); a sub-claim marked not central (a literature add-on, or not the
paper's claim) is shown but does not set it.

Pure functions of `PaperData` (built by timbench.studies.paper); nothing here reads files or draws.
The shared part (PaperData, Sub, Verdict, family and the per-seed quantities) is in paper_evidence; the claims are
in paper_f1_f3, paper_f4_f5 and paper_dose. This module gathers them under the names the pages import.
"""

from __future__ import annotations

from ..report.stats import detectable
from ..report.verdict_rules import EQUIVALENT, INCONCLUSIVE, NOT, NOT_TESTED, REPRODUCED, REVERSED
from .paper_dose import _on_the_noise_curve, dose, dose_points, noise_curve, spearman
from .paper_evidence import (
    CONSISTENT,
    FLOOR,
    KL_LEAD,
    KL_RISE,
    SHARE,
    SPIKE,
    UNTESTED,
    PaperData,
    Sub,
    Verdict,
    _by_seed,
    _ci,
    _diff,
    _power,
    _setting_text,
    _signed,
    _strength,
    acc,
    at_floor,
    collapses,
    diffs,
    family,
    gain,
    kl_alarm_step,
    max_grad_ratio,
    mean_over_steps,
    over_seeds,
    paired,
    rejection,
    rel,
    rose_before_collapse,
    seed_ranges,
    seeds_used,
    sub_json,
)
from .paper_f1_f3 import F2_SUBS, f1, f2, f3
from .paper_f4_f5 import f4, f5, remedy_condition

__all__ = [
    "CONSISTENT",
    "EQUIVALENT",
    "F2_SUBS",
    "FLOOR",
    "INCONCLUSIVE",
    "KL_LEAD",
    "KL_RISE",
    "NOT",
    "NOT_TESTED",
    "REPRODUCED",
    "REVERSED",
    "SHARE",
    "SPIKE",
    "UNTESTED",
    "PaperData",
    "Sub",
    "Verdict",
    "_by_seed",
    "_ci",
    "_diff",
    "_on_the_noise_curve",
    "_power",
    "_setting_text",
    "_signed",
    "_strength",
    "acc",
    "at_floor",
    "collapses",
    "detectable",
    "diffs",
    "dose",
    "dose_points",
    "f1",
    "f2",
    "f3",
    "f4",
    "f5",
    "family",
    "gain",
    "kl_alarm_step",
    "max_grad_ratio",
    "mean_over_steps",
    "noise_curve",
    "over_seeds",
    "paired",
    "rejection",
    "rel",
    "remedy_condition",
    "rose_before_collapse",
    "seed_ranges",
    "seeds_used",
    "spearman",
    "sub_json",
]
