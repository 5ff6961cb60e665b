"""The per-group rollup of the latency sketches kept at ingest (warehouse/sketches.py `roll_up`, migration
0022, v_sketch_percentiles_merged): through ingests in several runs and retried cells (a later ok attempt
supersedes the earlier one; a failed attempt counts nothing, even with ok requests), the merged view answers
exactly what merging the per-cell rows by hand answers (the view's definition before the rollup), the rollup
equals the migration's backfill from the per-cell rows, and, over random batches of attempts in any order,
the counts of the latest ok attempts."""

from __future__ import annotations

import itertools
from pathlib import Path

import duckdb
import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from warehouse_fixtures import RawBuilder, make_spec

from warehouse import sketches
from warehouse.db import MIGRATIONS_DIR, migrate, reader, writer
from warehouse.ingest import ingest_raw

ROLLUP = """
SELECT g.* EXCLUDE (group_no), s.metric::VARCHAR AS metric, s.bucket, s.count, s.cum, s.n
FROM sketch_groups g LEFT JOIN group_sketches s USING (group_no) ORDER BY ALL
"""


def _frame(db: Path, sql: str) -> pl.DataFrame:
    with reader(db) as con:
        return con.sql(sql).pl()


def test_rollup_through_runs_and_retries_is_the_merge_by_hand_and_the_backfill(tmp_path: Path) -> None:
    builder = RawBuilder(tmp_path / "raw", spec=make_spec(repeats=2, requests=60))
    builder.write_campaign()
    db = tmp_path / "w.duckdb"
    slots = builder.plan.deployments
    for slot in slots:  # one ingest per launch: each group's repeats arrive in different runs
        builder.write_deployment(slot)
        for cell in slot.cells:
            builder.write_cell(slot, cell)
        assert ingest_raw(builder.raw_dir, db).ok
    retried, failed = slots[0].cells[0], slots[1].cells[1]
    builder.write_cell(slots[0], retried)  # attempt 2, ok: supersedes attempt 1 in its group
    builder.write_cell(slots[1], failed, status="failed")  # attempt 2, failed (its ok requests: not counted)
    assert ingest_raw(builder.raw_dir, db).ok

    attempts = _frame(
        db, "SELECT cell_id, count(*) AS n, list(status ORDER BY attempt) AS s FROM cells GROUP BY 1"
    )
    assert sorted(attempts.filter(pl.col("n") == 2)["s"].to_list()) == [["ok", "failed"], ["ok", "ok"]]
    order = ["campaign_id", "variant", "workload", "load_label", "metric"]
    merged = _frame(db, "SELECT * FROM v_sketch_percentiles_merged").sort(order)
    by_hand = _frame(db, sketches.MERGED_AT_QUERY_TIME).sort(order)
    assert merged.height == by_hand.height > 0
    assert merged.equals(by_hand), merged.join(by_hand, on=order, suffix="_hand")
    # the retried cell's group counts 2 cells and the values of the ok retry, not of both attempts
    assert set(merged["cells"]) == {2}

    rolled = _frame(db, ROLLUP)
    with writer(db) as con:  # the migration's backfill from the per-cell rows gives the same rollup
        con.execute("DROP TABLE group_sketches; DROP TABLE sketch_groups; DROP TYPE sketch_metric")
        con.execute("DELETE FROM schema_migrations WHERE version = 22")
        assert [m.version for m in migrate(con, directory=MIGRATIONS_DIR)] == [22]
    assert _frame(db, ROLLUP).equals(rolled)


# ------------------------------------------------------------------- random batches against a model of them

CELL_COLUMNS = (
    "cell_key, campaign_id, cell_id, attempt, deployment_id, variant, method, repeat, workload, load_label, "
    "load_mode, sampling_key, engine_key, status, source_path, sha256, concurrency"
)
campaign_numbers = itertools.count()

# one attempt: (cell id 0-3, attempt 1-3, ok?, the buckets and counts of its ttft and itl values)
attempt_strategy = st.tuples(
    st.integers(0, 3),
    st.integers(1, 3),
    st.booleans(),
    st.lists(
        st.tuples(st.sampled_from(["ttft", "itl"]), st.integers(-3, 3), st.integers(1, 5)),
        min_size=0,
        max_size=6,
    ),
)


