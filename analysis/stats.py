"""Statistics over independently launched deployments (repeats): Student t intervals via scipy.

Requests inside one deployment are not independent replicates, so every interval on a speed here is over
per-deployment (per-repeat) values, never requests. Why t and not the bootstrap: campaigns have 2-5 repeats,
and a percentile bootstrap of the mean of n values covers 50% at n = 2 and 82% at n = 5 for a nominal 95%
(benchmarks/interval_coverage.py, docs/analysis.md); t intervals hold their level at every n because they pay
for the unknown spread with t(n - 1) quantiles (12.7 at n = 2: two repeats give a wide interval, honestly).
Ratios (speedups) are treated on the log scale, where run-to-run noise is multiplicative and symmetric: the
estimate is the geometric mean and the interval exp(mean +- t s / sqrt(n)) of the log-ratios.

Two additions pay for the few launches differently:

- `pooled_ratio_interval`: the launch-to-launch variance is taken from past campaigns of the same launcher,
  host class and model (`LaunchVariance`, pooled with today's), so two launches give a usable interval and
  one launch gives one at all. It is only as good as the history is like today (see its docstring).
- `cluster_ratio_interval`: acceptance (mean acceptance length, acceptance rate) is identical in every launch
  under greedy decoding, so its spread is between prompts: a bootstrap over prompts (clusters of requests).

An answer without an interval keeps low == high == the estimate (NaN bounds where no value is defined) and a
method that ends in "no interval"; `has_interval` is True only for finite bounds with high > low.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, TypedDict, Unpack

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


POINT = "point (fewer than 2 repeats): no interval"
DEGENERATE = "degenerate (all repeats equal): no interval"


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
        return Interval(estimate, estimate, estimate, len(values), POINT)
    if np.allclose(values, values[0], rtol=0, atol=1e-12):
        return Interval(estimate, estimate, estimate, len(values), DEGENERATE)
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
    with Student's two-sample t interval of the difference of their log means (one launch-to-launch variance
    pooled over both samples, n_t + n_b - 2 df): both are launches of one configuration, so their spreads are
    one. Welch's interval, used until issue 30, covered 97-98% at 2-3 repeats (too wide); this one 95%
    (benchmarks/interval_coverage.py, docs/analysis.md).

    With fewer than two values on either side no interval can be drawn: low = high = the point estimate
    and method says so, so callers can tell "no evidence" from "a tight interval".
    """
    t = np.log(np.asarray(treatment, dtype=float))
    b = np.log(np.asarray(baseline, dtype=float))
    estimate = math.exp(float(t.mean() - b.mean()))
    if len(t) < 2 or len(b) < 2:
        return Interval(estimate, estimate, estimate, min(len(t), len(b)), POINT)
    df = len(t) + len(b) - 2
    pooled = (float(((t - t.mean()) ** 2).sum()) + float(((b - b.mean()) ** 2).sum())) / df
    if pooled == 0:
        return Interval(estimate, estimate, estimate, min(len(t), len(b)), DEGENERATE)
    half = float(stats.t.ppf(0.5 + confidence / 2, df)) * math.sqrt(pooled * (1 / len(t) + 1 / len(b)))
    log_ratio = math.log(estimate)
    return Interval(
        estimate,
        math.exp(log_ratio - half),
        math.exp(log_ratio + half),
        min(len(t), len(b)),
        f"Student t on logs, pooled variance {percent(confidence)}",
    )


def per_repeat_interval(
    estimate: float, per_repeat: Sequence[float], *, confidence: float = 0.95
) -> Interval:
    """For a figure each repeat yields on its own (a crossover load, a break-even length): `estimate` (what
    the mean curve gives) with the Student t interval of the per-repeat values. A repeat whose value is not
    finite (it never crossed within the measured range) gives no interval: there is nothing to average."""
    values = np.asarray(per_repeat, dtype=float)
    if len(values) < 2:
        return Interval(estimate, estimate, estimate, len(values), POINT)
    if not np.isfinite(values).all():
        return Interval(estimate, math.nan, math.nan, len(values), "a repeat does not cross: no interval")
    if np.allclose(values, values[0], rtol=0, atol=1e-12):
        return Interval(estimate, estimate, estimate, len(values), DEGENERATE)
    _, low, high = _t_bounds(values, confidence)
    return Interval(estimate, low, high, len(values), f"t over per-repeat values {percent(confidence)}")


# ------------------------------------------------------------------------------------------------ additions

NO_INTERVAL = "n=1, no interval"


def interval_label(interval: Interval) -> str:
    """How a table names an interval's basis, always with its n: "n=3, t on log-ratios 95%", "n=1, no
    interval" (one repeat, nothing else to say), "n=3, degenerate (all repeats equal): no interval"."""
    drawn = has_interval(interval)
    if not drawn and interval.n < 2:
        return f"n={interval.n}, no interval"
    method = interval.method
    if not drawn and not method.endswith("no interval"):
        method += ": no interval"
    return f"n={interval.n}, {method}"


