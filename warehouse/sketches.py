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

Beside them, the merge that v_sketch_percentiles_merged answers is kept up to date at ingest (`roll_up`,
migration 0022), in the cell's transaction:

    sketch_groups (group_no, campaign_id, variant, workload, load_label, method, k, ..., cells)
    group_sketches (group_no, metric, bucket, count, cum, n)

per group (campaign, variant, workload, load over the latest ok attempt of each cell) the summed counts with
their running count in bucket order and total, so that the view is one aggregate over group rows instead of
a join and a sum over every cell's rows and a window walk (docs/performance.md, "Percentiles from sketches").

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
    "MERGED_AT_QUERY_TIME",
    "METRICS",
    "TABLE",
    "ZERO_BUCKET",
    "bucket_keys",
    "bucket_values",
    "insert",
    "roll_up",
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
# bucket_keys' first pass is float32 (numpy's SIMD log2: several times float64's speed) over values within
# [_FAST_LOW, _FAST_HIGH]; there |log2(v) * multiplier| <= 20 * 34.7 = 694 and the pass is off from the
# package's float64 value by at most ~3.5e-4 (float32 rounding of v: 3e-6; log2 within 4 ulp of 20: 2.6e-4;
# the multiplier's float32 rounding: 4e-5; the product's: 3e-5). A value whose float32 estimate is within _F32_TOLERANCE (6x that bound) of
# a whole number, or outside the range, is recomputed with the package's formula in float64; and one of
# those within _NEAR_WHOLE of a whole number with the package's own `key` (math.log), so that a last-bit
# difference between numpy's log and libm's can never move a value across a boundary.
_FAST_LOW = 2.0**-20
_FAST_HIGH = 2.0**20
_F32_TOLERANCE = 2e-3
_NEAR_WHOLE = 1e-9
_MULTIPLIER_F32 = np.float32(MAPPING._multiplier)
_DENSE_SLOTS = 4_000_000
"""A chunk's values are counted with np.bincount over its (cell and block, metric, bucket) codes while there
are at most this many (a float64 array of 32 MB); beyond it, with a group_by over the codes that occur."""
_CHUNK_REQUESTS = 50_000
"""Requests per chunk of sketch_rows: about 1.2 million values at 24 chunks per request."""


def bucket_keys(values: np.ndarray) -> np.ndarray:
    """The DDSketch bucket of each value (int32), as MAPPING.key gives it; ZERO_BUCKET for values <=
    MAPPING.min_possible. Values must be finite."""
    values = np.asarray(values, dtype=np.float64)
    scaled = np.log2(np.clip(values, _FAST_LOW, _FAST_HIGH).astype(np.float32)) * _MULTIPLIER_F32
    keys = (np.ceil(scaled) + MAPPING._offset).astype(np.int32)
    exact = np.flatnonzero(
        (np.abs(scaled - np.rint(scaled)) < _F32_TOLERANCE) | (values < _FAST_LOW) | (values > _FAST_HIGH)
    )
    keys[exact] = _exact_keys(values[exact])
    keys[values <= MAPPING.min_possible] = ZERO_BUCKET
    return keys


def _exact_keys(values: np.ndarray) -> np.ndarray:
    """MAPPING.key of each value (int32; any for values <= MAPPING.min_possible): the package's float64
    formula, and the package itself where that lands within _NEAR_WHOLE of a boundary."""
    positive = values > MAPPING.min_possible
    # The package's _log_gamma: math.log(value, 2) * multiplier, i.e. ln(v) / ln(2) * multiplier.
    scaled = np.log(np.where(positive, values, 1.0)) / math.log(2) * MAPPING._multiplier
    keys = np.ceil(scaled) + MAPPING._offset
    near = np.flatnonzero(positive & (np.abs(scaled - np.rint(scaled)) < _NEAR_WHOLE))
    # one call per distinct value: a value repeated a million times (an exact 1.0) costs one
    distinct, where = np.unique(values[near], return_inverse=True)
    keys[near] = np.array([MAPPING.key(float(v)) for v in distinct], dtype=np.float64)[where]
    return keys.astype(np.int32)


