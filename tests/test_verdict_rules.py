"""The verdict rules (timbench.report.verdict_rules, stats' tests and the endpoint): every word each rule can print,
on synthetic cases, and the statistics they rest on against reference values (scipy / R, computed by hand)."""

import json

import pytest

from timbench.grid.endpoint import DEFAULT, endpoint_value, label
from timbench.grid.merge import fingerprint, fingerprint_hash
from timbench.report import verdict_rules as vr
from timbench.report.stats import fisher_exact, holm, t_test, tost

pytestmark = pytest.mark.unit  # builds no model (make test-unit)


def test_fisher_exact_matches_scipy():
    # scipy.stats.fisher_exact([[2, 4], [2, 1]]) etc.
    assert fisher_exact(2, 6, 2, 3) == pytest.approx(0.5238095238, rel=1e-9)
    assert fisher_exact(0, 6, 6, 6) == pytest.approx(2 / 924, rel=1e-9)
    assert fisher_exact(1, 10, 9, 10) == pytest.approx(0.0010933339, rel=1e-6)
    assert fisher_exact(0, 6, 4, 6) == pytest.approx(0.0606060606, rel=1e-6)  # 0/6 vs 4/6: not detected
    assert fisher_exact(3, 6, 3, 6) == 1.0
    with pytest.raises(ValueError, match="0 <= k <= n"):
        fisher_exact(7, 6, 0, 6)


def test_holm_by_hand():
    assert holm([0.01, 0.04, 0.03, None, 0.5]) == pytest.approx([0.04, 0.09, 0.09, None, 0.5], abs=1e-12)
    assert holm([0.5, 0.9]) == [1.0, 1.0]  # capped at 1, monotone
    assert holm([]) == []


def test_t_test_and_tost_by_hand():
    # mean 0.1425, sd 0.0427, n 4: t = 6.67, df 3 -> p = 0.00686 (R: t.test(c(.1,.2,.15,.12)))
    assert t_test([0.1, 0.2, 0.15, 0.12]) == pytest.approx(0.0072267, rel=1e-4)
    assert t_test([0.0, 0.0]) == 1.0 and t_test([0.2, 0.2]) == 0.0 and t_test([0.1]) is None
    assert tost([0.01, -0.02, 0.0, 0.015, 0.005], 0.05) < 0.001  # tight around 0: equivalent
    assert tost([0.01, -0.02, 0.0, 0.015, 0.005], 0.005) > 0.05  # margin smaller than the spread
    assert tost([0.1], 0.05) is None


def test_effect_words():
    up = [0.10, 0.12, 0.09, 0.11, 0.13, 0.10]
    t = vr.decide([vr.paired_effect("x", up, learning_range=0.15)])[0]
    assert t.word() == vr.REPRODUCED and t.p_adj < 0.05
    t = vr.decide([vr.paired_effect("x", [-x for x in up], learning_range=0.15)])[0]
    assert t.word() == vr.REVERSED
    noisy = [0.01, -0.01, 0.005, -0.004, 0.002, -0.003]  # tight, nothing there: powered, not detected
    assert vr.decide([vr.paired_effect("x", noisy, learning_range=0.15)])[0].word() == vr.NOT
    wide = [0.3, -0.3, 0.25, -0.28, 0.2, -0.1]  # smallest detectable difference above the learning range
    t = vr.decide([vr.paired_effect("x", wide, learning_range=0.15)])[0]
    assert t.mde > 0.15 and t.word() == vr.NOT_TESTED and "learning range" in t.text()
    assert vr.paired_effect("x", [0.1], 0.15).word() == vr.NOT_TESTED  # one seed
    assert vr.paired_effect("x", up, 0.15, floor=True).word() == vr.NOT_TESTED
    t = vr.paired_effect("x", up, 0.15, baseline_learns=False)
    assert t.word() == vr.NOT_TESTED and "does not learn" in t.text()


def test_holm_turns_a_marginal_detection_into_not_reproduced():
    marginal = [0.05, 0.02, 0.06, 0.01, 0.04, 0.03]  # p ~ 0.006 alone
    alone = vr.decide([vr.paired_effect("a", marginal, 0.15)])[0]
    assert alone.word() == vr.REPRODUCED
    family = vr.decide(
        [vr.paired_effect("a", marginal, 0.15)]
        + [vr.paired_effect(f"n{i}", [0.01, -0.01, 0.02, -0.02, 0.0, 0.005], 0.15) for i in range(9)]
    )
    assert family[0].p_adj > 0.05 and family[0].word() == vr.NOT