def has_interval(interval: Interval) -> bool:
    """True only for an interval with finite bounds and positive width (high > low), whatever its n (a pooled
    interval may rest on one launch). Zero-width answers (one repeat, all repeats equal) are no evidence."""
    return math.isfinite(interval.low) and math.isfinite(interval.high) and interval.high > interval.low


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


# ------------------------------------------------------------------------- pooled launch-to-launch variance


@dataclass(frozen=True)
class LaunchVariance:
    """The launch-to-launch variance of log(per-launch output throughput) within one cell (one arm), estimated
    from past campaigns of the same launcher, host class and model (the warehouse's query; `pooled_variance`
    is its arithmetic)."""

    variance: float  # of log(per-launch value) across launches of one cell (one arm)
    df: int  # pooled degrees of freedom, sum over history cells of (launches - 1)
    campaigns: int  # how many past campaigns it came from
    first: str  # ISO date of the oldest, e.g. "2026-11-30"
    last: str  # ISO date of the newest
    source: str = "plain repeats and A/A pairs"

    def label(self) -> str:
        """'launch variance pooled from 14 campaigns (2026-11-30..2026-12-04)'."""
        plural = "" if self.campaigns == 1 else "s"
        return f"launch variance pooled from {self.campaigns} campaign{plural} ({self.first}..{self.last})"


def pooled_variance(groups: Sequence[Sequence[float]]) -> tuple[float, int]:
    """(pooled variance of the logs, df) over groups of per-launch values (each group = one cell's launches;
    groups with < 2 values add nothing): sum of (k - 1) s_k^2 over sum of (k - 1). (NaN, 0) without any."""
    squares, df = 0.0, 0
    for group in groups:
        values = np.asarray(group, dtype=float)
        if len(values) < 2:
            continue
        if not (np.isfinite(values).all() and (values > 0).all()):
            raise ValueError(f"per-launch values must be positive and finite: {values.tolist()}")
        logs = np.log(values)
        squares += float(((logs - logs.mean()) ** 2).sum())
        df += len(values) - 1
    return (squares / df if df else math.nan), df


def pooled_ratio_interval(
    ratios: Sequence[float], history: LaunchVariance | None, *, confidence: float = 0.95
) -> Interval:
    """Geometric mean of paired per-launch ratios (two arms, each launched once per repeat) with a t interval
    whose launch-to-launch variance is pooled from history and today's launches.

    d_i = log(ratio_i); with both arms sharing the launch variance sigma^2, var(d) = 2 sigma^2. Pooled
    sigma^2 = (df_h v_h + (n - 1) s_d^2 / 2) / (df_h + n - 1) (today's term only with n >= 2); halfwidth =
    t(df_h + n - 1) sqrt(2 sigma^2 / n); estimate exp(mean d), bounds exp(mean d +- halfwidth). One launch per
    arm gives an interval. Without history (None, or df < 1, or a non-finite variance) this is
    `ratio_interval`.

    The interval is exactly as good as the assumption that today's launch variance is the history's. History
    has far more degrees of freedom than today (14-28 against 1-2), so it sets the width: if today's launches
    vary more than history's (another host class, a noisy neighbour, a speculative arm noisier than the plain
    and A/A launches the history measures), the interval is too narrow and covers less than its nominal
    level. With history sigma half of today's it covers 69-79% instead of 95% (73% at two launches;
    benchmarks/interval_coverage.py, "history sigma half today's"); the pooled df does not protect against
    this, and with n = 1-2 today's own spread cannot detect it. With history like today it covers 94-96%
    at 1-6 launches, at about a fifth of the t interval's width at two launches. Hence history only from
    the same launcher, host class and model, and recent.
    """
    if history is None or history.df < 1 or not math.isfinite(history.variance):
        return ratio_interval(ratios, confidence=confidence)
    if history.variance < 0:
        raise ValueError(f"a variance cannot be negative: {history.variance}")
    r = np.asarray(ratios, dtype=float)
    if len(r) == 0:
        raise ValueError("no ratios")
    if (r <= 0).any() or not np.isfinite(r).all():
        raise ValueError(f"ratios must be positive and finite: {r.tolist()}")
    d = np.log(r)
    n = len(d)
    mean = float(d.mean())
    df = history.df + n - 1
    squares = history.df * history.variance + ((n - 1) * float(d.var(ddof=1)) / 2 if n >= 2 else 0.0)
    half = float(stats.t.ppf(0.5 + confidence / 2, df)) * math.sqrt(2 * (squares / df) / n)
    estimate = math.exp(mean)
    if half == 0:
        return Interval(estimate, estimate, estimate, n, DEGENERATE)
    return Interval(
        estimate,
        math.exp(mean - half),
        math.exp(mean + half),
        n,
        f"t on log-ratios, {history.label()} {percent(confidence)}",
    )


# ------------------------------------------------------------------------- weighted sums of log-ratios


@dataclass(frozen=True)
class LogRatio:
    """A geometric-mean ratio on the log scale: the mean log-ratio, its standard error and the t degrees of
    freedom that `ratio_interval` (with history: `pooled_ratio_interval`) draws its interval with; se 0 and
    df 0 where those draw none (one repeat without history, all repeats equal)."""

    mean: float
    se: float
    df: float
    n: int

    @property
    def drawn(self) -> bool:
        return self.df >= 1 and self.se > 0


