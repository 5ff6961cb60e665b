"""Statistics over independently launched deployments (repeats): bootstrap intervals via scipy.

Requests inside one deployment are not independent replicates, so every interval here resamples
per-deployment (per-repeat) values, never requests.
"""

from __future__ import annotations

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


def ratio_of_means_interval(
    treatment: Sequence[float], baseline: Sequence[float], *, confidence: float = 0.95, seed: int = 0,
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
    result = stats.bootstrap(
        (t, b), lambda x, y, axis=-1: np.mean(x, axis=axis) / np.mean(y, axis=axis), vectorized=True,
        paired=False, confidence_level=confidence, n_resamples=resamples, method="percentile",
        random_state=np.random.default_rng(seed),
    )
    return Interval(estimate, float(result.confidence_interval.low), float(result.confidence_interval.high),
                    min(len(t), len(b)), f"bootstrap percentile {confidence:.0%}")


def mean_interval(values: Sequence[float], *, confidence: float = 0.95, seed: int = 0,
                  resamples: int = 9999) -> Interval:
    """Bootstrap interval of the mean of per-repeat values (e.g. paired speedups, one per repeat)."""
    v = np.asarray(values, dtype=float)
    estimate = float(v.mean())
    if len(v) < 2:
        return Interval(estimate, estimate, estimate, len(v), "point (fewer than 2 repeats)")
    if np.allclose(v, v[0]):
        return Interval(estimate, estimate, estimate, len(v), "degenerate (all repeats equal)")
    result = stats.bootstrap((v,), np.mean, confidence_level=confidence, n_resamples=resamples,
                             method="percentile", random_state=np.random.default_rng(seed))
    return Interval(estimate, float(result.confidence_interval.low), float(result.confidence_interval.high), len(v),
                    f"bootstrap percentile {confidence:.0%}")
