"""Statistics of the reports: intervals over seeds, proportions and survival, as pure functions of floats.

- `t_quantile(p, df)`: Student t quantile (scipy is not a dependency): the CDF through the regularized
  incomplete beta function (Lentz's continued fraction), inverted by bisection.
- `chi2_sf(x, df)`: chi-square survival function, through the regularized upper incomplete gamma function.
- `mean_interval(xs)`: mean and 95% Student t interval over seeds (None bounds with one value).
- `wilson(k, n)`: Wilson score interval of a proportion (eval accuracy with one seed, collapse rate).
- `proportion_difference(k1, n1, k2, n2)`: Newcombe's hybrid score interval of p2 - p1 (compare).
- `kaplan_meier(times, events)`: survival curve of time-to-collapse, censored at the step budget.
- `t_test(xs)`: two-sided p of a one-sample t test of mean 0 (the paired difference's test).
- `tost(xs, margin)`: equivalence p (two one-sided t tests) of |mean| < margin.
- `fisher_exact(k1, n1, k2, n2)`: two-sided p of Fisher's exact test of two rates, from the hypergeometric pmf.
- `holm(ps)`: Holm's step-down adjusted p-values (family-wise error control within a family of claims).
- `detectable(diff)`: the smallest paired difference a design detects with probability POWER.

Sums go through math.fsum (correctly rounded, so independent of order and machine).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

LEVEL = 0.95
"""Coverage of every interval the reports show."""
ALPHA = 1.0 - LEVEL
"""Level of every test (after Holm's correction within a family)."""
POWER = 0.8
"""The power at which `detectable` states the smallest effect the design could have found."""


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

    def overlaps(self, other: Interval) -> bool:
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


def t_test(xs: list[float]) -> float | None:
    """Two-sided p-value of the one-sample t test of mean 0 (None for fewer than 2 values; 1.0 or 0.0 when the
    values do not vary: all zero, or all the same non-zero value)."""
    xs = [float(x) for x in xs if x is not None]
    if len(xs) < 2:
        return None
    m, sd = math.fsum(xs) / len(xs), sample_sd(xs)
    if sd == 0.0:
        return 1.0 if m == 0.0 else 0.0
    t = m / (sd / math.sqrt(len(xs)))
    return min(1.0, 2.0 * t_cdf(-abs(t), len(xs) - 1))


def tost(xs: list[float], margin: float) -> float | None:
    """Equivalence p-value of two one-sided t tests (Schuirmann) of -margin < mean < margin: the larger of the
    two one-sided p-values; below ALPHA, the 90% t interval lies inside (-margin, margin)."""
    xs = [float(x) for x in xs if x is not None]
    if len(xs) < 2 or not margin > 0:
        return None
    m, sd = math.fsum(xs) / len(xs), sample_sd(xs)
    if sd == 0.0:
        return 0.0 if abs(m) < margin else 1.0
    se = sd / math.sqrt(len(xs))
    return max(1.0 - t_cdf((m + margin) / se, len(xs) - 1), t_cdf((m - margin) / se, len(xs) - 1))


def _log_comb(n: int, k: int) -> float:
    return math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)


def fisher_exact(k1: int, n1: int, k2: int, n2: int) -> float:
    """Two-sided p-value of Fisher's exact test of k1/n1 vs k2/n2: the sum of the hypergeometric probabilities
    (margins fixed) of every table no more likely than the observed one (R's and scipy's convention, with a
    1e-7 relative tolerance for ties)."""
    if not (0 <= k1 <= n1 and 0 <= k2 <= n2):
        raise ValueError(f"fisher_exact needs 0 <= k <= n, got {k1}/{n1} and {k2}/{n2}")
    total, ks = n1 + n2, k1 + k2
    lo, hi = max(0, ks - n2), min(ks, n1)
    logp = {x: _log_comb(n1, x) + _log_comb(n2, ks - x) - _log_comb(total, ks) for x in range(lo, hi + 1)}
    cut = logp[k1] + math.log1p(1e-7)
    return min(1.0, math.fsum(math.exp(v) for v in logp.values() if v <= cut))


def holm(ps: list[float | None]) -> list[float | None]:
    """Holm's step-down adjusted p-values (same order; None stays None and is not counted): the i-th smallest of m
    p-values times (m - i), made monotone and capped at 1. Rejecting where the adjusted p < ALPHA controls the
    chance of any false 'detected' in the family at ALPHA."""
    idx = sorted((i for i, p in enumerate(ps) if p is not None), key=lambda i: ps[i])
    out: list[float | None] = [None] * len(ps)
    running, m = 0.0, len(idx)
    for rank, i in enumerate(idx):
        running = max(running, min(1.0, (m - rank) * ps[i]))
        out[i] = running
    return out


def detectable(diff: Interval) -> float | None:
    """The smallest true paired difference this design would detect with probability POWER at the 95% level:
    (t_0.975 + t_POWER) x sd / sqrt(n), with sd / sqrt(n) read off the interval's half-width."""
    if diff.half_width is None or diff.n < 2:
        return None
    t_a = t_quantile(0.975, diff.n - 1)
    return diff.half_width * (1.0 + t_quantile(POWER, diff.n - 1) / t_a)
