"""Acceptance and speedup against context length (issue 33, item 3).

A campaign on a corpus of prompt-length buckets (workloads/length_buckets.py: strata named
`<stratum>-len-<lower edge in tokens>`) has every per-stratum figure per bucket already; this module picks the
bucketed strata out of the analysis' own tables and puts them on one axis, the bucket's lower edge:

- acceptance: analysis.acceptance.acceptance_intervals (each request's own acceptance, bootstrap over prompts;
  the counters' figure where the requests carry none);
- speedup: analysis.speedup.speedup_table's throughput ratio over plain (geometric mean over repeats, t
  interval on the logs where there are repeats, or pooled history).

The warehouse has the same per bucket as a view (v_context_length, from the counters). The chart draws, per
method, the acceptance rate and the mean acceptance length against the bucket, one panel per load.
"""

from __future__ import annotations

import altair as alt
import polars as pl

from analysis.acceptance import ACCEPTANCE_FIGURES
from analysis.charts import HEIGHT, WIDTH, _load_sort_key, clip_spread_band
from workloads.length_buckets import parse_bucket_stratum

CONTEXT_SCHEMA = {
    "variant": pl.String,
    "method": pl.String,
    "k": pl.Int32,
    "base_stratum": pl.String,
    "bucket_tokens": pl.Int32,
    "workload": pl.String,
    "load_label": pl.String,
    **ACCEPTANCE_FIGURES,
    "acceptance_interval": pl.String,
    "prompts": pl.Int64,
    "throughput_speedup": pl.Float64,
    "speedup_low": pl.Float64,
    "speedup_high": pl.Float64,
    "speedup_interval": pl.String,
}
MEASURES = {"acceptance_rate": "acceptance rate", "mean_acceptance_length": "mean acceptance length"}


def _bucketed(frame: pl.DataFrame, column: str = "workload") -> pl.DataFrame:
    """The rows of bucketed strata (named in `column`), with their base stratum and lower edge parsed."""
    if frame.is_empty() or column not in frame.columns:
        return frame.clear()
    parsed = [parse_bucket_stratum(w) for w in frame[column].to_list()]
    return frame.with_columns(
        pl.Series("base_stratum", [p[0] if p else None for p in parsed], dtype=pl.String),
        pl.Series("bucket_tokens", [p[1] if p else None for p in parsed], dtype=pl.Int32),
    ).filter(pl.col("bucket_tokens").is_not_null())


def context_length_table(acceptance: pl.DataFrame, speedup: pl.DataFrame) -> pl.DataFrame:
    """One row per speculative variant, bucket and load: acceptance with its interval and the throughput
    speedup over plain with its interval (null where the analysis has none). Empty without bucketed strata."""
    keys = ["variant", "workload", "load_label"]
    rows = _bucketed(acceptance)
    if rows.is_empty():
        return pl.DataFrame(schema=CONTEXT_SCHEMA)
    for column in ("acceptance_rate", "acceptance_rate_low", "acceptance_rate_high", "prompts"):
        if column not in rows.columns:  # the counters-only form of acceptance_intervals lacks them
            rows = rows.with_columns(pl.lit(None).alias(column))
    gains = (
        speedup.filter(pl.col("metric") == "throughput").select(
            *keys,
            pl.col("estimate").alias("throughput_speedup"),
            pl.col("ci_low").alias("speedup_low"),
            pl.col("ci_high").alias("speedup_high"),
            pl.col("interval").alias("speedup_interval"),
        )
        if not speedup.is_empty()
        else pl.DataFrame(schema={k: pl.String for k in keys})
    )
    joined = rows.join(gains, on=keys, how="left") if not gains.is_empty() else rows
    for column, dtype in CONTEXT_SCHEMA.items():
        if column not in joined.columns:
            joined = joined.with_columns(pl.lit(None, dtype=dtype).alias(column))
    return joined.select([pl.col(c).cast(t) for c, t in CONTEXT_SCHEMA.items()]).sort(
        "base_stratum", "method", "k", "variant", "load_label", "bucket_tokens"
    )


