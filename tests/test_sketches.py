"""Latency sketches stored at ingest (warehouse/sketches.py, migration 0017, the views of views.sql): keys and
values exactly the ddsketch package's, rows per cell, block and metric with the summary's definitions, per-cell
percentiles within 1% of the exact ones, merging equal to one sketch of the union, idempotent re-ingest."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from ddsketch import DDSketch
from hypothesis import given, settings
from hypothesis import strategies as st
from warehouse_fixtures import RawBuilder, make_spec

from tasks.metrics.summary import itl_per_token
from warehouse import sketches
from warehouse.db import reader, writer
from warehouse.ingest import ingest_raw, rebuild

QUANTILES = (0.50, 0.90, 0.95, 0.99)


# ------------------------------------------------------------------------------------------- the mapping


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.floats(min_value=-1e3, max_value=1e300, allow_nan=False, allow_infinity=False)
        | st.floats(min_value=1e-308, max_value=1e-300),
        min_size=1,
        max_size=200,
    )
)
def test_vectorised_keys_are_the_packages(values: list[float]) -> None:
    keys = sketches.bucket_keys(np.array(values))
    mapping = sketches.MAPPING
    expected = [mapping.key(v) if v > mapping.min_possible else sketches.ZERO_BUCKET for v in values]
    assert keys.tolist() == expected


def test_keys_on_bucket_boundaries_and_many_random_values() -> None:
    mapping = sketches.MAPPING
    # gamma^k, the boundaries themselves, and their float neighbours: where a last-bit difference between
    # numpy's log and libm's would move a value to the next bucket
    edges = np.array([math.pow(mapping.gamma, k) for k in range(-3000, 3000)])
    around = np.concatenate([edges, np.nextafter(edges, 0), np.nextafter(edges, np.inf)])
    rng = np.random.default_rng(7)
    random = np.exp(rng.uniform(-25, 12, 200_000))
    for values in (around, random):
        assert sketches.bucket_keys(values).tolist() == [mapping.key(float(v)) for v in values]
    # 0 and negatives: the zero bucket, as DDSketch counts zeros (negatives are latencies out of order)
    assert (
        sketches.bucket_keys(np.array([0.0, -0.5, mapping.min_possible])).tolist()
        == [sketches.ZERO_BUCKET] * 3
    )


def test_keys_where_the_float32_first_pass_is_least_sure() -> None:
    # bucket_keys estimates in float32 and recomputes in float64 what lies within _F32_TOLERANCE of a
    # boundary or outside [_FAST_LOW, _FAST_HIGH]: values a few float32 ulps off each boundary, and the
    # ends of that range with their neighbours, must still get the package's key
    mapping = sketches.MAPPING
    edges = np.array([math.pow(mapping.gamma, k) for k in range(-800, 800)])
    steps = np.array([j * 2.0**-24 for j in (-64, -16, -4, -2, -1, 1, 2, 4, 16, 64)])
    near = (edges[:, None] * (1 + steps[None, :])).ravel()
    ends = np.array([sketches._FAST_LOW, sketches._FAST_HIGH])
    ends = np.concatenate([ends, np.nextafter(ends, 0), np.nextafter(ends, np.inf), ends * (1 + 2.0**-24)])
    for values in (near, ends):
        assert sketches.bucket_keys(values).tolist() == [mapping.key(float(v)) for v in values]


def test_view_bucket_values_are_the_packages(tmp_path: Path) -> None:
    keys = list(range(-4000, 4000))
    with writer(tmp_path / "w.duckdb") as con:
        got = con.execute("SELECT sketch_value(k) FROM unnest(?::INTEGER[]) t(k)", [keys]).fetchall()
        zero = con.execute(f"SELECT sketch_value({sketches.ZERO_BUCKET})").fetchone()
    assert [v for (v,) in got] == [sketches.MAPPING.value(k) for k in keys]  # exactly: libm's pow both
    assert sketches.bucket_values(np.array(keys)).tolist() == [sketches.MAPPING.value(k) for k in keys]
    assert zero == (0.0,)


# ---------------------------------------------------------------------------------------- rows of a batch


def _requests(cell_key: str, sent: list[float], **columns: list) -> pl.DataFrame:
    n = len(sent)
    base = {
        "cell_key": [cell_key] * n,
        "phase": ["measured"] * n,
        "ok": [True] * n,
        "sent_s": sent,
        "ttft_s": [0.1] * n,
        "tpot_s": [0.02] * n,
        "e2e_s": [0.3] * n,
        "completion_tokens": [4] * n,
        "chunk_offsets_s": [[0.1, 0.14, 0.16]] * n,
        "chunk_tokens": [[1, 2, 1]] * n,
    }
    return pl.DataFrame(base | columns)


def test_rows_per_block_and_metric_follow_the_summarys_definitions() -> None:
    a = _requests(
        "c/a.a1",
        [5.0, 6.0, 9.0, 14.9, 15.0, 31.0],
        phase=["warmup"] + ["measured"] * 5,  # the window starts at the first measured send: 6.0
        ok=[True, True, True, True, False, True],
        completion_tokens=[4, 1, 4, 4, 4, 4],  # TPOT only of requests of 2 tokens or more
    )
    b = _requests("c/b.a1", [100.0, 101.0], ttft_s=[0.0, None])  # a TTFT of 0: the zero bucket
    rows = sketches.sketch_rows(pl.concat([a, b]))

    def counts(cell: str, metric: str) -> dict[tuple[int, int], int]:
        found = rows.filter((pl.col("cell_key") == cell) & (pl.col("metric") == metric))
        return {(r["block"], r["bucket"]): r["count"] for r in found.iter_rows(named=True)}

    key = sketches.MAPPING.key
    # measured and ok: sent 6.0, 9.0 (block 0: 0-10 s after 6.0), 14.9 (block 0), 31.0 (block 2)
    assert counts("c/a.a1", "ttft") == {(0, key(0.1)): 3, (2, key(0.1)): 1}
    assert counts("c/a.a1", "tpot") == {(0, key(0.02)): 2, (2, key(0.02)): 1}
    # ITL per token: gaps 0.04 before a 2-token chunk (2 x 0.02), 0.02 before a 1-token chunk (1 x 0.02)
    assert counts("c/a.a1", "itl") == {(0, key(0.02)): 9, (2, key(0.02)): 3}
    assert counts("c/b.a1", "ttft") == {(0, sketches.ZERO_BUCKET): 1}  # the null TTFT counts nowhere
    assert rows.schema == pl.Schema(sketches.SCHEMA)


# ------------------------------------------------------------------------------------ ingest and the views


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> RawBuilder:
    """Two repeats x three variants x two loads of 200 measured requests, written once."""
    builder = RawBuilder(
        tmp_path_factory.mktemp("sketch-template") / "raw", spec=make_spec(repeats=2, requests=200)
    )
    builder.write_all(captures=False)
    return builder


@pytest.fixture(scope="module")
def ingested(template: RawBuilder, tmp_path_factory: pytest.TempPathFactory) -> Path:
    db = tmp_path_factory.mktemp("sketch-db") / "w.duckdb"
    report = ingest_raw(template.raw_dir, db)
    assert report.ok, report.as_dict()
    return db


def _frame(db: Path, sql: str) -> pl.DataFrame:
    with reader(db) as con:
        return con.sql(sql).pl()


def _ok_requests(db: Path) -> pl.DataFrame:
    return _frame(
        db, "SELECT * FROM requests WHERE phase = 'measured' AND ok ORDER BY cell_key, request_index"
    )


def test_ingest_writes_each_cells_sketch_rows(ingested: Path) -> None:
    per_cell = _frame(
        ingested,
        "SELECT cell_key, metric, sum(count) AS n FROM cell_sketches GROUP BY ALL ORDER BY ALL",
    )
    requests = _ok_requests(ingested)
    cells = _frame(ingested, "SELECT cell_key, requests_ok FROM cells ORDER BY cell_key")
    assert per_cell.get_column("cell_key").unique().sort().to_list() == cells["cell_key"].to_list()
    for cell_key, ok_count in cells.iter_rows():
        n = dict(per_cell.filter(pl.col("cell_key") == cell_key).select("metric", "n").iter_rows())
        own = requests.filter(pl.col("cell_key") == cell_key)
        tokens_after_first_chunk = int(own["chunk_tokens"].list.slice(1).list.sum().sum())
        assert n == {"ttft": ok_count, "tpot": ok_count, "e2e": ok_count, "itl": tokens_after_first_chunk}


def _relative_errors(sketched: pl.DataFrame, exact: pl.DataFrame) -> np.ndarray:
    joined = sketched.join(exact, on=["cell_key", "metric"], suffix="_exact")
    assert joined.height == sketched.height == exact.height
    errors = [
        ((joined[f"p{q}_s"] - joined[f"p{q}_s_exact"]).abs() / joined[f"p{q}_s_exact"]).to_numpy()
        for q in ("50", "90", "95", "99")
    ]
    return np.concatenate(errors)


def test_cell_percentiles_within_one_percent_of_the_exact(ingested: Path) -> None:
    sketched = _frame(ingested, "SELECT * FROM v_sketch_percentiles")
    cells = _frame(ingested, "SELECT * FROM v_cells")
    exact = pl.concat(
        [
            cells.select(
                "cell_key",
                metric=pl.lit(metric),
                **{f"p{q}_s": pl.col(f"{metric}_p{q}_s") for q in ("50", "90", "95", "99")},
            )
            for metric in ("ttft", "tpot", "e2e")
        ]
    )
    # ITL per token: the summaries of these cells leave it out, so numpy over the same rows, as the
    # summary computes it (tasks.metrics.summary.itl_per_token)
    requests = _ok_requests(ingested).rename({"request_index": "index"})
    itl = []
    for cell_key in cells["cell_key"]:
        values = itl_per_token(requests.filter(pl.col("cell_key") == cell_key))
        points = np.percentile(values, [50, 90, 95, 99], method="linear")
        itl.append(
            {"cell_key": cell_key, "metric": "itl"}
            | dict(zip(["p50_s", "p90_s", "p95_s", "p99_s"], points, strict=True))
        )
    exact = pl.concat([exact, pl.DataFrame(itl)], how="vertical_relaxed")
    errors = _relative_errors(
        sketched.filter(pl.col("metric") != "itl"), exact.filter(pl.col("metric") != "itl")
    )
    assert errors.max() <= sketches.ALPHA, errors.max()
    assert errors.max() > 0  # a sketch, not the exact figures copied
    itl_errors = _relative_errors(
        sketched.filter(pl.col("metric") == "itl"), exact.filter(pl.col("metric") == "itl")
    )
    assert itl_errors.max() <= sketches.ALPHA, itl_errors.max()


def _package_quantile(sketch: DDSketch, q: float) -> float:
    """The interpolated answer the views give, from the package's own sketch: its answers at the ranks
    around q (n - 1) (DDSketch's rank walk, key_at_rank), mixed as numpy's linear percentile does."""
    n = sketch.count
    rank = q * (n - 1)
    low = math.floor(rank)

    def at(r: float) -> float:
        if r < sketch._zero_count:
            return 0.0
        return sketches.MAPPING.value(sketch._store.key_at_rank(r - sketch._zero_count))

    assert at(low) == sketch.get_quantile_value(q)  # the lower rank's is DDSketch's own answer
    upper = at(min(low + 1, n - 1))
    return at(low) + (rank - low) * (upper - at(low))


def test_merged_view_is_the_sketch_of_the_union(ingested: Path) -> None:
    merged = _frame(ingested, "SELECT * FROM v_sketch_percentiles_merged")
    cells = _frame(ingested, "SELECT cell_key, variant, workload, load_label FROM v_cells")
    requests = _ok_requests(ingested)
    assert merged.height == cells.select("variant", "workload", "load_label").n_unique() * 4
    assert set(merged["cells"]) == {2}  # two repeats each
    for group in merged.filter(pl.col("metric") == "ttft").iter_rows(named=True):
        keys = cells.filter(
            (pl.col("variant") == group["variant"]) & (pl.col("load_label") == group["load_label"])
        )["cell_key"]
        per_cell = []
        for key in keys:
            one = DDSketch(sketches.ALPHA)
            for v in requests.filter(pl.col("cell_key") == key)["ttft_s"]:
                one.add(v)
            per_cell.append(one)
        merged_sketch, union = per_cell[0], DDSketch(sketches.ALPHA)
        for other in per_cell[1:]:
            merged_sketch.merge(other)  # the package's merge ...
        for v in requests.filter(pl.col("cell_key").is_in(keys.to_list()))["ttft_s"]:
            union.add(v)  # ... and one sketch of all the values
        assert group["n"] == union.count == merged_sketch.count
        for q in QUANTILES:
            expected = _package_quantile(union, q)
            assert _package_quantile(merged_sketch, q) == pytest.approx(expected, rel=1e-12)
            assert group[f"p{int(q * 100)}_s"] == pytest.approx(expected, rel=1e-12)


def test_reingest_adds_no_sketch_rows_and_rebuild_gives_the_same(
    template: RawBuilder, tmp_path: Path
) -> None:
    raw = tmp_path / "raw"
    shutil.copytree(template.raw_dir, raw)
    db = tmp_path / "w.duckdb"
    assert ingest_raw(raw, db).ok
    everything = "SELECT * FROM cell_sketches ORDER BY ALL"
    first = _frame(db, everything)
    again = ingest_raw(raw, db)
    assert {o.action for o in again.outcomes} == {"skipped"}
    assert _frame(db, everything).equals(first)
    rebuild(raw, db)
    assert _frame(db, everything).equals(first)
    assert first.height > 0


# ------------------------------------------------------------- the numpy counting against the polars one


def _reference_rows(requests: pl.DataFrame) -> pl.DataFrame:
    """sketch_rows as it was before it counted in numpy (2026-12-05): polars frames grouped by four columns,
    keys by the package itself. What the numpy version must give exactly."""
    start = pl.col("sent_s").min().over("cell_key")
    ok = (
        requests.filter(pl.col("phase") == "measured")
        .with_columns(block=((pl.col("sent_s") - start) / sketches.BLOCK_S).floor().cast(pl.Int32))
        .filter(pl.col("ok").fill_null(False))
    )

    def one(metric: str, column: str, rows: pl.DataFrame) -> pl.DataFrame:
        return rows.select(
            "cell_key", "block", metric=pl.lit(metric), value=column, weight=pl.lit(1, pl.Int64)
        ).drop_nulls("value")

    itl = (
        ok.filter(pl.col("chunk_offsets_s").list.len() == pl.col("chunk_tokens").list.len())
        .select(
            "cell_key",
            "block",
            gap=pl.col("chunk_offsets_s").list.diff().list.slice(1),
            tokens=pl.col("chunk_tokens").list.slice(1),
        )
        .explode(["gap", "tokens"])
        .drop_nulls()
        .filter(pl.col("tokens") > 0)
        .select(
            "cell_key",
            "block",
            metric=pl.lit("itl"),
            value=pl.col("gap") / pl.col("tokens"),
            weight=pl.col("tokens").cast(pl.Int64),
        )
    )
    values = pl.concat(
        [
            one("ttft", "ttft_s", ok),
            one("tpot", "tpot_s", ok.filter(pl.col("completion_tokens") >= 2)),
            one("e2e", "e2e_s", ok),
            itl,
        ]
    ).filter(pl.col("value").is_finite())
    mapping = sketches.MAPPING
    keys = [mapping.key(v) if v > mapping.min_possible else sketches.ZERO_BUCKET for v in values["value"]]
    return (
        values.with_columns(bucket=pl.Series(keys, dtype=pl.Int32))
        .group_by("cell_key", "block", "metric", "bucket")
        .agg(count=pl.col("weight").sum())
        .cast(sketches.SCHEMA)  # type: ignore[arg-type]
    )


def _hostile_requests() -> pl.DataFrame:
    """Every case the definitions single out, in one batch of three cells."""
    return pl.concat(
        [
            _requests(
                "c/x.a1",
                [0.0, 3.0, 12.0, 25.0, 26.0, 27.0],
                ok=[True, None, True, True, True, True],  # an unknown ok counts as failed
                ttft_s=[0.1, 0.1, None, float("nan"), 0.0, 1e-30],
                tpot_s=[
                    float("inf"),
                    0.02,
                    0.03,
                    0.02,
                    None,
                    2e7,
                ],  # inf: no bucket; 2e7: beyond the fast range
                completion_tokens=[4, 4, None, 1, 2, 3],
                chunk_offsets_s=[[0.1, 0.12, 0.11], [], None, [0.5, None, 0.6], [0.2], [0.1, 0.3, 0.9]],
                chunk_tokens=[[1, 0, 2], [], [1, 2], [1, 1, None], [1], [1, 2]],  # the last: lengths differ
            ),
            _requests("c/y.a1", [50.0, 51.0], phase=["warmup", "warmup"]),  # no measured rows at all
            _requests("c/z.a1", [7.0, 100.0], ok=[False, True]),  # the failed first one still starts block 0
        ]
    ).with_columns(pl.col("chunk_tokens").cast(pl.List(pl.Int32)))


def _same_rows(got: pl.DataFrame, expected: pl.DataFrame) -> None:
    order = ["cell_key", "block", "metric", "bucket"]
    assert got.schema == expected.schema
    assert got.sort(order).equals(expected.sort(order))


def test_rows_of_hostile_requests_are_the_references() -> None:
    requests = _hostile_requests()
    expected = _reference_rows(requests)
    assert expected.filter(pl.col("bucket") == sketches.ZERO_BUCKET).height  # the cases are exercised
    _same_rows(sketches.sketch_rows(requests), expected)


def test_rows_of_a_campaign_are_the_references_in_every_counting_path(
    ingested: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    requests = _frame(ingested, "SELECT * FROM requests")  # every phase and outcome, as the ingest hands them
    expected = _reference_rows(requests)
    assert expected.height > 500
    _same_rows(sketches.sketch_rows(requests), expected)  # one chunk, dense counting
    monkeypatch.setattr(sketches, "_CHUNK_REQUESTS", 137)  # cells' blocks straddling chunks
    _same_rows(sketches.sketch_rows(requests), expected)
    monkeypatch.setattr(sketches, "_DENSE_SLOTS", 0)  # the group_by for code spaces too large
    _same_rows(sketches.sketch_rows(requests), expected)