def log_ratio(ratios: Sequence[float], history: LaunchVariance | None = None) -> LogRatio:
    """The mean log of per-repeat paired ratios with the standard error and df of `pooled_ratio_interval`
    (`ratio_interval` without usable history), so that an interval drawn from it is theirs."""
    r = np.asarray(ratios, dtype=float)
    if len(r) == 0 or (r <= 0).any() or not np.isfinite(r).all():
        raise ValueError(f"ratios must be positive and finite: {r.tolist()}")
    d = np.log(r)
    n = len(d)
    mean = float(d.mean())
    if history is not None and history.df >= 1 and math.isfinite(history.variance) and history.variance >= 0:
        df = history.df + n - 1
        squares = history.df * history.variance + ((n - 1) * float(d.var(ddof=1)) / 2 if n >= 2 else 0.0)
        return LogRatio(mean, math.sqrt(2 * (squares / df) / n), float(df), n)
    if n < 2 or np.allclose(d, d[0], rtol=0, atol=1e-12):
        return LogRatio(mean, 0.0, 0.0, n)
    return LogRatio(mean, float(d.std(ddof=1)) / math.sqrt(n), float(n - 1), n)


def weighted_ratio_interval(parts: Sequence[tuple[float, LogRatio]], *, confidence: float = 0.95) -> Interval:
    """exp(sum_i w_i m_i) over INDEPENDENT log-ratio estimates m_i (from separate launches), with the t
    interval of that weighted sum: variance sum_i w_i^2 se_i^2, degrees of freedom by Welch-Satterthwaite,
    (sum_i w_i^2 se_i^2)^2 / sum_i (w_i^2 se_i^2)^2 / df_i. One part of weight 1 gives its own interval back.
    Parts of weight 0 are left out; a weighted part without an interval leaves the sum without one (a point's
    spread is unknown, not nil). n: the fewest repeats of a weighted part. Estimates that share launches are
    not independent: combine them per launch first (analysis.options)."""
    used = [(float(w), part) for w, part in parts if w > 0]
    if not used:
        raise ValueError("no part with a positive weight")
    mean = sum(w * part.mean for w, part in used)
    estimate = math.exp(mean)
    n = min(part.n for _, part in used)
    if not all(part.drawn for _, part in used):
        return Interval(estimate, estimate, estimate, n, "a weighted part without an interval: no interval")
    terms = [((w * part.se) ** 2, part.df) for w, part in used]
    variance = sum(term for term, _ in terms)
    df = variance**2 / sum(term**2 / part_df for term, part_df in terms)
    half = float(stats.t.ppf(0.5 + confidence / 2, df)) * math.sqrt(variance)
    return Interval(
        estimate,
        math.exp(mean - half),
        math.exp(mean + half),
        n,
        f"t on weighted log-ratios ({df:.1f} df, Welch-Satterthwaite) {percent(confidence)}",
    )


# ------------------------------------------------------------------- prompt-clustered bootstrap of a ratio

CLUSTER_VARIANTS = (
    "percentile",
    "BCa",
    "bootstrap-t (delta SE)",
    "bootstrap-t on logs (delta SE)",
    "bootstrap-t (jackknife SE)",
    "symmetric bootstrap-t (jackknife SE)",
    "delta t",
)
# chosen by coverage (benchmarks/interval_coverage.py, docs/analysis.md: interval coverage)
CLUSTER_VARIANT = "symmetric bootstrap-t (jackknife SE)"


class ClusterOptions(TypedDict, total=False):
    """The options of `cluster_ratio_intervals` that `cluster_ratio_interval` passes on (its defaults)."""

    offset: float
    confidence: float
    resamples: int
    seed: int
    min_clusters: int
    unit: str
    ceiling: float | None


def cluster_ratio_interval(
    numerator: Sequence[float],
    denominator: Sequence[float],
    clusters: Sequence[str],
    launches: Sequence[str] | None = None,
    **options: Unpack[ClusterOptions],
) -> Interval:
    """offset + sum(numerator) / sum(denominator) over requests (rows), with a bootstrap interval over
    clusters (prompts): mean acceptance length = 1 + sum(accepted) / sum(verify steps) (offset 1), acceptance
    rate = sum(accepted) / sum(drafted). n = the number of clusters.

    Under greedy decoding every launch gives the same acceptance, so intervals over launches are degenerate;
    the spread that generalises is between prompts. Rows are summed to (launch, cluster) totals; a resample
    draws clusters with replacement, each carrying its rows of every launch; with 3 or more distinct launches
    it first draws launches, then clusters (two-stage). Vectorised: a resample is a row of cluster counts, the
    sums are matrix products (2000 resamples of 64 clusters take a few milliseconds).

    The interval is the symmetric bootstrap-t studentized by the leave-one-cluster-out jackknife standard
    error: estimate +- q se_jack, q the `confidence` quantile of |t*| over resamples. Chosen by coverage on
    prompts with Beta(2, 2) acceptance and heavy-tailed lengths (benchmarks/interval_coverage.py,
    docs/analysis.md: interval coverage): it held 93-96% from 4 to 48 prompts, where the percentile and
    BCa intervals covered 76-86% at 4-8 prompts and 87-93% at 16-48, the delta-method t 84-93%, the
    equal-tailed bootstrap-t with the delta-method SE 91-95% and with the jackknife SE 92-95%. At 4-8
    prompts its intervals are about as wide as the MAL itself, so they rarely decide anything there.

    Fewer than `min_clusters` clusters (5: the bootstrap of fewer has too few distinct resamples to trust,
    although the benchmark's 4 prompts still covered), no denominator (estimate NaN), or every cluster with
    the same ratio give no interval (low == high, the method says why)."""
    found = cluster_ratio_intervals(
        numerator, denominator, clusters, launches, variants=(CLUSTER_VARIANT,), **options
    )
    return found if isinstance(found, Interval) else found[CLUSTER_VARIANT]