def test_no_difference_words():
    tight = [0.01, -0.02, 0.0, 0.015, 0.005, -0.01]
    assert vr.decide([vr.paired_no_difference("x", tight, 0.075, 0.15)])[0].word() == vr.EQUIVALENT
    apart = [0.2, 0.22, 0.18, 0.21, 0.19, 0.2]
    assert vr.decide([vr.paired_no_difference("x", apart, 0.075, 0.3)])[0].word() == vr.NOT
    mid = [0.06, -0.02, 0.09, 0.0, 0.07, -0.03]  # neither within +-0.04 nor different, and powered
    t = vr.decide([vr.paired_no_difference("x", mid, 0.04, 0.5)])[0]
    assert t.word() == vr.INCONCLUSIVE
    wide = [0.3, -0.3, 0.25, -0.28, 0.2, -0.1]
    assert vr.decide([vr.paired_no_difference("x", wide, 0.075, 0.15)])[0].word() == vr.NOT_TESTED
    assert vr.paired_no_difference("x", tight, None, None).word() == vr.NOT_TESTED
    assert vr.paired_no_difference("x", tight, 0.075, 0.15, floor=True).word() == vr.NOT_TESTED


def test_rate_words():
    assert vr.decide([vr.rate_vs_control("c", 6, 6, 0, 6)])[0].word() == vr.REPRODUCED
    assert vr.decide([vr.rate_vs_control("c", 0, 6, 6, 6)])[0].word() == vr.REVERSED
    t = vr.decide([vr.rate_vs_control("c", 4, 6, 0, 6)])[0]  # 4/6 vs 0/6: Fisher p 0.06
    assert t.word() == vr.NOT and "4/6" in t.text() and "Fisher" in t.text()
    assert vr.rate_vs_control("c", 0, 6, 0, 6).word() == vr.NOT_TESTED  # both at 0: a floor
    assert vr.rate_vs_control("c", 6, 6, 6, 6).word() == vr.NOT_TESTED


def test_threshold_words():
    t = vr.decide([vr.rate_vs_threshold("s", 10, 10, 0.5)])[0]
    assert t.p == pytest.approx(2 / 1024) and t.word() == vr.REPRODUCED
    assert vr.decide([vr.rate_vs_threshold("s", 0, 10, 0.5)])[0].word() == vr.REVERSED
    assert vr.decide([vr.rate_vs_threshold("s", 6, 6, 0.5)])[0].p == pytest.approx(2 / 64)
    assert vr.decide([vr.rate_vs_threshold("s", 2, 6, 0.5)])[0].word() == vr.NOT
    assert vr.rate_vs_threshold("s", 0, 0, 0.5).word() == vr.NOT_TESTED


def test_checks_and_combine():
    assert vr.check(True) == vr.CHECK_PASS and vr.check(False) == vr.CHECK_FAIL
    assert vr.combine([vr.NOT, vr.REPRODUCED]) == vr.REPRODUCED
    assert vr.combine([vr.NOT_TESTED, vr.NOT]) == vr.NOT
    assert vr.combine([vr.NOT_TESTED]) == vr.NOT_TESTED and vr.combine([]) == vr.NOT_TESTED


def test_endpoints_by_hand():
    evals = [{"step": s, "accuracy_t1": a} for s, a in ((0, 0.2), (20, 0.4), (40, 0.6), (60, 0.5), (80, 0.7))]
    assert endpoint_value(evals, 80, "final") == 0.7
    assert endpoint_value(evals, 80, "last3") == pytest.approx(0.6)
    assert endpoint_value(evals, 80, "last-half") == pytest.approx(0.6)  # steps 40, 60, 80
    assert endpoint_value(evals, 80, "auc") == pytest.approx((0.3 + 0.5 + 0.55 + 0.6) / 4)
    assert endpoint_value(evals[:2], 80, "last-half") == 0.4  # stopped before the window: its last eval
    assert endpoint_value([], 80) is None and DEFAULT == "last-half"
    with pytest.raises(ValueError, match="unknown endpoint 'median'; valid: final, last3, last-half, auc"):
        endpoint_value(evals, 80, "median")
    assert "EXPLORATORY" in label("final", None) and "pre-registered" in label("auc", "auc")
    assert "declares none" in label("last-half", None)


def test_committed_grids_keep_their_fingerprint():
    """Adding the endpoint key leaves the fingerprint of a grid that does not declare one unchanged: the
    committed merge records (results/*/merged.json) still match their cells.json."""
    for name in ("paper", "rise_collapse"):
        doc = json.loads(open(f"results/{name}/cells.json").read())
        assert "endpoint" not in doc
        merged = json.loads(open(f"results/{name}/merged.json").read())
        assert fingerprint_hash(fingerprint(doc)) == merged["fingerprint"]
        declared = fingerprint({**doc, "endpoint": "auc"})
        assert declared["endpoint"] == "auc" and fingerprint_hash(declared) != merged["fingerprint"]


def test_grid_spec_endpoint_is_validated_and_only_written_when_declared():
    from timbench.grid.spec import parse_grid

    base = {"name": "g", "axes": {"seed": [0]}}
    assert "endpoint" not in parse_grid(base).to_dict()
    assert parse_grid({**base, "endpoint": "last3"}).to_dict()["endpoint"] == "last3"
    with pytest.raises(ValueError, match="endpoint: unknown endpoint 'best'; valid: final, last3, last-half, auc"):
        parse_grid({**base, "endpoint": "best"})


