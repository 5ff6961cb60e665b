"""Statistics over independently launched deployments (repeats): Student t intervals via scipy.

Requests inside one deployment are not independent replicates, so every interval here is over per-deployment
(per-repeat) values, never requests. Why t and not the bootstrap: campaigns have 2-5 repeats, and a percentile
bootstrap of the mean of n values covers 50% at n = 2 and 82% at n = 5 for a nominal 95%
(benchmarks/interval_coverage.py, docs/analysis.md); t intervals hold their level at every n because they pay
for the unknown spread with t(n - 1) quantiles (12.7 at n = 2: two repeats give a wide interval, honestly).
Ratios (speedups) are treated on the log scale, where run-to-run noise is multiplicative and symmetric: the
estimate is the geometric mean and the interval exp(mean +- t s / sqrt(n)) of the log-ratios.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats


@dataclass(frozen=True)
class Interval:
    estimate: float
    low: float
    high: float
    n: int
    method: str

    def excludes(self, value: float) -> bool:
        return self.low > value or self.high < value


def percent(confidence: float) -> str:
    """0.95 -> '95%', 0.975 -> '97.5%' (a format of .0% would print 98%)."""
    return f"{confidence * 100:g}%"


def _t_bounds(values: np.ndarray, confidence: float) -> tuple[float, float, float]:
    """mean, low, high of the Student t interval of the mean of `values` (n - 1 degrees of freedom)."""
    n = len(values)
    mean = float(values.mean())
    half = float(stats.t.ppf(0.5 + confidence / 2, n - 1)) * float(values.std(ddof=1)) / math.sqrt(n)
    return mean, mean - half, mean + half


def _too_few(values: np.ndarray, estimate: float) -> Interval | None:
    """The point-only answers: fewer than two repeats, or repeats that are all equal (no spread to scale)."""
    if len(values) < 2:
        return Interval(estimate, estimate, estimate, len(values), "point (fewer than 2 repeats)")
    if np.allclose(values, values[0], rtol=0, atol=1e-12):
        return Interval(estimate, estimate, estimate, len(values), "degenerate (all repeats equal)")
    return None


def mean_interval(values: Sequence[float], *, confidence: float = 0.95) -> Interval:
    """Student t interval of the mean of per-repeat values (e.g. step times, one per repeat)."""
    v = np.asarray(values, dtype=float)
    estimate = float(v.mean())
    if (point := _too_few(v, estimate)) is not None:
        return point
    mean, low, high = _t_bounds(v, confidence)
    return Interval(mean, low, high, len(v), f"t {percent(confidence)}")


def ratio_interval(ratios: Sequence[float], *, confidence: float = 0.95) -> Interval:
    """Geometric mean of per-repeat ratios (each > 0, e.g. paired speedups) with the Student t interval of
    the log-ratios, mapped back: exp(mean(log r) +- t(n - 1) s / sqrt(n))."""
    r = np.asarray(ratios, dtype=float)
    if (r <= 0).any():
        raise ValueError(f"ratios must be positive: {r.tolist()}")
    logs = np.log(r)
    estimate = math.exp(float(logs.mean()))
    if (point := _too_few(logs, estimate)) is not None:
        return point
    mean, low, high = _t_bounds(logs, confidence)
    return Interval(
        math.exp(mean), math.exp(low), math.exp(high), len(r), f"t on log-ratios {percent(confidence)}"
    )


def ratio_of_means_interval(
    treatment: Sequence[float], baseline: Sequence[float], *, confidence: float = 0.95
) -> Interval:
    """Ratio of the geometric means of two independent samples of per-repeat values (treatment / baseline),
    with Welch's t interval of the difference of their log means (unequal spreads, Welch-Satterthwaite df).

    With fewer than two values on either side no interval can be drawn: low = high = the point estimate
    and method says so, so callers can tell "no evidence" from "a tight interval".
    """
    t = np.log(np.asarray(treatment, dtype=float))
    b = np.log(np.asarray(baseline, dtype=float))
    estimate = math.exp(float(t.mean() - b.mean()))
    if len(t) < 2 or len(b) < 2:
        return Interval(estimate, estimate, estimate, min(len(t), len(b)), "point (fewer than 2 repeats)")
    vt, vb = float(t.var(ddof=1)) / len(t), float(b.var(ddof=1)) / len(b)
    if vt + vb == 0:
        return Interval(estimate, estimate, estimate, min(len(t), len(b)), "degenerate (all repeats equal)")
    df = (vt + vb) ** 2 / ((vt**2 / (len(t) - 1) if vt else 0.0) + (vb**2 / (len(b) - 1) if vb else 0.0))
    half = float(stats.t.ppf(0.5 + confidence / 2, df)) * math.sqrt(vt + vb)
    log_ratio = math.log(estimate)
    return Interval(
        estimate,
        math.exp(log_ratio - half),
        math.exp(log_ratio + half),
        min(len(t), len(b)),
        f"Welch t on logs {percent(confidence)}",
    )


def per_repeat_interval(
    estimate: float, per_repeat: Sequence[float], *, confidence: float = 0.95
) -> Interval:
    """For a figure each repeat yields on its own (a crossover load, a break-even length): `estimate` (what
    the mean curve gives) with the Student t interval of the per-repeat values. A repeat whose value is not
    finite (it never crossed within the measured range) gives no interval: there is nothing to average."""
    values = np.asarray(per_repeat, dtype=float)
    if len(values) < 2:
        return Interval(estimate, estimate, estimate, len(values), "point (fewer than 2 repeats)")
    if not np.isfinite(values).all():
        return Interval(estimate, math.nan, math.nan, len(values), "a repeat does not cross: no interval")
    if np.allclose(values, values[0], rtol=0, atol=1e-12):
        return Interval(estimate, estimate, estimate, len(values), "degenerate (all repeats equal)")
    _, low, high = _t_bounds(values, confidence)
    return Interval(estimate, low, high, len(values), f"t over per-repeat values {percent(confidence)}")


# ------------------------------------------------------------------------------------------------ additions

NO_INTERVAL = "n=1, no interval"


def interval_label(interval: Interval) -> str:
    """How a table names an interval's basis: the method, or that there is none (one repeat)."""
    if interval.n < 2:
        return f"n={interval.n}, no interval"
    return f"n={interval.n}, {interval.method}"