def _codes(labels: Sequence[str], rows: int, what: str) -> tuple[np.ndarray, int]:
    if len(labels) != rows:
        raise ValueError(f"{what}: {len(labels)} labels for {rows} rows")
    _, codes = np.unique(np.asarray(labels, dtype=str), return_inverse=True)
    return codes.ravel(), int(codes.max()) + 1 if rows else 0


def _counts(draws: np.ndarray, size: int) -> np.ndarray:
    """Per resample (row of `draws`, indices in [0, size)), how often each index was drawn: (B, size)."""
    b = draws.shape[0]
    flat = (draws + size * np.arange(b)[:, None]).ravel()
    return np.bincount(flat, minlength=b * size).reshape(b, size).astype(float)


def _finite_rows(
    numerator: Sequence[float], denominator: Sequence[float], what: str
) -> tuple[np.ndarray, np.ndarray]:
    """The rows' numerators and denominators as float arrays of one shape, refused when not finite."""
    num = np.asarray(numerator, dtype=float)
    den = np.asarray(denominator, dtype=float)
    if num.shape != den.shape or num.ndim != 1:
        raise ValueError(f"{what}numerator and denominator differ in shape: {num.shape} {den.shape}")
    if not (np.isfinite(num).all() and np.isfinite(den).all()):
        raise ValueError(f"{what}numerator and denominator must be finite")
    return num, den


def _same_ratio_everywhere(per_cluster: np.ndarray) -> bool:
    """Every cluster has the same ratio (to rounding): a bootstrap over them has no spread to show."""
    return bool(np.ptp(per_cluster) <= 1e-12 * max(1.0, abs(float(per_cluster.mean()))))


