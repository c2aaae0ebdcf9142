"""timbench.report.stats against hand-computed and textbook values."""

import math

import pytest

from timbench.report.stats import (
    Interval,
    betainc,
    difference_interval,
    kaplan_meier,
    mean_interval,
    median_survival,
    proportion_difference,
    t_cdf,
    t_quantile,
    wilson,
)

pytestmark = pytest.mark.unit  # builds no model (make test-unit)

# Student t 0.975 quantiles from the standard table (e.g. Abramowitz & Stegun 26.10).
T975 = {
    1: 12.7062,
    2: 4.3027,
    3: 3.1824,
    4: 2.7764,
    5: 2.5706,
    9: 2.2622,
    10: 2.2281,
    20: 2.0860,
    30: 2.0423,
    120: 1.9799,
}


@pytest.mark.parametrize("df, q", sorted(T975.items()))
def test_t_quantile_matches_the_table(df, q):
    assert t_quantile(0.975, df) == pytest.approx(q, abs=1e-4)
    assert t_quantile(0.025, df) == pytest.approx(-q, abs=1e-4)
    assert t_cdf(q, df) == pytest.approx(0.975, abs=1e-5)


def test_t_distribution_closed_forms_and_limits():
    # df = 1 is Cauchy: F(t) = 1/2 + atan(t)/pi; df = 2: F(t) = 1/2 + t / (2 sqrt(2 + t^2))
    for t in (-3.0, -0.5, 0.0, 0.7, 4.0):
        assert t_cdf(t, 1) == pytest.approx(0.5 + math.atan(t) / math.pi, abs=1e-12)
        assert t_cdf(t, 2) == pytest.approx(0.5 + t / (2 * math.sqrt(2 + t * t)), abs=1e-12)
    assert t_quantile(0.975, 1e6) == pytest.approx(1.959964, abs=1e-5)  # -> the normal quantile
    assert t_quantile(0.5, 3) == pytest.approx(0.0, abs=1e-12)
    assert betainc(2.0, 3.0, 0.4) == pytest.approx(0.5248, abs=1e-12)  # 1 - (0.6^4 + 4 * 0.4 * 0.6^3)
    with pytest.raises(ValueError, match="0 < p < 1"):
        t_quantile(1.0, 3)


def test_mean_interval_by_hand():
    iv = mean_interval([0.30, 0.40, 0.50])
    # mean 0.4, sd 0.1, half width 4.302653 * 0.1 / sqrt(3) = 0.248414
    assert iv.mean == pytest.approx(0.4) and iv.n == 3
    assert (iv.lo, iv.hi) == (pytest.approx(0.4 - 0.248414, abs=1e-6), pytest.approx(0.4 + 0.248414, abs=1e-6))
    assert mean_interval([0.7]) == Interval(0.7, None, None, 1)
    assert mean_interval([]).mean is None
    same = mean_interval([0.25, 0.25, 0.25])
    assert same.lo == same.hi == 0.25  # no spread: a zero-width interval, not an error


def test_wilson_by_hand():
    # k = 40, n = 128, z = 1.959964: p = 0.3125, centre (p + z^2/2n) / (1 + z^2/n), hw z sqrt(p(1-p)/n + z^2/4n^2) /
    # (...)
    iv = wilson(40, 128)
    assert (iv.lo, iv.hi) == (pytest.approx(0.238655, abs=1e-6), pytest.approx(0.397271, abs=1e-6))
    assert wilson(0, 3).lo == 0.0 and wilson(0, 3).hi == pytest.approx(0.561497, abs=1e-6)
    assert wilson(3, 3).lo == pytest.approx(0.438503, abs=1e-6) and wilson(3, 3).hi == 1.0
    assert wilson(0, 0).mean is None


def test_interval_differences():
    # 0/3 -> 3/3 collapses: Newcombe's lower bound 1 - sqrt(2 * 0.561497^2) = 0.205923 > 0
    d = proportion_difference(0, 3, 3, 3)
    assert d.mean == 1.0 and d.lo == pytest.approx(0.205923, abs=1e-6)
    assert proportion_difference(0, 3, 1, 3).lo < 0  # one collapse in three seeds proves nothing
    a, b = Interval(0.5, 0.4, 0.6, 3), Interval(0.3, 0.27, 0.33, 3)
    d = difference_interval(a, b)
    assert d.mean == pytest.approx(-0.2) and d.hi == pytest.approx(-0.2 + math.hypot(0.1, 0.03))
    assert a.overlaps(Interval(0.65, 0.59, 0.7)) and not a.overlaps(Interval(0.65, 0.61, 0.7))
    assert difference_interval(a, Interval(0.3, n=1)).lo is None


def test_kaplan_meier_by_hand():
    # collapses at 10 and 20, one censored at 40, one collapse at 40: 1 -> 3/4 -> 1/2 -> 1/4
    curve = kaplan_meier([10, 20, 40, 40], [True, True, False, True])
    assert curve == [(0, 1.0), (10, 0.75), (20, 0.5), (40, 0.25)]
    assert median_survival(curve) == 20
    # censoring before an event shrinks the risk set: 3 at risk at step 30 after one censored at 5
    assert kaplan_meier([5, 30, 40, 40], [False, True, False, False]) == [(0, 1.0), (30, pytest.approx(2 / 3))]
    assert median_survival(kaplan_meier([40, 40], [False, False])) is None
    with pytest.raises(ValueError, match="2 times but 1 event flags"):
        kaplan_meier([1, 2], [True])


def test_clip_keeps_the_mean_and_bounds_the_interval():
    from timbench.report.stats import clip

    assert clip(Interval(0.1, -0.2, 0.4, 3), 0.0, 1.0) == Interval(0.1, 0.0, 0.4, 3)
    assert clip(Interval(0.9, 0.7, 1.3, 3), 0.0, 1.0) == Interval(0.9, 0.7, 1.0, 3)
    assert clip(Interval(0.5, n=1), 0.0, 1.0) == Interval(0.5, n=1)
