"""Q1: speedup by workload and load, against plain launched the same way, with intervals over repeats.

Pairing: v_speedup pairs each speculative cell with the plain cell of the same campaign, workload (stratum
and corpus hash), load, endpoint, sampling, engine settings and repeat. Repeat r of every variant is launched
in the same block of the campaign (experiments.plan shuffles the variant order within each repeat), so the
per-repeat ratio speculative_r / plain_r cancels drift between blocks. The estimate is the geometric mean of
the per-repeat ratios and its interval Student t on their logs (analysis.stats.ratio_interval): independently
launched deployments are the replicates, never requests. The throughput ratio pools plain's launch-to-launch
variance from earlier campaigns launched the same way where the warehouse has them (analysis.history,
analysis.stats.pooled_ratio_interval; its label names the campaigns and dates): then even one repeat gets an
interval. Otherwise one repeat has none, and no zero-width interval is ever reported as one.
"""

from __future__ import annotations

import polars as pl

from analysis.data import GAIN_METRICS, AnalysisSettings, CampaignData
from analysis.stats import Interval, has_interval, interval_label, pooled_ratio_interval, ratio_interval

LOAD_KEYS = ("workload", "load_mode", "load_label", "concurrency", "rate")
VARIANT_KEYS = ("variant", "method", "k")

# The columns that identify a speculative cell's variant and load in every analysis table.
CELL_KEY_SCHEMA = {
    "variant": pl.String,
    "method": pl.String,
    "k": pl.Int32,
    "workload": pl.String,
    "load_mode": pl.String,
    "load_label": pl.String,
    "concurrency": pl.Int32,
    "rate": pl.Float64,
}

# A gain over plain with its t interval over repeats (the speedup and decision tables).
GAIN_INTERVAL_SCHEMA = {
    "estimate": pl.Float64,
    "ci_low": pl.Float64,
    "ci_high": pl.Float64,
    "n_repeats": pl.Int32,
    "interval": pl.String,
    "interval_excludes_one": pl.Boolean,
}

SPEEDUP_SCHEMA = {
    **CELL_KEY_SCHEMA,
    "metric": pl.String,
    **GAIN_INTERVAL_SCHEMA,
    "below_one": pl.Boolean,
    "per_repeat": pl.List(pl.Float64),
    "repeats": pl.List(pl.Int32),
}


def speedup_table(data: CampaignData, settings: AnalysisSettings | None = None) -> pl.DataFrame:
    """One row per speculative variant, workload, load and metric (throughput, TTFT and TPOT p50/p95).

    `estimate` is the geometric mean of the per-repeat ratios (> 1: faster than plain); `ci_low`/`ci_high`
    its t interval over repeats (on the log scale), null with one repeat (`interval` then says "n=1, no interval");
    `interval_excludes_one` is null without an interval.
    """
    settings = settings or AnalysisSettings()
    rows: list[dict] = []
    if data.speedup.is_empty():
        return pl.DataFrame(schema=SPEEDUP_SCHEMA)
    groups = data.speedup.sort("repeat").group_by([*VARIANT_KEYS, *LOAD_KEYS], maintain_order=True)
    for key, group in groups:
        base = dict(zip((*VARIANT_KEYS, *LOAD_KEYS), key, strict=True))
        for metric in GAIN_METRICS:
            # a latency of 0 s on either side (a stream read in one burst) makes the ratio 0 or undefined:
            # such pairs say nothing about speed and are left out (campaign_notes names the cells)
            pairs = (
                group.select("repeat", pl.col(f"{metric}_speedup").alias("ratio"))
                .drop_nulls()
                .filter(pl.col("ratio").is_finite() & (pl.col("ratio") > 0))
            )
            if pairs.is_empty():
                continue
            ratios = pairs["ratio"].to_list()
            # plain's launch variance from history describes throughput (analysis.history): only its ratio
            # pools it; latency ratios keep the t interval over this campaign's repeats
            history = data.history if metric == "throughput" else None
            interval = pooled_ratio_interval(ratios, history, confidence=settings.confidence)
            drawn = has_interval(interval)
            rows.append(
                {
                    **base,
                    "metric": metric,
                    "estimate": interval.estimate,
                    "ci_low": interval.low if drawn else None,
                    "ci_high": interval.high if drawn else None,
                    "n_repeats": interval.n,
                    "interval": interval_label(interval),
                    "interval_excludes_one": interval.excludes(1.0) if drawn else None,
                    "below_one": interval.estimate < 1.0,
                    "per_repeat": ratios,
                    "repeats": pairs["repeat"].to_list(),
                }
            )
    return pl.DataFrame(rows, schema=SPEEDUP_SCHEMA).sort(
        "workload", "load_mode", "concurrency", "rate", "method", "k", "variant", "metric", nulls_last=True
    )


def gain(speedups: pl.DataFrame, metric: str) -> pl.DataFrame:
    """The rows of one metric, e.g. the decision rule's gain."""
    return speedups.filter(pl.col("metric") == metric)


def paired_ratio(
    numerator: dict[int, float], denominator: dict[int, float], settings: AnalysisSettings
) -> Interval | None:
    """One speculative variant against another, paired per repeat (repeat -> speedup over the same plain):
    the geometric mean of numerator_r / denominator_r over the repeats both have, with its t interval over
    repeats (log scale); None when they share no repeat."""
    ratios = [
        numerator[r] / denominator[r]
        for r in sorted(set(numerator) & set(denominator))
        if denominator[r] > 0 and numerator[r] > 0
    ]
    if not ratios:
        return None
    return ratio_interval(ratios, confidence=settings.confidence)