def _resampled_jackknife_se(w: np.ndarray, loo: np.ndarray, c: int) -> np.ndarray:
    """Per resample, the jackknife standard error from its leave-one-cluster-out values `loo` (B, c), each
    cluster weighted by how often the resample drew it (`w`; undrawn clusters count for nothing)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        loo = np.where(w > 0, loo, 0.0)
        mean_loo = (w * loo).sum(1) / c
        return np.sqrt((c - 1) / c * (w * (loo - mean_loo[:, None]) ** 2).sum(1))


def _delta_se(c: int, sum_s: float | np.ndarray, resid_sq: float | np.ndarray) -> np.ndarray:
    # linearised variance of a ratio of cluster sums: c / (c - 1) * sum (a_i - r s_i)^2 / (sum s)^2
    return np.sqrt(c / (c - 1) * resid_sq) / sum_s


def _jackknife_se(jack: np.ndarray, c: int) -> float:
    """The leave-one-cluster-out jackknife standard error of the estimate itself."""
    return math.sqrt((c - 1) / c * float(((jack - jack.mean()) ** 2).sum()))


@dataclass(frozen=True)
class _ClusterBootstrap:
    """A ratio of cluster sums and its resamples: what every CLUSTER_VARIANTS interval is drawn from."""

    a: np.ndarray  # per cluster: numerator total over all launches
    s: np.ndarray  # per cluster: denominator total over all launches
    ratio: float  # sum a / sum s
    total: float  # sum s
    se: float  # the delta-method standard error of the ratio
    w: np.ndarray  # (B, c): how often each resample drew each cluster
    a_b: np.ndarray  # (B, c) cluster totals over each resample's drawn launches ((1, c): all launches)
    s_b: np.ndarray
    sum_a: np.ndarray  # (B,): each resample's sums
    sum_s: np.ndarray
    boot: np.ndarray  # (B,): each resample's ratio (inf or NaN where it drew no denominator)
    confidence: float

    @property
    def c(self) -> int:
        return len(self.a)

    @property
    def alpha(self) -> float:
        return 1 - self.confidence

    @property
    def level(self) -> float:
        return 0.5 + self.confidence / 2

    @property
    def kept(self) -> np.ndarray:
        """The resamples with a finite ratio."""
        return self.boot[np.isfinite(self.boot)]

    def resampled_resid_sq(self) -> np.ndarray:
        """Per resample, sum over its drawn clusters of (a_i - r* s_i)^2 (r* the resample's ratio)."""
        return (self.w * (self.a_b - self.boot[:, None] * self.s_b) ** 2).sum(1)


def _bootstrap_clusters(
    a_lc: np.ndarray, s_lc: np.ndarray, confidence: float, resamples: int, seed: int
) -> _ClusterBootstrap:
    """Resample clusters (with 3 or more launches, launches first, then clusters) from the (launch, cluster)
    totals. Vectorised: a resample is a row of cluster counts and its sums are matrix products."""
    n_launches, c = a_lc.shape
    a, s = a_lc.sum(0), s_lc.sum(0)
    total = float(s.sum())
    ratio = float(a.sum()) / total
    rng = np.random.default_rng(seed)
    w = _counts(rng.integers(0, c, (resamples, c)), c)
    if n_launches >= 3:
        v = _counts(rng.integers(0, n_launches, (resamples, n_launches)), n_launches)
        a_b, s_b = v @ a_lc, v @ s_lc  # (B, C): each resample's cluster totals over its drawn launches
        sum_a, sum_s = (w * a_b).sum(1), (w * s_b).sum(1)
    else:
        a_b, s_b = a[None, :], s[None, :]
        sum_a, sum_s = w @ a, w @ s
    with np.errstate(divide="ignore", invalid="ignore"):
        boot = sum_a / sum_s
    se = float(_delta_se(c, total, float(((a - ratio * s) ** 2).sum())))
    return _ClusterBootstrap(a, s, ratio, total, se, w, a_b, s_b, sum_a, sum_s, boot, confidence)


def _percentile_bounds(fit: _ClusterBootstrap) -> tuple[float, float]:
    low, high = np.quantile(fit.kept, [fit.alpha / 2, fit.level])
    return low, high


def _bca_bounds(fit: _ClusterBootstrap) -> tuple[float, float]:
    """Bias-corrected and accelerated percentiles, the acceleration from the jackknife over clusters."""
    kept = fit.kept
    below = float(np.mean(kept < fit.ratio) + 0.5 * np.mean(kept == fit.ratio))
    z0 = float(stats.norm.ppf(min(max(below, 1e-9), 1 - 1e-9)))
    with np.errstate(divide="ignore", invalid="ignore"):
        jack = (fit.a.sum() - fit.a) / (fit.total - fit.s)
    jack = jack[np.isfinite(jack)]
    dev = jack.mean() - jack
    spread = float((dev**2).sum())
    accel = float((dev**3).sum()) / (6 * spread**1.5) if spread > 0 else 0.0
    z = stats.norm.ppf([fit.alpha / 2, fit.level])
    adjusted = stats.norm.cdf(z0 + (z0 + z) / (1 - accel * (z0 + z)))
    low, high = np.quantile(kept, adjusted)
    return low, high


def _delta_t_star_bounds(fit: _ClusterBootstrap) -> tuple[float, float]:
    """Bootstrap-t studentized by the delta-method standard error."""
    with np.errstate(divide="ignore", invalid="ignore"):
        t_star = (fit.boot - fit.ratio) / _delta_se(fit.c, fit.sum_s, fit.resampled_resid_sq())
    t_star = t_star[np.isfinite(t_star)]
    q_low, q_high = np.quantile(t_star, [fit.alpha / 2, fit.level])
    return fit.ratio - q_high * fit.se, fit.ratio - q_low * fit.se


def _log_delta_t_star_bounds(fit: _ClusterBootstrap) -> tuple[float, float]:
    """Bootstrap-t on log(ratio) studentized by the delta-method SE (NaN bounds: no log of a ratio <= 0)."""
    ratio, se = fit.ratio, fit.se
    if ratio <= 0:
        return math.nan, math.nan
    resid_sq = fit.resampled_resid_sq()
    # t* = -inf where a resample's ratio is 0; the quantiles keep those
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        t_star = (np.log(fit.boot) - math.log(ratio)) / (_delta_se(fit.c, fit.sum_s, resid_sq) / fit.boot)
        q_low, q_high = np.quantile(t_star[~np.isnan(t_star)], [fit.alpha / 2, fit.level])
        return ratio * np.exp(-q_high * se / ratio), ratio * np.exp(-q_low * se / ratio)


def _jackknife_t_star_bounds(fit: _ClusterBootstrap, symmetric: bool) -> tuple[float, float]:
    """Bootstrap-t studentized by the leave-one-cluster-out jackknife standard error; `symmetric`: estimate
    +- the `confidence` quantile of |t*| times the SE."""
    c = fit.c
    # leave one drawn cluster out: theta_i = (A - a_i) / (S - s_i), each cluster as often as drawn
    with np.errstate(divide="ignore", invalid="ignore"):
        theta = (fit.sum_a[:, None] - fit.a_b) / (fit.sum_s[:, None] - fit.s_b)
        t_star = (fit.boot - fit.ratio) / _resampled_jackknife_se(fit.w, theta, c)
        jack = (fit.a.sum() - fit.a) / (fit.total - fit.s)
    t_star = t_star[np.isfinite(t_star)]
    se_jack = _jackknife_se(jack[np.isfinite(jack)], c)
    if symmetric:
        q_high = float(np.quantile(np.abs(t_star), fit.confidence))
        q_low = -q_high
    else:
        q_low, q_high = np.quantile(t_star, [fit.alpha / 2, fit.level])
    return fit.ratio - q_high * se_jack, fit.ratio - q_low * se_jack


def _delta_t_bounds(fit: _ClusterBootstrap) -> tuple[float, float]:
    """No bootstrap: estimate +- t(c - 1) delta-method standard error."""
    half = float(stats.t.ppf(fit.level, fit.c - 1)) * fit.se
    return fit.ratio - half, fit.ratio + half


CLUSTER_BOUNDS: dict[str, Callable[[_ClusterBootstrap], tuple[float, float]]] = {
    "percentile": _percentile_bounds,
    "BCa": _bca_bounds,
    "bootstrap-t (delta SE)": _delta_t_star_bounds,
    "bootstrap-t on logs (delta SE)": _log_delta_t_star_bounds,
    "bootstrap-t (jackknife SE)": partial(_jackknife_t_star_bounds, symmetric=False),
    "symmetric bootstrap-t (jackknife SE)": partial(_jackknife_t_star_bounds, symmetric=True),
    "delta t": _delta_t_bounds,
}


def _launch_cluster_totals(
    num: np.ndarray, den: np.ndarray, clusters: Sequence[str], launches: Sequence[str] | None
) -> tuple[np.ndarray, np.ndarray]:
    """The rows summed per (launch, cluster): two (launches, clusters) arrays (one launch without labels)."""
    cluster, n_clusters = _codes(clusters, len(num), "clusters")
    launch, n_launches = _codes(launches, len(num), "launches") if launches is not None else (None, 1)
    if launch is None:
        launch = np.zeros(len(num), dtype=int)
    cells = launch * n_clusters + cluster
    a_lc = np.bincount(cells, num, minlength=n_launches * n_clusters).reshape(n_launches, n_clusters)
    s_lc = np.bincount(cells, den, minlength=n_launches * n_clusters).reshape(n_launches, n_clusters)
    return a_lc, s_lc


def _resampling_note(n_launches: int, c: int, unit: str, labelled: bool) -> str:
    if n_launches >= 3:
        return f"two-stage bootstrap over {n_launches} launches then {c} {unit}"
    return f"bootstrap over {c} {unit}" + (
        f" x {n_launches} launch{'' if n_launches == 1 else 'es'}" if labelled else ""
    )


def cluster_ratio_intervals(
    numerator: Sequence[float],
    denominator: Sequence[float],
    clusters: Sequence[str],
    launches: Sequence[str] | None = None,
    *,
    offset: float = 0.0,
    confidence: float = 0.95,
    resamples: int = 2000,
    seed: int = 0,
    min_clusters: int = 5,
    unit: str = "prompts",
    variants: Sequence[str] = CLUSTER_VARIANTS,
    ceiling: float | None = None,
) -> Interval | dict[str, Interval]:
    """`cluster_ratio_interval` for several bootstrap variants from the same resamples (the coverage benchmark
    compares them): a dict variant -> Interval, or one no-interval Interval when none can be drawn.
    Variants (CLUSTER_VARIANTS): "percentile"; "BCa" (bias-corrected and accelerated, acceleration from the
    jackknife over clusters); "bootstrap-t (delta SE)" (studentized by the delta-method standard error of a
    ratio of sums, sqrt(c / (c - 1) sum (a_i - r s_i)^2) / sum s); "bootstrap-t on logs (delta SE)" (the
    same on log(ratio)); "bootstrap-t (jackknife SE)" (studentized by the leave-one-cluster-out jackknife
    standard error, which weighs the heavy clusters more); "symmetric bootstrap-t (jackknife SE)" (the same,
    estimate +- the `confidence` quantile of |t*| times the SE: the product's); "delta t" (no bootstrap:
    estimate +- t(c - 1) delta-method standard error). `ceiling`: the largest value the ratio can take (before
    `offset`), where the quantity has one: an acceptance rate is at most 1 (accepted <= drafted), a mean
    acceptance length at most 1 + k; no interval reaches past it."""
    if unknown := set(variants) - set(CLUSTER_VARIANTS):
        raise ValueError(f"unknown variants {sorted(unknown)}; known: {CLUSTER_VARIANTS}")
    num, den = _finite_rows(numerator, denominator, "")
    a_lc, s_lc = _launch_cluster_totals(num, den, clusters, launches)
    n_launches, c = a_lc.shape
    a, s = a_lc.sum(0), s_lc.sum(0)
    total = float(s.sum())
    estimate = offset + (float(a.sum()) / total if total else math.nan)

    def none(why: str) -> Interval:
        return Interval(estimate, estimate, estimate, c, f"{why}: no interval")

    if c < min_clusters:
        return none(f"fewer than {min_clusters} {unit}")
    if total == 0:
        return none("zero denominator")
    drawn = s > 0
    if _same_ratio_everywhere(a[drawn] / s[drawn]):
        return none(f"every one of the {unit} has the same ratio")
    fit = _bootstrap_clusters(a_lc, s_lc, confidence, resamples, seed)
    note = _resampling_note(n_launches, c, unit, labelled=launches is not None)
    nonnegative = bool((num >= 0).all() and (den >= 0).all())
    out: dict[str, Interval] = {}
    for variant in variants:
        low, high = CLUSTER_BOUNDS[variant](fit)
        if nonnegative:
            low = max(float(low), 0.0)  # a ratio of non-negative sums is not negative
        if ceiling is not None:  # the symmetric intervals reach past a bounded quantity's support
            high = min(float(high), ceiling)
        out[variant] = Interval(
            estimate, offset + float(low), offset + float(high), c, f"{note}, {variant} {percent(confidence)}"
        )
    return out


# ------------------------------------------------------- paired prompt-clustered bootstrap of a ratio of ratios

PAIRED_SCALES = ("log", "ratio")
# chosen by coverage (benchmarks/interval_coverage.py --blocks paired, docs/analysis.md: interval coverage)
PAIRED_SCALE = "ratio"


@dataclass(frozen=True)
class _Arm:
    """One arm's rows summed per cluster (sorted cluster names)."""

    names: np.ndarray
    num: np.ndarray
    den: np.ndarray
    nonnegative: bool  # every row's numerator and denominator >= 0


def _arm_totals(num: Sequence[float], den: Sequence[float], labels: Sequence[str], side: str) -> _Arm:
    n, d = _finite_rows(num, den, f"arm {side}: ")
    if len(labels) != len(n):
        raise ValueError(f"arm {side}: {len(labels)} cluster labels for {len(n)} rows")
    names, codes = np.unique(np.asarray(labels, dtype=str), return_inverse=True)
    codes = codes.ravel()
    sums = np.bincount(codes, n, minlength=len(names)), np.bincount(codes, d, minlength=len(names))
    return _Arm(names, *sums, bool((n >= 0).all() and (d >= 0).all()))


@dataclass(frozen=True)
class _SharedClusters:
    """Both arms' totals over the clusters present on both sides: a / s is arm a's, b / t arm b's."""

    a: np.ndarray
    s: np.ndarray
    b: np.ndarray
    t: np.ndarray
    offset: float

    @property
    def c(self) -> int:
        return len(self.a)

    def ratio(self, sum_a: Any, sum_s: Any, sum_b: Any, sum_t: Any, on_log: bool) -> Any:
        """(offset + sum_a / sum_s) / (offset + sum_b / sum_t), or its log; elementwise over arrays."""
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            value = (self.offset + sum_a / sum_s) / (self.offset + sum_b / sum_t)
            return np.log(value) if on_log else value


def _paired_half_width(
    pair: _SharedClusters, on_log: bool, confidence: float, resamples: int, seed: int
) -> float | str:
    """The symmetric bootstrap-t half-width (jackknife SE) on the ratio or log scale, or why there is none."""
    a, s, b, t, c = pair.a, pair.s, pair.b, pair.t, pair.c
    sa, ss, sb, st = float(a.sum()), float(s.sum()), float(b.sum()), float(t.sum())
    rng = np.random.default_rng(seed)
    w = _counts(rng.integers(0, c, (resamples, c)), c)  # the same draw of prompts for both arms
    boot_a, boot_s, boot_b, boot_t = w @ a, w @ s, w @ b, w @ t
    centre = float(pair.ratio(sa, ss, sb, st, on_log))
    boot = pair.ratio(boot_a, boot_s, boot_b, boot_t, on_log)
    # leave one drawn cluster out, each as often as drawn (as cluster_ratio_intervals' jackknife variants)
    loo = pair.ratio(
        boot_a[:, None] - a[None, :],
        boot_s[:, None] - s[None, :],
        boot_b[:, None] - b[None, :],
        boot_t[:, None] - t[None, :],
        on_log,
    )
    with np.errstate(divide="ignore", invalid="ignore"):
        t_star = np.abs((boot - centre) / _resampled_jackknife_se(w, loo, c))
    t_star = t_star[~np.isnan(t_star)]  # +inf (a resample of one prompt repeated) stays: it widens
    jack = pair.ratio(sa - a, ss - s, sb - b, st - t, on_log)
    jack = jack[np.isfinite(jack)]
    se_jack = _jackknife_se(jack, c) if len(jack) > 1 else math.nan
    if not len(t_star) or not math.isfinite(se_jack) or se_jack == 0:
        return "no spread between the resamples"
    with np.errstate(invalid="ignore"):  # inf - inf between two infinite order statistics
        half = float(np.quantile(t_star, confidence)) * se_jack
    if not math.isfinite(half):  # too many resamples of one prompt repeated (only with very few prompts)
        return "unbounded bootstrap-t quantile"
    if on_log and half > 700:  # exp overflows: no upper bound
        return "unbounded bootstrap-t quantile"
    return half


def paired_cluster_ratio_interval(
    num_a: Sequence[float],
    den_a: Sequence[float],
    clusters_a: Sequence[str],
    num_b: Sequence[float],
    den_b: Sequence[float],
    clusters_b: Sequence[str],
    *,
    offset: float = 0.0,
    confidence: float = 0.95,
    resamples: int = 2000,
    seed: int = 0,
    min_clusters: int = 5,
    unit: str = "prompts",
    scale: str = PAIRED_SCALE,
) -> Interval:
    """(offset + sum(num_a) / sum(den_a)) / (offset + sum(num_b) / sum(den_b)) over the clusters (prompts)
    present on both sides, with a paired bootstrap interval over them: arm a the new head, b the old one, e.g.
    the ratio of two heads' mean acceptance lengths (offset 1, numerator accepted tokens, denominator verify
    steps) on the same prompts. n = the number of shared clusters.

    Rows are summed per cluster on each side (a prompt's rows of several repeats are one cluster; under greedy
    decoding its repeats are identical, so they add nothing, and the spread that generalises is between
    prompts). Clusters on one side only are left out of the estimate and the resamples alike. A resample
    draws the shared clusters with replacement, the SAME draw for both arms (paired: a prompt that is easy for
    one head is easy for the other, and the pairing cancels that). Vectorised like `cluster_ratio_intervals`
    (2000 resamples of 48 prompts take a few milliseconds).

    The interval is the variant `cluster_ratio_interval` uses: a symmetric bootstrap-t studentized by the
    leave-one-cluster-out jackknife standard error, estimate +- q se_jack, q the `confidence` quantile of
    |t*|, on the ratio itself (scale "ratio", the default) or on log(ratio) (scale "log", mapped back:
    estimate x/ exp(q se_jack)). Measured on planted heads (benchmarks/interval_coverage.py --blocks paired,
    docs/analysis.md: interval coverage; Beta(2, 2) acceptance for the old head, the new one shifted on the
    logit scale with prompt-level heterogeneity, heavy-tailed lengths, greedy repeats), the ratio scale
    covered 93.7-95.7% at 5-48 prompts in all three scenarios and 96.8-97.2% at 4 (too wide); the log
    scale covered the same to within 0.3 points but was wider at few prompts, so it is not the default;
    a ratio-scale lower bound at or below 0 (a handful of very unequal prompts) is replaced by the log
    scale's interval, whose bounds are positive. Hence min_clusters 5.

    No interval (low == high == the estimate, the method says why) with fewer than `min_clusters` shared
    clusters, a zero denominator (either arm's sum of `den`, or offset + arm b's ratio; estimate NaN), or
    when every shared cluster has the same ratio (offset + a_i / s_i) / (offset + b_i / t_i)."""
    if scale not in PAIRED_SCALES:
        raise ValueError(f"scale must be one of {PAIRED_SCALES}, got {scale!r}")
    arm_a = _arm_totals(num_a, den_a, clusters_a, "a")
    arm_b = _arm_totals(num_b, den_b, clusters_b, "b")
    _, in_a, in_b = np.intersect1d(arm_a.names, arm_b.names, assume_unique=True, return_indices=True)
    pair = _SharedClusters(arm_a.num[in_a], arm_a.den[in_a], arm_b.num[in_b], arm_b.den[in_b], offset)
    a, s, b, t, c = pair.a, pair.s, pair.b, pair.t, pair.c
    sa, ss, sb, st = float(a.sum()), float(s.sum()), float(b.sum()), float(t.sum())
    top = offset + sa / ss if ss else math.nan
    bottom = offset + sb / st if st else math.nan
    estimate = top / bottom if bottom and math.isfinite(bottom) else math.nan

    def none(why: str) -> Interval:
        return Interval(estimate, estimate, estimate, c, f"{why}: no interval")

    if c < min_clusters:
        return none(f"fewer than {min_clusters} {unit} on both sides")
    if not (ss and st and bottom and math.isfinite(estimate)):
        return none("zero denominator")
    drawn = (s > 0) & (t > 0)
    per_cluster = pair.ratio(a[drawn], s[drawn], b[drawn], t[drawn], on_log=False)
    per_cluster = per_cluster[np.isfinite(per_cluster)]
    if len(per_cluster) and _same_ratio_everywhere(per_cluster):
        return none(f"every one of the {unit} has the same ratio")
    on_log = scale == "log" and estimate > 0
    half = _paired_half_width(pair, on_log, confidence, resamples, seed)
    # a ratio of non-negative figures is not negative: below 0 on the ratio scale, the log scale's bounds
    # (which are positive) replace it
    nonnegative = arm_a.nonnegative and arm_b.nonnegative and offset >= 0
    if not on_log and not isinstance(half, str) and estimate - half <= 0 < estimate and nonnegative:
        on_log = True
        half = _paired_half_width(pair, on_log, confidence, resamples, seed)
    if isinstance(half, str):
        return none(half)
    if on_log:
        low, high = estimate * math.exp(-half), estimate * math.exp(half)
    else:
        low, high = estimate - half, estimate + half
    variant = "symmetric bootstrap-t on logs (jackknife SE)" if on_log else CLUSTER_VARIANT
    return Interval(
        estimate,
        float(low),
        float(high),
        c,
        f"bootstrap over {c} {unit} paired new/old, {variant} {percent(confidence)}",
    )