def bucket_values(keys: np.ndarray) -> np.ndarray:
    """What each bucket answers (MAPPING.value; 0 for ZERO_BUCKET): the views' macro sketch_value in SQL."""
    return np.array([0.0 if k == ZERO_BUCKET else MAPPING.value(int(k)) for k in np.asarray(keys)])


def _ok_requests(requests: pl.DataFrame, cells: pl.Series) -> pl.DataFrame:
    """The successful measured requests' columns that the metrics need, with `cell` (the index of the row's
    cell_key in `cells`) and `block` (10-second block from the cell's first measured request sent, failed
    ones included)."""
    return (
        requests.lazy()
        .filter(pl.col("phase") == "measured")
        .with_columns(
            cell=pl.col("cell_key").replace_strict(cells, pl.int_range(cells.len()), return_dtype=pl.Int64),
            block=((pl.col("sent_s") - pl.col("sent_s").min().over("cell_key")) / BLOCK_S)
            .floor()
            .cast(pl.Int64),
        )
        .filter(pl.col("ok").fill_null(False))
        .select(
            "cell",
            "block",
            "completion_tokens",
            "ttft_s",
            "tpot_s",
            "e2e_s",
            "chunk_offsets_s",
            "chunk_tokens",
        )
        .collect()
    )


def _chunk_values(
    chunk: pl.DataFrame, request_group: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(value, group, weight) of every metric's values of `chunk`'s requests, by the definitions of the
    module docstring, group = request_group * len(METRICS) + metric. A value that counts nowhere (null, NaN,
    inf, a first chunk, a chunk of unknown or 0 tokens) is kept with weight 0, not filtered out: no copies."""
    values: list[np.ndarray] = []
    groups: list[np.ndarray] = []
    for metric, column in enumerate(("ttft_s", "tpot_s", "e2e_s")):
        value = chunk.get_column(column).cast(pl.Float64).to_numpy()  # null: NaN
        if column == "tpot_s":
            value = np.where(
                chunk.get_column("completion_tokens").fill_null(0).to_numpy() >= 2, value, np.nan
            )
        values.append(value)
        groups.append(request_group * len(METRICS) + metric)
    offsets, tokens = chunk.get_column("chunk_offsets_s"), chunk.get_column("chunk_tokens")
    lengths = offsets.list.len()
    # requests whose two lists agree in length, of at least one chunk (an empty list explodes to a null)
    usable = ((lengths == tokens.list.len()) & (lengths > 0)).fill_null(False)
    counts = lengths.filter(usable).to_numpy().astype(np.int64)
    flat_offsets = offsets.filter(usable).explode().cast(pl.Float64).to_numpy()  # null: NaN
    flat_tokens = tokens.filter(usable).explode().cast(pl.Float64).to_numpy()
    gap = np.empty_like(flat_offsets)
    gap[1:] = np.diff(flat_offsets)
    gap[np.cumsum(counts) - counts] = np.nan  # the first chunk of a request has no gap
    counted = flat_tokens > 0  # unknown (NaN) or 0 tokens: nothing
    values.append(gap / np.where(counted, flat_tokens, 1.0))
    groups.append(np.repeat(request_group[usable.to_numpy()], counts) * len(METRICS) + METRICS.index("itl"))
    value = np.concatenate(values)
    weight = np.concatenate([np.ones(len(v)) for v in values[:3]] + [np.where(counted, flat_tokens, 0.0)])
    finite = np.isfinite(value)
    weight[~finite] = 0.0
    value[~finite] = 1.0  # any finite value: its weight is 0
    return value, np.concatenate(groups), weight


def _count_chunk(chunk: pl.DataFrame) -> pl.DataFrame:
    """(cell, block, metric, bucket, count) of `chunk` (rows of _ok_requests), counted with np.bincount over
    one integer code per (cell and block, metric, bucket) in the chunk's own dense code space."""
    pair = (chunk.get_column("cell").to_numpy() << 32) | chunk.get_column("block").to_numpy()
    pairs, request_group = np.unique(pair, return_inverse=True)  # the chunk's (cell, block) pairs, numbered
    value, group, weight = _chunk_values(chunk, request_group)
    keys = bucket_keys(value).astype(np.int64)
    zero = keys == ZERO_BUCKET  # slot 0; then the buckets from the smallest key found
    low, high = (int(keys[~zero].min()), int(keys[~zero].max())) if not zero.all() else (0, 0)
    span = high - low + 2
    code = group * span + np.where(zero, 0, keys - low + 1)
    if len(pairs) * len(METRICS) * span <= _DENSE_SLOTS:
        summed = np.bincount(code, weights=weight)
        codes = np.flatnonzero(summed)
        counts = summed[codes]
    else:  # too many slots for a dense array: group the codes that occur
        grouped = pl.DataFrame({"code": code, "weight": weight}).group_by("code").agg(pl.col("weight").sum())
        grouped = grouped.filter(pl.col("weight") > 0)
        codes, counts = grouped.get_column("code").to_numpy(), grouped.get_column("weight").to_numpy()
    group_of, slot = np.divmod(codes, span)
    pair_of, metric = np.divmod(group_of, len(METRICS))
    return pl.DataFrame(
        {
            "cell": pairs[pair_of] >> 32,
            "block": (pairs[pair_of] & 0xFFFFFFFF).astype(np.int32),
            "metric": metric.astype(np.uint8),
            "bucket": np.where(slot == 0, ZERO_BUCKET, slot - 1 + low).astype(np.int32),
            "count": np.rint(counts).astype(np.int64),  # sums of whole weights: exact in float64 below 2**53
        }
    )


def sketch_rows(requests: pl.DataFrame) -> pl.DataFrame:
    """The cell_sketches rows of the cells whose request rows are `requests` (requests table columns)."""
    if not requests.height:
        return pl.DataFrame(schema=SCHEMA)
    cells = requests.get_column("cell_key").unique(maintain_order=True)
    ok = _ok_requests(requests, cells)
    if not ok.height:
        return pl.DataFrame(schema=SCHEMA)
    # In chunks of requests: arrays of ~1M values, whose memory the allocator reuses chunk after chunk
    # instead of faulting in fresh pages for arrays of the whole batch (this machine's kernel time).
    chunks = [
        _count_chunk(ok.slice(start, _CHUNK_REQUESTS)) for start in range(0, ok.height, _CHUNK_REQUESTS)
    ]
    counted = pl.concat(chunks)
    if len(chunks) > 1:  # a cell's block may straddle two chunks
        counted = counted.group_by("cell", "block", "metric", "bucket").agg(pl.col("count").sum())
    return counted.select(
        cell_key=cells.gather(counted.get_column("cell")),
        block="block",
        metric=pl.Series(METRICS).gather(counted.get_column("metric")),
        bucket="bucket",
        count="count",
    ).cast(SCHEMA)  # type: ignore[arg-type]


def insert(
    con: duckdb.DuckDBPyConnection,
    requests: pl.DataFrame | None,
    cells: pl.DataFrame | None = None,
    rows: pl.DataFrame | None = None,
) -> int:
    """Inside the caller's transaction, after the batch's `cells` rows: add the sketch rows of the cells in
    `requests` (an ingest batch's validated request rows) and bring their groups' rollup up to date
    (`roll_up`). Cells are immutable and ingested once, so cell rows are never replaced. `rows`:
    sketch_rows(requests) when the caller counted them already (the ingest's reading thread)."""
    if rows is None:
        rows = sketch_rows(requests) if requests is not None else pl.DataFrame(schema=SCHEMA)
    if rows.height:
        con.register("_sketch_rows", rows.to_arrow())
        try:
            con.execute(f"INSERT INTO {TABLE} BY NAME SELECT * FROM _sketch_rows")
        finally:
            con.unregister("_sketch_rows")
    # the batch's cells: those of its `cells` rows (a cell without sketch rows still counts in its group)
    keys = cells.get_column("cell_key") if cells is not None else rows.get_column("cell_key").unique()
    if keys.len():
        roll_up(con, keys, rows)
    return rows.height


# v_sketch_percentiles_merged without the rollup: the cells' rows merged at query time (the view's definition
# before migration 0022). What the rollup must answer exactly (tests/test_sketch_rollup.py), and the "before"
# of benchmarks/sketch_bench.py.
MERGED_AT_QUERY_TIME = """
WITH latest_ok AS (
    SELECT cell_key, campaign_id, variant, method, k, workload, load_mode, load_label, concurrency, rate,
           dense_rank() OVER (ORDER BY campaign_id, variant, workload, load_label) AS group_no
    FROM cells WHERE status = 'ok'
    QUALIFY row_number() OVER (PARTITION BY campaign_id, cell_id ORDER BY attempt DESC) = 1
), merged AS (
    SELECT c.group_no AS sketch_key, s.metric, s.bucket, sum(s.count)::BIGINT AS count
    FROM cell_sketches s JOIN latest_ok c USING (cell_key)
    GROUP BY c.group_no, s.metric, s.bucket
), groups AS (
    SELECT group_no, any_value(campaign_id) AS campaign_id, any_value(variant) AS variant,
           any_value(method) AS method, any_value(k) AS k, any_value(workload) AS workload,
           any_value(load_mode) AS load_mode, any_value(load_label) AS load_label,
           any_value(concurrency) AS concurrency, any_value(rate) AS rate, count(*) AS cells
    FROM latest_ok GROUP BY group_no
)
SELECT
    g.campaign_id, g.variant, g.method, g.k, g.workload, g.load_mode, g.load_label, g.concurrency, g.rate,
    g.cells, r.metric, r.n, r.p50_s, r.p90_s, r.p95_s, r.p99_s
FROM sketch_percentiles(merged) r JOIN groups g ON g.group_no = r.sketch_key
"""

# The rollup (migration 0022): per group of v_sketch_percentiles_merged, the sum of its counted cells' rows
# (the latest ok attempt of each cell id), with running count and total. Kept exact incrementally: a batch
# adds the rows of its cells that are now counted and subtracts those of cells it supersedes (a later ok
# attempt of the same cell id: read back from cell_sketches, the only case that scans it). Steps, each one
# statement over the touched groups only; group numbers are compared with a range first as well, so that
# DuckDB's min/max per row group skips most of group_sketches (an IN list alone scans all of it).
_ROLL_UP_STEPS = (
    # the batch's groups, numbered: existing numbers kept, new ones after the largest
    """CREATE OR REPLACE TEMP TABLE _sketch_touched AS
    WITH batch AS (
        SELECT DISTINCT campaign_id, variant, workload, load_label FROM cells
        WHERE cell_key IN (SELECT cell_key FROM _sketch_cells)
    )
    SELECT b.*, g.group_no IS NOT NULL AS existed,
        coalesce(g.group_no, (SELECT coalesce(max(group_no), 0) FROM sketch_groups)
        + row_number() OVER (PARTITION BY g.group_no IS NULL ORDER BY b.campaign_id, b.variant, b.workload,
                                                                          b.load_label))::INTEGER AS group_no
    FROM batch b LEFT JOIN sketch_groups g USING (campaign_id, variant, workload, load_label)""",
    # every cell of those groups: counted before the batch (latest ok attempt among the others) and after
    """CREATE OR REPLACE TEMP TABLE _sketch_members AS
    WITH members AS (
        SELECT c.cell_key, c.campaign_id, c.cell_id, c.attempt, c.status = 'ok' AS ok, t.group_no,
               c.cell_key IN (SELECT cell_key FROM _sketch_cells) AS new,
               c.method, c.k, c.load_mode, c.concurrency, c.rate
        FROM cells c JOIN _sketch_touched t USING (campaign_id, variant, workload, load_label)
        WHERE c.campaign_id IN (SELECT campaign_id FROM _sketch_touched)  -- one column first: cheap
    )
    SELECT *,
        ok AND attempt = max(CASE WHEN ok THEN attempt END) OVER cell_id AS after,
        ok AND NOT new AND attempt = max(CASE WHEN ok AND NOT new THEN attempt END) OVER cell_id AS before
    FROM members WINDOW cell_id AS (PARTITION BY campaign_id, cell_id)""",
)


def roll_up(
    con: duckdb.DuckDBPyConnection, cell_keys: pl.Series | list[str], rows: pl.DataFrame | None = None
) -> None:
    """Inside the caller's transaction: bring the rollup of the groups of `cell_keys` (cells just written to
    `cells`) up to date. `rows`: their cell_sketches rows (already inserted there too); None: read back from
    cell_sketches (a scan of it)."""
    con.register(
        "_sketch_cells", pl.DataFrame({"cell_key": pl.Series(cell_keys, dtype=pl.String)}).to_arrow()
    )
    if rows is not None:
        con.register("_sketch_batch", rows.select("cell_key", "metric", "bucket", "count").to_arrow())
    else:
        con.execute(
            f"CREATE OR REPLACE TEMP VIEW _sketch_batch AS SELECT cell_key, metric, bucket, count FROM {TABLE} "
            "WHERE cell_key IN (SELECT cell_key FROM _sketch_cells)"
        )
    try:
        for step in _ROLL_UP_STEPS:
            con.execute(step)
        low, high = con.execute("SELECT min(group_no), max(group_no) FROM _sketch_touched").fetchone()  # type: ignore[misc]
        if low is None:
            return
        touched = f"group_no BETWEEN {low} AND {high} AND group_no IN (SELECT group_no FROM _sketch_touched)"
        # only groups that existed have rows to read and replace (a campaign's first cells: none)
        existed = f"group_no IN (SELECT group_no FROM _sketch_touched WHERE existed) AND {touched}"
        any_existed = con.execute("SELECT bool_or(existed) FROM _sketch_touched").fetchone() == (True,)
        stored = (
            f"SELECT group_no, metric, bucket, count FROM group_sketches WHERE {existed} UNION ALL"
            if any_existed
            else ""
        )
        superseded = con.execute("SELECT count(*) FROM _sketch_members WHERE before AND NOT after").fetchone()
        gone = (
            f"""UNION ALL
            SELECT m.group_no, s.metric::sketch_metric, s.bucket, -s.count FROM {TABLE} s
            JOIN _sketch_members m USING (cell_key) WHERE m.before AND NOT m.after"""
            if superseded and superseded[0]
            else ""
        )
        con.execute(
            f"""CREATE OR REPLACE TEMP TABLE _sketch_counts AS
            SELECT group_no, metric, bucket, sum(count)::BIGINT AS count FROM (
                {stored}
                SELECT m.group_no, b.metric::sketch_metric AS metric, b.bucket, b.count FROM _sketch_batch b
                JOIN _sketch_members m USING (cell_key) WHERE m.after AND NOT m.before
                {gone}
            ) GROUP BY ALL HAVING sum(count) <> 0"""
        )
        if any_existed:
            con.execute(f"DELETE FROM group_sketches WHERE {existed}")
            con.execute(f"DELETE FROM sketch_groups WHERE {existed}")
        con.execute(
            """INSERT INTO group_sketches
            SELECT group_no, metric, bucket, count,
                sum(count) OVER (PARTITION BY group_no, metric ORDER BY bucket ROWS UNBOUNDED PRECEDING)::BIGINT,
                sum(count) OVER (PARTITION BY group_no, metric)::BIGINT
            FROM _sketch_counts ORDER BY group_no, metric, bucket"""
        )
        con.execute(
            """INSERT INTO sketch_groups
            SELECT t.group_no, t.campaign_id, t.variant, t.workload, t.load_label,
                any_value(m.method), any_value(m.k), any_value(m.load_mode), any_value(m.concurrency),
                any_value(m.rate), count(m.cell_key)
            FROM _sketch_touched t LEFT JOIN (SELECT * FROM _sketch_members WHERE after) m USING (group_no)
            GROUP BY ALL"""
        )
    finally:
        _drop_temporaries(con, from_rows=rows is not None)


def _drop_temporaries(con: duckdb.DuckDBPyConnection, from_rows: bool) -> None:
    """roll_up's temporary tables and views. In a failed transaction these statements fail too (and the
    temporary tables go with its roll-back): the original error is the one that propagates."""
    statements = [
        f"DROP TABLE IF EXISTS {t}" for t in ("_sketch_counts", "_sketch_members", "_sketch_touched")
    ]
    if not from_rows:
        statements.append("DROP VIEW IF EXISTS _sketch_batch")
    for statement in statements:
        try:
            con.execute(statement)
        except duckdb.Error:
            break
    con.unregister("_sketch_cells")
    if from_rows:
        con.unregister("_sketch_batch")
