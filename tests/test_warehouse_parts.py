"""Request rows as immutable Parquet files (warehouse/parts.py): a write adds files and never rewrites one,
a file is visible exactly when its transaction commits, orphans are swept after their grace period,
rebuild writes a new generation, and the root can be put elsewhere (a shared filesystem)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import polars as pl
import pytest
from warehouse_fixtures import RawBuilder, make_spec

from specgauge.settings import get_settings
from warehouse import parts
from warehouse.db import reader, snapshot_path, writer
from warehouse.ingest import ingest_raw, rebuild


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> RawBuilder:
    builder = RawBuilder(tmp_path_factory.mktemp("parts") / "raw", spec=make_spec(repeats=2))
    builder.write_all(captures=False)
    return builder


@pytest.fixture
def raw(template: RawBuilder, tmp_path: Path) -> RawBuilder:
    shutil.copytree(template.raw_dir, tmp_path / "raw")
    return RawBuilder(tmp_path / "raw", spec=template.spec)


def one(db: Path, sql: str) -> object:
    with reader(db) as con:
        found = con.execute(sql).fetchone()
    assert found is not None
    return found[0]


def on_disk(db: Path) -> dict[str, tuple[int, int]]:
    """Every Parquet file under the warehouse's parts root (relative name -> inode, mtime)."""
    root = parts.parts_dir(db)
    return {
        str(p.relative_to(root)): (p.stat().st_ino, p.stat().st_mtime_ns)
        for p in sorted(root.rglob("*.parquet"))
    }


def listed(db: Path) -> set[str]:
    with reader(db) as con:
        return {f for (f,) in con.execute("SELECT file FROM warehouse_parts").fetchall()}


def test_request_rows_are_parquet_files_beside_a_small_database(raw: RawBuilder, tmp_path: Path) -> None:
    db = tmp_path / "w.duckdb"
    report = ingest_raw(raw.raw_dir, db)
    assert report.ok, report.as_dict()
    per_cell = raw.spec.load.requests + raw.spec.load.warmup

    assert one(db, "SELECT count(*) FROM requests") == report.rows_by_table["requests"] == 12 * per_cell
    assert one(db, "SELECT count(*) FROM gauges") == report.rows_by_table["gauges"] > 0
    assert one(db, "SELECT count(*) FROM requests_legacy") == 0  # nothing of them in DuckDB
    assert one(db, "SELECT count(*) FROM gauges_legacy") == 0
    files = on_disk(db)
    assert set(files) == listed(db) and files
    assert all(f.split("/")[1] == raw.campaign_id for f in files)  # <table>/<campaign_id>/<name>
    assert one(db, "SELECT sum(rows) FROM warehouse_parts WHERE table_name = 'requests'") == 12 * per_cell
    # the snapshot readers open holds the small tables only: `requests` there is a view over the files
    with reader(db) as con:
        kinds = dict(
            con.execute(
                "SELECT table_name, table_type FROM information_schema.tables "
                "WHERE table_name IN ('requests', 'gauges', 'cells')"
            ).fetchall()
        )
    assert kinds == {"requests": "VIEW", "gauges": "VIEW", "cells": "BASE TABLE"}
    assert snapshot_path(db).exists()


def test_a_write_adds_files_and_never_rewrites_one(raw: RawBuilder, tmp_path: Path) -> None:
    db = tmp_path / "w.duckdb"
    ingest_raw(raw.raw_dir, db)
    before = on_disk(db)
    again = ingest_raw(raw.raw_dir, db)  # idempotent: every cell skipped, no file written
    assert again.rows == 0 and on_disk(db) == before

    slot = raw.slot("plain", 1)
    raw.write_cell(slot, slot.cells[0])  # a new attempt of one cell
    assert ingest_raw(raw.raw_dir, db).rows_by_table["requests"] > 0
    after = on_disk(db)
    assert {k: after[k] for k in before} == before  # the old files untouched (same inode, same mtime)
    assert len(after) > len(before) and set(after) == listed(db)
    assert one(db, "SELECT count(DISTINCT cell_key) FROM requests") == 13


def test_a_rolled_back_batch_leaves_no_file(raw: RawBuilder, tmp_path: Path) -> None:
    db = tmp_path / "w.duckdb"

    def crash(kind: str, keys: list[str]) -> None:
        if kind == "cell":
            assert on_disk(db), "the batch's files are written before its commit"
            raise RuntimeError("crash inside the transaction")

    with pytest.raises(RuntimeError, match="crash inside"):
        ingest_raw(raw.raw_dir, db, before_commit=crash)
    assert on_disk(db) == {}
    assert one(db, "SELECT count(*) FROM requests") == 0
    assert one(db, "SELECT count(*) FROM cells") == 0


