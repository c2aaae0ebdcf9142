"""Statistics of the reports: intervals over seeds, proportions and survival, as pure functions of floats.

- `t_quantile(p, df)`: Student t quantile (scipy is not a dependency): the CDF through the regularized
  incomplete beta function (Lentz's continued fraction), inverted by bisection.
- `chi2_sf(x, df)`: chi-square survival function, through the regularized upper incomplete gamma function.
- `mean_interval(xs)`: mean and 95% Student t interval over seeds (None bounds with one value).
- `wilson(k, n)`: Wilson score interval of a proportion (eval accuracy with one seed, collapse rate).
- `proportion_difference(k1, n1, k2, n2)`: Newcombe's hybrid score interval of p2 - p1 (compare).
- `kaplan_meier(times, events)`: survival curve of time-to-collapse, censored at the step budget.

Sums go through math.fsum (correctly rounded, so independent of order and machine).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

LEVEL = 0.95
"""Coverage of every interval the reports show."""


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function (modified Lentz, Numerical Recipes 6.4)."""
    tiny, eps = 1e-300, 1e-15
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 400):
        m2 = 2 * m
        for num in (m * (b - m) * x / ((qam + m2) * (a + m2)), -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < eps:
            break
    return h


def betainc(a: float, b: float, x: float) -> float:
    """Regularized incomplete beta function I_x(a, b) for a, b > 0 and 0 <= x <= 1."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with `df` degrees of freedom."""
    tail = 0.5 * betainc(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t >= 0 else tail


def t_quantile(p: float, df: float) -> float:
    """The t with P(T <= t) = p (0 < p < 1, df > 0), to ~1e-12 relative."""
    if not 0.0 < p < 1.0 or not df > 0:
        raise ValueError(f"t_quantile needs 0 < p < 1 and df > 0, got p={p}, df={df}")
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:  # df=1, p=0.975 needs 12.7; the bracket doubles until it holds
        lo, hi = hi, hi * 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-13 * hi:
            break
    return 0.5 * (lo + hi)


def z_quantile(p: float) -> float:
    """Standard normal quantile."""
    return NormalDist().inv_cdf(p)


def gammaincc(a: float, x: float) -> float:
    """Regularized upper incomplete gamma function Q(a, x) for a > 0, x >= 0 (Numerical Recipes 6.2: the series
    below a + 1, the continued fraction (modified Lentz) above)."""
    if x <= 0:
        return 1.0
    front = math.exp(-x + a * math.log(x) - math.lgamma(a))
    if x < a + 1:
        term = total = 1.0 / a
        ap = a
        for _ in range(10_000):
            ap += 1
            term *= x / ap
            total += term
            if abs(term) < abs(total) * 1e-16:
                break
        return max(0.0, 1.0 - total * front)
    tiny = 1e-300
    b, c, d = x + 1 - a, 1 / tiny, 1 / (x + 1 - a)
    h = d
    for i in range(1, 10_000):
        an = -i * (i - a)
        b += 2
        d = an * d + b
        d = tiny if abs(d) < tiny else d
        c = b + an / c
        c = tiny if abs(c) < tiny else c
        d = 1 / d
        h *= d * c
        if abs(d * c - 1) < 1e-16:
            break
    return h * front


def chi2_sf(x: float, df: int) -> float:
    """P(X >= x) for X ~ chi-square with `df` degrees of freedom (1.0 for df = 0: nothing was tested)."""
    if df <= 0:
        return 1.0
    return 0.0 if x == math.inf else gammaincc(df / 2.0, x / 2.0)


@dataclass(frozen=True)
class Interval:
    """A point estimate with a LEVEL interval; lo/hi None when there is nothing to estimate a spread from."""

    mean: float | None
    lo: float | None = None
    hi: float | None = None
    n: int = 0
    """How many values (seeds, or trials for a proportion) it rests on."""

    @property
    def half_width(self) -> float | None:
        return None if self.lo is None or self.hi is None else (self.hi - self.lo) / 2.0

    def overlaps(self, other: "Interval") -> bool:
        """True when the two intervals share a point (a missing bound counts as unbounded)."""
        lo1, hi1 = (-math.inf if self.lo is None else self.lo), (math.inf if self.hi is None else self.hi)
        lo2, hi2 = (-math.inf if other.lo is None else other.lo), (math.inf if other.hi is None else other.hi)
        return lo1 <= hi2 and lo2 <= hi1


def clip(iv: Interval, lo: float = -math.inf, hi: float = math.inf) -> Interval:
    """The interval with its bounds clipped to the feasible range [lo, hi] (a proportion's [0, 1], say)."""
    if iv.lo is None:
        return iv
    return Interval(iv.mean, min(max(iv.lo, lo), hi), min(max(iv.hi, lo), hi), iv.n)


def mean(xs: list[float]) -> float | None:
    return math.fsum(xs) / len(xs) if xs else None


def sample_sd(xs: list[float]) -> float:
    """Standard deviation with n - 1 in the denominator (len(xs) >= 2)."""
    m = math.fsum(xs) / len(xs)
    return math.sqrt(math.fsum((x - m) ** 2 for x in xs) / (len(xs) - 1))


def mean_interval(xs: list[float], level: float = LEVEL) -> Interval:
    """Mean of `xs` (one value per seed) with the Student t interval; bounds None for fewer than 2 values."""
    xs = [float(x) for x in xs if x is not None]
    if not xs:
        return Interval(None)
    m = math.fsum(xs) / len(xs)
    if len(xs) < 2:
        return Interval(m, n=1)
    hw = t_quantile(0.5 + level / 2.0, len(xs) - 1) * sample_sd(xs) / math.sqrt(len(xs))
    return Interval(m, m - hw, m + hw, len(xs))


def wilson(k: float, n: int, level: float = LEVEL) -> Interval:
    """Wilson score interval of a proportion with k successes in n trials (k may be a rounded rate x n)."""
    if n <= 0:
        return Interval(None)
    z = z_quantile(0.5 + level / 2.0)
    p = k / n
    denom = 1.0 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    hw = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return Interval(p, max(0.0, centre - hw), min(1.0, centre + hw), n)


def binomial_se(p: float, n: int) -> float:
    """Standard error of a proportion p measured on n independent trials (the eval-set noise)."""
    return math.sqrt(p * (1 - p) / n)


def proportion_difference(k1: int, n1: int, k2: int, n2: int, level: float = LEVEL) -> Interval:
    """Newcombe's hybrid score interval (method 10) for p2 - p1 from two Wilson intervals."""
    a, b = wilson(k1, n1, level), wilson(k2, n2, level)
    d = b.mean - a.mean
    lo = d - math.sqrt((b.mean - b.lo) ** 2 + (a.hi - a.mean) ** 2)
    hi = d + math.sqrt((b.hi - b.mean) ** 2 + (a.mean - a.lo) ** 2)
    return Interval(d, lo, hi, min(n1, n2))


def difference_interval(a: Interval, b: Interval) -> Interval:
    """b - a with the half-widths combined in quadrature (independent estimates); bounds None if either lacks them."""
    if a.mean is None or b.mean is None:
        return Interval(None)
    d = b.mean - a.mean
    if a.half_width is None or b.half_width is None:
        return Interval(d, n=min(a.n, b.n))
    hw = math.hypot(a.half_width, b.half_width)
    return Interval(d, d - hw, d + hw, min(a.n, b.n))


def kaplan_meier(times: list[int], events: list[bool]) -> list[tuple[int, float]]:
    """Survival curve [(t, S(t))] starting at (0, 1.0), one point per step with an event.

    `times[i]` is run i's collapse step when events[i] is True, else the last step it was observed
    at (censored: it reached the step budget, or stopped early, without collapsing). At a time with
    both, events count before censorings (the usual convention).
    """
    if len(times) != len(events):
        raise ValueError(f"kaplan_meier: {len(times)} times but {len(events)} event flags")
    curve, s = [(0, 1.0)], 1.0
    at_risk = len(times)
    for t in sorted(set(times)):
        d = sum(1 for ti, e in zip(times, events) if ti == t and e)
        if d:
            s *= 1.0 - d / at_risk
            curve.append((t, s))
        at_risk -= sum(1 for ti in times if ti == t)
    return curve


def median_survival(curve: list[tuple[int, float]]) -> int | None:
    """First time the survival curve is at or below 0.5, None if it never gets there."""
    return next((t for t, s in curve if s <= 0.5), None)
