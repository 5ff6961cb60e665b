"""The crossover load: the load above which a variant stops paying (its speedup falls below 1).

Per variant, workload and load mode (closed-loop concurrency, open-loop rate), with loads l_1 < ... < l_m
and mean speedups S_1..S_m over repeats: the crossover is the first downward crossing of 1, interpolated
linearly in log2(load) between the two loads that bracket it:

    log2 l* = log2 l_i + (S_i - 1) / (S_i - S_{i+1}) * (log2 l_{i+1} - log2 l_i),  S_i >= 1 > S_{i+1}.

If S_1 < 1 the variant never pays in the measured range ("never pays"); if every S_i >= 1 it pays up to the
highest load measured ("pays throughout"). The interval: each repeat (a deployment that served every load)
has its own crossing; Student t over those, on log2(load), mapped back (analysis.stats.per_repeat_interval).
A repeat that never crosses within the measured range leaves the crossover without an interval (an open
bound is not a number t can average); the row says so.
"""

from __future__ import annotations

import math

import numpy as np
import polars as pl

from analysis.data import AnalysisSettings
from analysis.speedup import gain
from analysis.stats import Interval, has_interval, interval_label, per_repeat_interval

CROSSOVER_METRICS = ("throughput", "tpot_p50")

CROSSOVER_SCHEMA = {
    "variant": pl.String,
    "method": pl.String,
    "k": pl.Int32,
    "workload": pl.String,
    "load_mode": pl.String,
    "metric": pl.String,
    "status": pl.String,
    "crossover": pl.Float64,
    "ci_low": pl.Float64,
    "ci_high": pl.Float64,
    "n_repeats": pl.Int32,
    "interval": pl.String,
    "loads": pl.List(pl.Float64),
    "speedups": pl.List(pl.Float64),
}


def crossing(loads: np.ndarray, speedups: np.ndarray) -> float:
    """The first downward crossing of 1 (log2 interpolation); -inf: below 1 from the lowest load on;
    +inf: never below 1 in the range."""
    if speedups[0] < 1.0:
        return -math.inf
    for i in range(len(loads) - 1):
        s0, s1 = speedups[i], speedups[i + 1]
        if s0 >= 1.0 > s1:
            x0, x1 = math.log2(loads[i]), math.log2(loads[i + 1])
            return float(2 ** (x0 + (s0 - 1.0) / (s0 - s1) * (x1 - x0)))
    return math.inf


def _status(value: float) -> str:
    if value == math.inf:
        return "pays throughout"
    if value == -math.inf:
        return "never pays"
    return "crosses"


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def crossover_table(speedups: pl.DataFrame, settings: AnalysisSettings | None = None) -> pl.DataFrame:
    """One row per speculative variant, workload, load mode and metric (throughput and TPOT p50)."""
    settings = settings or AnalysisSettings()
    rows = []
    for metric in CROSSOVER_METRICS:
        frame = gain(speedups, metric).with_columns(
            pl.when(pl.col("load_mode") == "open")
            .then(pl.col("rate"))
            .otherwise(pl.col("concurrency").cast(pl.Float64))
            .alias("load")
        )
        keys = ["variant", "method", "k", "workload", "load_mode"]
        for key, group in frame.group_by(keys, maintain_order=True):
            group = group.sort("load")
            base = dict(zip(keys, key, strict=True)) | {"metric": metric}
            loads = np.asarray(group["load"].to_list(), dtype=float)
            estimates = np.asarray(group["estimate"].to_list(), dtype=float)
            if len(loads) < 2:
                rows.append(
                    base
                    | {
                        "status": "one load only",
                        "crossover": None,
                        "ci_low": None,
                        "ci_high": None,
                        "n_repeats": int(group["n_repeats"].min() or 0),
                        "interval": "no crossover without two loads",
                        "loads": loads.tolist(),
                        "speedups": estimates.tolist(),
                    }
                )
                continue
            # repeats x loads matrix of per-repeat speedups, for the repeats present at every load
            per_load = [
                dict(zip(r, s, strict=True))
                for r, s in zip(group["repeats"].to_list(), group["per_repeat"].to_list(), strict=True)
            ]
            repeats = sorted(set.intersection(*(set(d) for d in per_load)))
            if repeats:
                matrix = np.array([[d[r] for d in per_load] for r in repeats], dtype=float)
            else:  # no repeat at every load (pairs left out, e.g. a stream read in one burst): estimates only
                matrix = estimates.reshape(1, -1)

            interval = crossover_interval(loads, matrix, settings.confidence)
            drawn = has_interval(interval) and len(repeats) >= 2
            rows.append(
                base
                | {
                    "status": _status(interval.estimate),
                    "crossover": _finite(interval.estimate),
                    # open bounds (inf) are stored as null with `interval` saying so
                    "ci_low": _finite(interval.low) if drawn else None,
                    "ci_high": _finite(interval.high) if drawn else None,
                    "n_repeats": len(repeats) or 1,
                    "interval": _interval_text(interval, loads) if drawn else interval_label(interval),
                    "loads": loads.tolist(),
                    "speedups": _geometric_means(matrix).tolist(),
                }
            )
    return pl.DataFrame(rows, schema=CROSSOVER_SCHEMA).sort("workload", "load_mode", "metric", "method", "k")


def _geometric_means(matrix: np.ndarray) -> np.ndarray:
    """Per load, the geometric mean of the repeats' speedups (as analysis.speedup estimates them)."""
    return np.exp(np.log(matrix).mean(axis=0))


def crossover_interval(loads: np.ndarray, matrix: np.ndarray, confidence: float) -> Interval:
    """The crossing of the mean curve, with the t interval of the repeats' own crossings on log2(load)."""
    estimate = crossing(loads, _geometric_means(matrix))
    per_repeat = [math.log2(c) if math.isfinite(c) else c for c in (crossing(loads, row) for row in matrix)]
    on_log = per_repeat_interval(
        math.log2(estimate) if math.isfinite(estimate) else estimate, per_repeat, confidence=confidence
    )
    method = on_log.method
    if len(per_repeat) >= 2 and all(c == math.inf for c in per_repeat):
        method = f"every repeat pays up to the highest load (> {loads.max():g})"
    elif len(per_repeat) >= 2 and all(c == -math.inf for c in per_repeat):
        method = f"every repeat is below 1 from the lowest load (< {loads.min():g})"
    return Interval(estimate, 2**on_log.low, 2**on_log.high, on_log.n, method)


def _interval_text(interval: Interval, loads: np.ndarray) -> str:
    def bound(value: float) -> str:
        if value == math.inf:
            return f"> {loads.max():g}"
        if value == -math.inf:
            return f"< {loads.min():g}"
        return f"{value:.3g}"

    return f"n={interval.n}, [{bound(interval.low)}, {bound(interval.high)}] ({interval.method})"