def test_a_file_no_transaction_committed_is_invisible_then_swept(raw: RawBuilder, tmp_path: Path) -> None:
    db = tmp_path / "w.duckdb"
    ingest_raw(raw.raw_dir, db)
    count = one(db, "SELECT count(*) FROM requests")
    root, first = parts.parts_dir(db), sorted(listed(db))[0]
    with writer(db):  # what a writer killed between writing a file and committing leaves behind
        stray = parts.write_part(root, "requests", "other-campaign", pl.read_parquet(root / first), "dead")
    assert one(db, "SELECT count(*) FROM requests") == count  # not listed: not visible
    assert (root / stray.name).exists()

    with writer(db) as con:  # a writer sweeps at opening, but only past the grace period
        assert parts.sweep(con) == []
    old = os.stat(root / stray.name).st_mtime - parts.ORPHAN_GRACE_S - 1
    os.utime(root / stray.name, (old, old))
    with writer(db):
        pass
    assert not (root / stray.name).exists()
    assert set(on_disk(db)) == listed(db) and one(db, "SELECT count(*) FROM requests") == count


def test_files_of_another_schema_are_read_together_by_name(raw: RawBuilder, tmp_path: Path) -> None:
    db = tmp_path / "w.duckdb"
    ingest_raw(raw.raw_dir, db)
    count = one(db, "SELECT count(*) FROM requests")
    root = parts.parts_dir(db)
    rows = pl.read_parquet(root / sorted(listed(db))[0]).head(3)
    with writer(db) as con:  # a file written after a column was added to the table's model
        con.execute("BEGIN TRANSACTION")
        newer = parts.write_part(root, "requests", "c", rows.with_columns(pl.lit(7).alias("added")), "later")
        parts.record(con, root, [newer])
        con.execute("COMMIT")
    assert newer.name.split(".")[-2] != sorted(listed(db))[0].split(".")[-2]  # another schema tag
    assert one(db, "SELECT count(*) FROM requests") == count + 3
    assert one(db, "SELECT count(added) FROM requests") == 3  # null in the older files' rows
    with reader(db) as con:
        sql = con.execute("SELECT sql FROM duckdb_views() WHERE view_name = 'requests'").fetchone()[0]
    assert sql.count("read_parquet(") == 2 and "union_by_name" not in sql


def test_rebuild_writes_new_files_and_retires_the_old(raw: RawBuilder, tmp_path: Path) -> None:
    db = tmp_path / "w.duckdb"
    ingest_raw(raw.raw_dir, db)
    old = listed(db)
    rows = one(db, "SELECT count(*), sum(ttft_s) FROM (SELECT * FROM requests)")
    with reader(db) as held:  # a reader of the old snapshot, open across the rebuild
        assert rebuild(raw.raw_dir, db).ok
        # the old files outlive the rebuild, so the old snapshot still reads
        assert held.execute("SELECT count(*) FROM requests").fetchone()[0] == 12 * (
            raw.spec.load.requests + raw.spec.load.warmup
        )
    new = listed(db)
    assert new and not new & old
    assert set(on_disk(db)) == old | new
    assert one(db, "SELECT count(*), sum(ttft_s) FROM (SELECT * FROM requests)") == rows
    with writer(db) as con:
        removed = parts.sweep(con, grace_s=0)
    assert {str(p.relative_to(parts.parts_dir(db))) for p in removed} == old
    assert set(on_disk(db)) == new


def test_the_parts_root_can_live_elsewhere(
    raw: RawBuilder, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shared = tmp_path / "shared"
    monkeypatch.setenv("SPECGAUGE_WAREHOUSE_PARTS", str(shared))
    get_settings.cache_clear()
    try:
        db = tmp_path / "w.duckdb"
        assert ingest_raw(raw.raw_dir, db).ok
        assert parts.parts_dir(db) == shared / "w.duckdb.parts"
        assert not (tmp_path / "w.duckdb.parts").exists()
        assert set(on_disk(db)) == listed(db) and listed(db)
        assert one(db, "SELECT count(*) FROM requests") == 12 * (
            raw.spec.load.requests + raw.spec.load.warmup
        )
    finally:
        monkeypatch.delenv("SPECGAUGE_WAREHOUSE_PARTS")
        get_settings.cache_clear()
