"""Mergeable latency sketches per cell and time block, stored at ingest: percentiles that stay fast.

Exact percentiles over raw request rows (`quantile_cont` over `requests`) cost time that grows faster than
the rows (docs/performance.md, "Warehouse"). So each cell's successful measured requests are also kept as
DDSketches (Masson, Rim, Lee, VLDB 2019; the `ddsketch` package's LogarithmicMapping), one per metric and
10-second block of the measured window (by the request's send time):

    cell_sketches (cell_key, block, metric, bucket, count)

A row counts the values that fall in one bucket: bucket `k` holds the values v with gamma^(k-1) < v <=
gamma^k (gamma = (1 + alpha) / (1 - alpha), alpha = 0.01) and answers for all of them with value(k) =
2 gamma^k / (1 + gamma), which is within 1% relative error of every one. Merging sketches is summing counts
per bucket, so a campaign's merged percentiles read a few rows per cell instead of every request.

The guarantee, as DDSketch defines it: the answer for quantile q is within alpha (1%) relative error of the
exact value of rank q (n - 1). The views (v_sketch_percentiles, v_sketch_percentiles_merged) interpolate
between the answers of the two neighbouring ranks, as numpy's default percentile and DuckDB's
`quantile_cont` interpolate between the values, so each answer is within 1% of that exact interpolated
percentile too (both neighbours are within 1%, and so is any mix of them: the values are positive).

Metrics, with the definitions of tasks.metrics.summary (only successful measured requests):
- `ttft`, `e2e`: one value per request (non-null);
- `tpot`: one per request of at least 2 completion tokens;
- `itl`: inter-token latency per token, token-weighted: the gap before chunk i divided by the tokens it
  carries, counted once per token (the count is the tokens, not one row per token); chunks of unknown or 0
  tokens add nothing, and the first chunk of a request has no gap.
Values <= the mapping's smallest positive value (zero, and negatives, which validation rejects for every
metric but a chunk gap of offsets out of order) are counted in the zero bucket, ZERO_BUCKET, which answers 0.

Keys are computed vectorised with exactly the package's formula (key = ceil(log2(v) * multiplier) +
offset, multiplier = ln 2 / ln gamma); tests/test_sketches.py checks them against `mapping.key` and the
views' bucket values against `mapping.value`.
"""

from __future__ import annotations

import math

import duckdb
import numpy as np
import polars as pl
from ddsketch.mapping import LogarithmicMapping

__all__ = [
    "ALPHA",
    "BLOCK_S",
    "MAPPING",
    "METRICS",
    "TABLE",
    "ZERO_BUCKET",
    "bucket_keys",
    "bucket_values",
    "insert",
    "sketch_rows",
]

ALPHA = 0.01
"""Relative accuracy: every answer within 1% of the exact value of its rank."""
MAPPING = LogarithmicMapping(ALPHA)
BLOCK_S = 10.0
"""Seconds of the measured window per block (from the cell's first measured request sent)."""
ZERO_BUCKET = -(2**31)
"""The bucket of values the mapping cannot tell from 0 (INTEGER's smallest value: first in bucket order)."""
TABLE = "cell_sketches"
METRICS = ("ttft", "tpot", "e2e", "itl")
SCHEMA = {
    "cell_key": pl.String,
    "block": pl.Int32,
    "metric": pl.String,
    "bucket": pl.Int32,
    "count": pl.Int64,
}
# log2(v) * multiplier this close to a whole number: recomputed with the package's own `key` (math.log),
# so that a last-bit difference between numpy's log and libm's can never move a value across a boundary.
_NEAR_WHOLE = 1e-9


def bucket_keys(values: np.ndarray) -> np.ndarray:
    """The DDSketch bucket of each value (int32), as MAPPING.key gives it; ZERO_BUCKET for values <=
    MAPPING.min_possible. Values must be finite."""
    values = np.asarray(values, dtype=np.float64)
    positive = values > MAPPING.min_possible
    safe = np.where(positive, values, 1.0)
    # The package's _log_gamma: math.log(value, 2) * multiplier, i.e. ln(v) / ln(2) * multiplier.
    scaled = np.log(safe) / math.log(2) * MAPPING._multiplier
    keys = np.ceil(scaled) + MAPPING._offset
    near = np.flatnonzero(positive & (np.abs(scaled - np.rint(scaled)) < _NEAR_WHOLE))
    for i in near:
        keys[i] = MAPPING.key(float(values[i]))
    return np.where(positive, keys, ZERO_BUCKET).astype(np.int32)