@pytest.fixture(scope="module")
def warehouse(tmp_path_factory: pytest.TempPathFactory) -> Path:
    db = tmp_path_factory.mktemp("rollup") / "w.duckdb"
    with writer(db):
        pass
    return db


def _expected(attempts: dict[tuple[int, int], tuple[bool, list[tuple[str, int, int]]]]) -> dict:
    """group (cell id % 2) -> metric -> bucket -> count, over the latest ok attempt of each cell id."""
    latest: dict[int, int] = {}
    for (cell, attempt), (ok, _) in attempts.items():
        if ok:
            latest[cell] = max(latest.get(cell, 0), attempt)
    out: dict = {}
    for cell, attempt in latest.items():
        for metric, bucket, count in attempts[(cell, attempt)][1]:
            per_bucket = out.setdefault(cell % 2, {}).setdefault(metric, {})
            per_bucket[bucket] = per_bucket.get(bucket, 0) + count
    return out


def _stored(con: duckdb.DuckDBPyConnection, campaign: str) -> dict:
    rows = con.execute(
        "SELECT g.load_label, s.metric::VARCHAR, s.bucket, s.count, s.cum, s.n FROM group_sketches s "
        "JOIN sketch_groups g USING (group_no) WHERE g.campaign_id = ? ORDER BY 1, 2, 3",
        [campaign],
    ).fetchall()
    out: dict = {}
    for (label, metric), group in itertools.groupby(rows, key=lambda r: (r[0], r[1])):
        group = list(group)
        counts = [r[3] for r in group]
        assert [r[4] for r in group] == list(itertools.accumulate(counts))  # cum: running, bucket order
        assert {r[5] for r in group} == {sum(counts)}  # n: the total
        out.setdefault(int(label[1:]), {})[metric] = {r[2]: r[3] for r in group}
    return out


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batches=st.lists(st.lists(attempt_strategy, min_size=1, max_size=4), min_size=1, max_size=4))
def test_rollup_after_every_batch_counts_the_latest_ok_attempts(warehouse: Path, batches: list) -> None:
    campaign = f"c{next(campaign_numbers)}"
    seen: dict[tuple[int, int], tuple[bool, list[tuple[str, int, int]]]] = {}
    with writer(warehouse) as con:
        for batch in batches:
            new = {}
            for cell, attempt, ok, values in batch:
                if (cell, attempt) not in seen and (cell, attempt) not in new:
                    new[(cell, attempt)] = (ok, values)
            if not new:
                continue
            keys = [f"{campaign}/cell{c}.a{a}" for c, a in new]
            con.execute("BEGIN TRANSACTION")
            con.executemany(
                f"INSERT INTO cells ({CELL_COLUMNS}) VALUES "
                "(?, ?, ?, ?, 'd', 'v', 'plain', 0, 'w', ?, 'concurrency', 's', 'e', ?, 'p', 'h', 1)",
                [
                    [key, campaign, f"cell{c}", a, f"L{c % 2}", "ok" if ok else "failed"]
                    for key, ((c, a), (ok, _)) in zip(keys, new.items(), strict=True)
                ],
            )
            rows = pl.DataFrame(
                [
                    {"cell_key": key, "block": 0, "metric": metric, "bucket": bucket, "count": count}
                    for key, (_, values) in zip(keys, new.values(), strict=True)
                    for metric, bucket, count in values
                ],
                schema=sketches.SCHEMA,
            )
            rows = rows.group_by("cell_key", "block", "metric", "bucket").agg(pl.col("count").sum())
            if rows.height:
                con.register("_rows", rows.to_arrow())
                con.execute("INSERT INTO cell_sketches BY NAME SELECT * FROM _rows")
                con.unregister("_rows")
            sketches.roll_up(con, keys, rows)
            con.execute("COMMIT")
            seen |= new
            assert _stored(con, campaign) == _expected(seen), (batches, seen)
            counted = con.execute(
                "SELECT load_label, cells FROM sketch_groups WHERE campaign_id = ? AND cells > 0", [campaign]
            ).fetchall()
            ok_cells = {c for (c, _), (ok, _) in seen.items() if ok}
            assert dict(counted) == {
                f"L{g}": sum(1 for c in ok_cells if c % 2 == g)
                for g in (0, 1)
                if any(c % 2 == g for c in ok_cells)
            }