def has_interval(interval: Interval) -> bool:
    """True when the interval rests on at least two independently launched deployments and has bounds."""
    return interval.n >= 2 and math.isfinite(interval.low) and math.isfinite(interval.high)


@dataclass(frozen=True)
class LinearFit:
    """y = intercept + slope * x by least squares (scipy.stats.linregress), with t-based intervals."""

    n: int
    slope: float | None
    slope_low: float | None
    slope_high: float | None
    intercept: float | None
    intercept_low: float | None
    intercept_high: float | None
    r2: float | None
    p_value: float | None
    note: str

    @property
    def fitted(self) -> bool:
        return self.slope is not None


def linear_fit(x: Sequence[float], y: Sequence[float], *, confidence: float = 0.95) -> LinearFit:
    """Least-squares line with confidence intervals for slope and intercept (Student t, n - 2 degrees of
    freedom) and R². Fewer than three points, or an x that does not vary, give no fit (`note` says why)."""
    xs = np.asarray(x, dtype=float)
    ys = np.asarray(y, dtype=float)
    keep = np.isfinite(xs) & np.isfinite(ys)
    xs, ys = xs[keep], ys[keep]
    n = len(xs)
    if n < 3:
        return LinearFit(n, None, None, None, None, None, None, None, None, f"n={n}: a fit needs 3 points")
    if np.ptp(xs) == 0:
        return LinearFit(n, None, None, None, None, None, None, None, None, "the predictor does not vary")
    result = stats.linregress(xs, ys)
    t = float(stats.t.ppf(0.5 + confidence / 2, n - 2))
    slope_se = float(result.stderr)
    intercept_se = float(result.intercept_stderr)
    return LinearFit(
        n=n,
        slope=float(result.slope),
        slope_low=float(result.slope) - t * slope_se,
        slope_high=float(result.slope) + t * slope_se,
        intercept=float(result.intercept),
        intercept_low=float(result.intercept) - t * intercept_se,
        intercept_high=float(result.intercept) + t * intercept_se,
        r2=float(result.rvalue**2) if np.isfinite(result.rvalue) else None,
        p_value=float(result.pvalue) if np.isfinite(result.pvalue) else None,
        note=f"least squares, {percent(confidence)} t interval, {n - 2} df",
    )
