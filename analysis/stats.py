"""Statistics over independently launched deployments (repeats): bootstrap intervals via scipy.

Requests inside one deployment are not independent replicates, so every interval here resamples
per-deployment (per-repeat) values, never requests.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

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


def _bootstrap(
    estimate: float,
    samples: tuple[np.ndarray, ...],
    statistic: Callable[..., Any],
    *,
    n: int,
    confidence: float,
    seed: int,
    resamples: int,
    **options: Any,
) -> Interval:
    """The percentile bootstrap interval of `statistic` over `samples` (scipy.stats.bootstrap; `options`
    passes on e.g. vectorized/paired), reproducible from `seed`."""
    result = stats.bootstrap(
        samples,
        statistic,
        **options,
        confidence_level=confidence,
        n_resamples=resamples,
        method="percentile",
        random_state=np.random.default_rng(seed),
    )
    return Interval(
        estimate,
        float(result.confidence_interval.low),
        float(result.confidence_interval.high),
        n,
        f"bootstrap percentile {confidence:.0%}",
    )


def ratio_of_means_interval(
    treatment: Sequence[float],
    baseline: Sequence[float],
    *,
    confidence: float = 0.95,
    seed: int = 0,
    resamples: int = 9999,
) -> Interval:
    """Interval for mean(treatment) / mean(baseline), two independent samples of per-repeat values.

    With fewer than two values on either side no interval can be drawn: low = high = the point estimate
    and method says so, so callers can tell "no evidence" from "a tight interval".
    """
    t = np.asarray(treatment, dtype=float)
    b = np.asarray(baseline, dtype=float)
    estimate = float(t.mean() / b.mean())
    if len(t) < 2 or len(b) < 2:
        return Interval(estimate, estimate, estimate, min(len(t), len(b)), "point (fewer than 2 repeats)")
    if np.ptp(t) == 0 and np.ptp(b) == 0:  # scipy's bootstrap returns NaN for a constant distribution
        return Interval(estimate, estimate, estimate, min(len(t), len(b)), "degenerate (all repeats equal)")
    return _bootstrap(
        estimate,
        (t, b),
        lambda x, y, axis=-1: np.mean(x, axis=axis) / np.mean(y, axis=axis),
        n=min(len(t), len(b)),
        confidence=confidence,
        seed=seed,
        resamples=resamples,
        vectorized=True,
        paired=False,
    )


def mean_interval(
    values: Sequence[float], *, confidence: float = 0.95, seed: int = 0, resamples: int = 9999
) -> Interval:
    """Bootstrap interval of the mean of per-repeat values (e.g. paired speedups, one per repeat)."""
    v = np.asarray(values, dtype=float)
    estimate = float(v.mean())
    if len(v) < 2:
        return Interval(estimate, estimate, estimate, len(v), "point (fewer than 2 repeats)")
    if np.allclose(v, v[0]):
        return Interval(estimate, estimate, estimate, len(v), "degenerate (all repeats equal)")
    return _bootstrap(
        estimate, (v,), np.mean, n=len(v), confidence=confidence, seed=seed, resamples=resamples
    )


# ------------------------------------------------------------------------------------------------ additions

NO_INTERVAL = "n=1, no interval"


def interval_label(interval: Interval) -> str:
    """How a table names an interval's basis: the method, or that there is none (one repeat)."""
    if interval.n < 2:
        return f"n={interval.n}, no interval"
    return f"n={interval.n}, {interval.method}"


def has_interval(interval: Interval) -> bool:
    """True when the interval rests on at least two independently launched deployments."""
    return interval.n >= 2


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
        note=f"least squares, {confidence:.0%} t interval, {n - 2} df",
    )


def unit_bootstrap(
    n_units: int,
    statistic: Callable[[np.ndarray], float],
    *,
    confidence: float = 0.95,
    seed: int = 0,
    resamples: int = 2999,
) -> Interval:
    """Percentile interval of any statistic of whole units (e.g. repeats, each a deployment that served every
    load), resampled with replacement by scipy.stats.bootstrap over the unit indices.

    `statistic(indices)` gets an integer array of unit indices (with repeats) and may return +-inf (e.g. "no
    crossing within the measured range"); quantiles are then taken without interpolating (inverted CDF), so
    an infinite bound means the interval is open on that side.
    """
    estimate = float(statistic(np.arange(n_units)))
    if n_units < 2:
        return Interval(estimate, estimate, estimate, n_units, "point (fewer than 2 repeats)")

    def on_indices(sample: np.ndarray) -> float:
        return float(statistic(np.asarray(sample).astype(int)))

    with np.errstate(invalid="ignore"):
        result = stats.bootstrap(
            (np.arange(n_units),),
            on_indices,
            vectorized=False,
            n_resamples=resamples,
            method="percentile",
            confidence_level=confidence,
            random_state=np.random.default_rng(seed),
        )
    distribution = np.asarray(result.bootstrap_distribution, dtype=float)
    distribution = distribution[~np.isnan(distribution)]
    if not len(distribution):
        return Interval(estimate, float("nan"), float("nan"), n_units, "bootstrap gave no value")
    tail = (1 - confidence) / 2
    low = float(np.quantile(distribution, tail, method="inverted_cdf"))
    high = float(np.quantile(distribution, 1 - tail, method="inverted_cdf"))
    return Interval(estimate, low, high, n_units, f"bootstrap percentile {confidence:.0%} over repeats")