def bucket_values(keys: np.ndarray) -> np.ndarray:
    """What each bucket answers (MAPPING.value; 0 for ZERO_BUCKET): the views' macro sketch_value in SQL."""
    return np.array([0.0 if k == ZERO_BUCKET else MAPPING.value(int(k)) for k in np.asarray(keys)])


def _values(requests: pl.DataFrame, cells: pl.Series) -> pl.DataFrame:
    """(cell, block, metric, value, weight) of every metric's values in `requests` (the table's rows of one
    or more cells), by the definitions of the module docstring. `cell` is the index of the row's cell_key in
    `cells`, `metric` its index in METRICS: grouping by integers, not strings, is most of the speed."""
    measured = (
        requests.lazy()
        .filter(pl.col("phase") == "measured")
        .with_columns(
            cell=pl.col("cell_key").replace_strict(cells, pl.int_range(cells.len()), return_dtype=pl.UInt32)
        )
    )
    start = pl.col("sent_s").min().over("cell")
    ok = measured.with_columns(block=((pl.col("sent_s") - start) / BLOCK_S).floor().cast(pl.Int32)).filter(
        pl.col("ok").fill_null(False)
    )
    keep = ("cell", "block")

    def one(metric: str, column: str, rows: pl.LazyFrame) -> pl.LazyFrame:
        return rows.select(
            *keep, metric=_code(metric), value=pl.col(column), weight=pl.lit(1, dtype=pl.Int64)
        ).drop_nulls("value")

    itl = (
        ok.filter(pl.col("chunk_offsets_s").list.len() == pl.col("chunk_tokens").list.len())
        .select(
            *keep,
            gap=pl.col("chunk_offsets_s").list.diff().list.slice(1),
            tokens=pl.col("chunk_tokens").list.slice(1),
        )
        .explode(["gap", "tokens"])
        .drop_nulls()
        .filter(pl.col("tokens") > 0)
        .select(
            *keep,
            metric=_code("itl"),
            value=pl.col("gap") / pl.col("tokens"),
            weight=pl.col("tokens").cast(pl.Int64),
        )
    )
    return pl.concat(
        [
            one("ttft", "ttft_s", ok),
            one("tpot", "tpot_s", ok.filter(pl.col("completion_tokens") >= 2)),
            one("e2e", "e2e_s", ok),
            itl,
        ]
    ).collect()


def _code(metric: str) -> pl.Expr:
    return pl.lit(METRICS.index(metric), dtype=pl.UInt8)


def sketch_rows(requests: pl.DataFrame) -> pl.DataFrame:
    """The cell_sketches rows of the cells whose request rows are `requests` (requests table columns)."""
    if not requests.height:
        return pl.DataFrame(schema=SCHEMA)
    cells = requests.get_column("cell_key").unique(maintain_order=True)
    values = _values(requests, cells).filter(pl.col("value").is_finite())  # NaN or inf: no bucket
    keys = bucket_keys(values.get_column("value").to_numpy())
    counted = (
        values.with_columns(bucket=pl.Series(keys, dtype=pl.Int32))
        .group_by("cell", "block", "metric", "bucket")
        .agg(count=pl.col("weight").sum())
    )
    return counted.select(
        cell_key=cells.gather(counted.get_column("cell")),
        block="block",
        metric=pl.Series(METRICS).gather(counted.get_column("metric")),
        bucket="bucket",
        count="count",
    ).cast(SCHEMA)  # type: ignore[arg-type]


def insert(con: duckdb.DuckDBPyConnection, requests: pl.DataFrame | None) -> int:
    """Inside the caller's transaction: add the sketch rows of the cells in `requests` (an ingest batch's
    validated request rows). Cells are immutable and ingested once, so rows are never replaced."""
    if requests is None or not requests.height:
        return 0
    rows = sketch_rows(requests)
    if rows.height:
        con.register("_sketch_rows", rows.to_arrow())
        try:
            con.execute(f"INSERT INTO {TABLE} BY NAME SELECT * FROM _sketch_rows")
        finally:
            con.unregister("_sketch_rows")
    return rows.height