def _long(table: pl.DataFrame) -> pl.DataFrame:
    """One row per measure of each table row (estimate, low, high), bands clipped per measure and load."""
    parts = [
        table.select(
            "variant",
            "method",
            "load_label",
            "bucket_tokens",
            "prompts",
            "acceptance_interval",
            pl.lit(label).alias("measure"),
            pl.col(column).alias("estimate"),
            pl.col(f"{column}_low").alias("low"),
            pl.col(f"{column}_high").alias("high"),
        )
        for column, label in MEASURES.items()
    ]
    frame = pl.concat(parts).drop_nulls("estimate")
    frame = frame.with_columns(
        (pl.col("low").is_not_null() & pl.col("high").is_not_null() & (pl.col("high") > pl.col("low"))).alias(
            "has_band"
        )
    )
    return clip_spread_band(frame, ["estimate"], ["low"], ["high"], ["measure", "load_label"])


def context_length_chart(table: pl.DataFrame, confidence: float = 0.95) -> alt.FacetChart | None:
    """Acceptance rate and mean acceptance length against the prompt-length bucket, a line per variant (its
    method in the tooltip), a panel per measure and load; bars are the intervals over prompts, hollow points
    have none. None when the campaign has no bucketed strata."""
    if table.is_empty():
        return None
    frame = _long(table)
    if frame.is_empty():
        return None
    loads = sorted(frame["load_label"].unique().to_list(), key=_load_sort_key)
    x = alt.X(
        "bucket_tokens:Q",
        title="prompt length bucket (lower edge, tokens)",
        scale=alt.Scale(type="log", base=2),
        axis=alt.Axis(values=sorted(frame["bucket_tokens"].unique().to_list())),
    )
    y = alt.Y("estimate:Q", title=None, scale=alt.Scale(zero=False))
    tooltip = [
        "variant",
        "method",
        "load_label",
        alt.Tooltip("bucket_tokens:Q", title="bucket from (tokens)"),
        "measure",
        alt.Tooltip("estimate:Q", format=".3f"),
        alt.Tooltip("low:Q", format=".3f"),
        alt.Tooltip("high:Q", format=".3f"),
        alt.Tooltip("prompts:Q", title="n (prompts)"),
        "acceptance_interval",
    ]
    base = alt.Chart(frame)
    line = base.mark_line().encode(x=x, y=y, color="variant:N")
    points = base.mark_point(size=50).encode(
        x=x,
        y=y,
        color="variant:N",
        fill=alt.condition("datum.has_band", alt.Color("variant:N", legend=None), alt.value("white")),
        tooltip=tooltip,
    )
    bands = (
        base.transform_filter("datum.has_band")
        .mark_rule()
        .encode(x=x, y=alt.Y("low_shown:Q"), y2="high_shown:Q", color="variant:N", tooltip=tooltip)
    )
    return (
        alt.layer(bands, line, points)
        .properties(width=WIDTH, height=HEIGHT)
        .facet(
            row=alt.Row("measure:N", title=None, sort=list(MEASURES.values())),
            column=alt.Column("load_label:N", title="load", sort=loads),
        )
        .resolve_scale(y="independent")
        .properties(
            title={
                "text": "Acceptance against context length",
                "subtitle": [
                    "each request's own acceptance (vLLM's per-request block) summed per bucket; bars: "
                    f"{confidence:.0%} bootstrap over prompts, hollow: no interval",
                    "a band that runs far past its panel's points is clipped to the panel",
                ],
            }
        )
    )


def bucket_projections(projections: pl.DataFrame | None) -> pl.DataFrame:
    """The simulator's projections (analysis/simulate: per shape, stratum and load) of the bucketed strata,
    with the bucket's lower edge: its replay per bucket. Empty without a simulation or buckets."""
    if projections is None or projections.is_empty():
        return pl.DataFrame()
    rows = _bucketed(projections, "stratum")
    if rows.is_empty():
        return rows
    return rows.select(
        "shape",
        "bucket_tokens",
        "stratum",
        "load_label",
        "concurrency",
        "mean_acceptance_length",
        "projected_speedup",
        "measured_speedup",
    ).sort("shape", "concurrency", "bucket_tokens")