def test_warning_words():
    t = vr.decide([vr.warning_vs_false_alarms("m", 10, 12, 1, 30)])[0]
    assert t.word() == vr.WARNS and t.estimate == pytest.approx(10 / 12 - 1 / 30)
    assert vr.decide([vr.warning_vs_false_alarms("m", 2, 12, 5, 30)])[0].word() == vr.NO_WARNING
    assert vr.decide([vr.warning_vs_false_alarms("m", 0, 12, 0, 30)])[0].word() == vr.NO_WARNING  # never warns
    assert vr.decide([vr.warning_vs_false_alarms("m", 1, 12, 25, 30)])[0].word() == vr.NO_WARNING  # reversed
    t = vr.warning_vs_false_alarms("m", 3, 3, 0, 0)
    assert t.word() == vr.NOT_TESTED and "no surviving run" in t.text()
    t = vr.warning_vs_false_alarms("m", 2, 2, 0, 2)  # even a perfect warning: Fisher p 1/3
    assert t.word() == vr.NOT_TESTED and "too few runs" in t.blocked
    marginal = [vr.warning_vs_false_alarms(f"m{i}", 5, 12, 1, 12) for i in range(15)]  # p ~ 0.07 each: Holm
    assert all(x.word() == vr.NO_WARNING for x in vr.decide(marginal))


def test_size_interaction_words():
    ref = {s: 0.20 + 0.01 * (s % 3) for s in range(6)}  # A - B = +0.2 on the reference model, detected
    same = {s: 0.20 + 0.01 * ((s + 1) % 3) for s in range(6)}
    t = vr.decide([vr.size_interaction("x", ref, same, margin=0.075, learning_range=0.15)])[0]
    assert t.word() == vr.TRANSFERS and "TOST margin" in t.text()
    gone = {s: 0.01 * (s % 2) for s in range(6)}  # the proxy loses the effect: the interaction is detected
    assert vr.decide([vr.size_interaction("x", ref, gone, 0.075, 0.15)])[0].word() == vr.DIFFERS
    wide = {s: 0.2 + (0.25 if s % 2 else -0.25) for s in range(6)}  # neither equivalent nor detected
    t = vr.decide([vr.size_interaction("x", ref, wide, 0.075, 1.0)])[0]
    assert t.word() == vr.INCONCLUSIVE
    assert vr.decide([vr.size_interaction("x", ref, wide, 0.075, 0.15)])[0].word() == vr.NOT_TESTED  # no power
    flat = {s: 0.01 * (-1) ** s for s in range(6)}  # nothing at either size
    t = vr.size_interaction("x", flat, {s: -v for s, v in flat.items()}, 0.075, 0.15)
    assert t.word() == vr.NOT_TESTED and "nothing happened at any size" in t.blocked
    assert vr.size_interaction("x", {0: 0.2}, {0: 0.2}, 0.075, 0.15).word() == vr.NOT_TESTED  # one seed
    # neither size detects its own A - B (opposite signs, 3 noisy seeds) but the interaction is detected: it counts
    up, down = {0: 0.30, 1: 0.02, 2: 0.16}, {0: -0.12, 1: -0.40, 2: -0.26}
    t = vr.decide([vr.size_interaction("x", up, down, 0.075, 1.0)])[0]
    assert t.word() == vr.DIFFERS and not t.blocked
    t = vr.decide([vr.size_interaction("x", ref, same, None, None)])[0]  # no margin: cannot be equivalent
    assert t.word() == vr.NOT_TESTED and "no equivalence margin" in t.text()


def test_rate_interaction_words():
    assert vr.rate_interaction("c", 6, 6, 0, 6).word() == vr.DIFFERS  # 6/6 on the reference, 0/6 on the proxy
    assert vr.rate_interaction("c", 3, 3, 3, 3).word() == vr.INCONCLUSIVE  # 3 seeds do not show equal rates
    t = vr.rate_interaction("c", 0, 3, 0, 3)
    assert t.word() == vr.NOT_TESTED and "nothing happened at any size" in t.blocked
    assert vr.rate_interaction("c", 0, 0, 1, 3).word() == vr.NOT_TESTED  # no seeds on one side


def test_rank_labels_tie_unless_separated():
    from timbench.report.stats import Interval

    ivs = [
        Interval(0.9, 0.85, 0.95, 3),
        Interval(0.6, 0.5, 0.7, 3),
        Interval(0.55, 0.45, 0.65, 3),
        Interval(0.4, 0.35, 0.52, 3),
        Interval(0.1, 0.0, 0.2, 3),
    ]
    # 2 overlaps 3, 3 overlaps 4: one chained tie group; 1 and 5 are separated from their neighbours
    assert vr.rank_labels(ivs) == ["1", "2-4 (tied)", "2-4 (tied)", "2-4 (tied)", "5"]
    assert vr.rank_labels([Interval(0.9), Interval(0.1, 0.0, 0.2, 3)]) == ["1-2 (tied)"] * 2  # no interval: a tie
    assert vr.rank_labels([]) == [] and vr.rank_labels([Interval(0.5, 0.4, 0.6, 3)]) == ["1"]
