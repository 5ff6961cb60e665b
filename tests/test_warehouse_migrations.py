"""Versioned schema: numbered migrations applied in order, each in one transaction, recorded; a database
built at an older version migrates forward with its data intact."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner
from warehouse_fixtures import RawBuilder, make_spec

from cli.app import app
from warehouse.db import available_migrations, connect, migrate, reader, schema_version
from warehouse.errors import MigrationError
from warehouse.ingest import ingest_tree, rebuild

VIEWS_0001 = ("v_cells", "v_speedup", "v_acceptance", "v_acceptance_positions", "v_capacity")


def test_a_0001_database_with_data_migrates_to_head(tmp_path: Path) -> None:
    raw = RawBuilder(tmp_path / "raw", spec=make_spec(repeats=2))
    raw.write_all()
    # Today's ingest writes columns later migrations added, so the 0001 data is what an ingest at head
    # stored, cut to the columns 0001's tables have: what the code of 0001 would have written.
    current = connect(tmp_path / "head.duckdb")
    migrate(current)
    assert ingest_tree(current, raw.raw_dir).ok
    current.close()
    db = tmp_path / "old.duckdb"
    con = connect(db)
    assert [m.version for m in migrate(con, target=1)] == [1]
    assert schema_version(con) == 1
    con.execute(f"ATTACH '{tmp_path / 'head.duckdb'}' AS head (READ_ONLY)")
    tables = con.execute(
        "SELECT table_name FROM duckdb_tables() WHERE database_name = current_database() "
        "AND table_name NOT LIKE 'schema_%'"
    ).fetchall()
    for (table,) in tables:
        columns = [c[0] for c in con.execute(f"DESCRIBE {table}").fetchall()]
        listed = ", ".join(f'"{c}"' for c in columns)
        con.execute(f"INSERT INTO {table} ({listed}) SELECT {listed} FROM head.{table}")
    con.execute("DETACH head")
    assert con.execute("SELECT count(*) FROM cells").fetchone()[0] > 0
    old_columns = {v: [c[0] for c in con.execute(f"DESCRIBE {v}").fetchall()] for v in VIEWS_0001}
    old = {v: con.execute(f"SELECT * FROM {v} ORDER BY ALL").fetchall() for v in VIEWS_0001}
    old_requests = con.execute("SELECT count(*), sum(e2e_s) FROM requests").fetchall()
    con.close()
    head = available_migrations()[-1].version

    result = CliRunner().invoke(app, ["warehouse", "migrate", "--db", str(db)])

    assert result.exit_code == 0, result.output
    later = [m.label for m in available_migrations() if m.version > 1]
    for label in later:
        assert f"applied {label}" in result.stdout
    assert f"schema version {head:04d}" in result.stdout
    with reader(db) as con:
        assert schema_version(con) == head
        recorded = con.execute(
            "SELECT version, name, checksum FROM schema_migrations ORDER BY version"
        ).fetchall()
        assert recorded == [(m.version, m.name, m.checksum) for m in available_migrations()]
        # the views keep every column and row they had (later columns come after, NULL for old rows)
        assert {
            v: con.execute(
                f"SELECT {', '.join(chr(34) + c + chr(34) for c in old_columns[v])} FROM {v} ORDER BY ALL"
            ).fetchall()
            for v in VIEWS_0001
        } == old
        assert con.execute("SELECT count(*), sum(e2e_s) FROM requests").fetchall() == old_requests
    # the old request rows stay in DuckDB (requests_legacy) until a rebuild moves them to Parquet files
    assert "`specgauge warehouse rebuild` moves them" in result.stdout
    again = CliRunner().invoke(app, ["warehouse", "migrate", "--db", str(db)])
    assert again.exit_code == 0 and "up to date" in again.stdout
    assert rebuild(raw.raw_dir, db).ok
    with reader(db) as con:
        assert con.execute("SELECT count(*) FROM requests_legacy").fetchone() == (0,)
        assert con.execute("SELECT count(*), sum(e2e_s) FROM requests").fetchall() == old_requests
        assert con.execute(
            "SELECT sum(rows) FROM warehouse_parts WHERE table_name = 'requests'"
        ).fetchone() == (old_requests[0][0],)
    moved = CliRunner().invoke(app, ["warehouse", "migrate", "--db", str(db)])
    assert "moves them" not in moved.stdout


@pytest.fixture
def migrations(tmp_path: Path) -> Path:
    folder = tmp_path / "migrations"
    folder.mkdir()
    (folder / "0001_start.sql").write_text("CREATE TABLE t (x INTEGER);\n")
    (folder / "0002_more.sql").write_text(
        "ALTER TABLE t ADD COLUMN y VARCHAR;\nCREATE VIEW v_t AS SELECT x, coalesce(y, 'none') AS y FROM t;\n"
    )
    return folder


def test_runner_applies_in_order_and_rolls_a_failed_migration_back(migrations: Path, tmp_path: Path) -> None:
    con = connect(tmp_path / "w.duckdb")
    migrate(con, directory=migrations, target=1)
    con.execute("INSERT INTO t VALUES (1), (2)")
    assert [m.label for m in migrate(con, directory=migrations)] == ["0002_more"]
    assert con.execute("SELECT * FROM v_t ORDER BY x").fetchall() == [(1, "none"), (2, "none")]

    (migrations / "0003_broken.sql").write_text(
        "CREATE TABLE u (a INTEGER);\nINSERT INTO t SELECT * FROM no_such_table;\n"
    )
    with pytest.raises(MigrationError, match=r"0003_broken\.sql"):
        migrate(con, directory=migrations)
    assert schema_version(con) == 2
    tables = {r[0] for r in con.execute("SELECT table_name FROM information_schema.tables").fetchall()}
    assert "u" not in tables  # the failed file's first statement was rolled back with it
    assert con.execute("SELECT count(*) FROM t").fetchone() == (2,)
    con.close()


def test_runner_refuses_edited_unknown_and_misnamed_migrations(migrations: Path, tmp_path: Path) -> None:
    con = connect(tmp_path / "w.duckdb")
    migrate(con, directory=migrations)

    (migrations / "0001_start.sql").write_text("CREATE TABLE t (x BIGINT);\n")
    with pytest.raises(MigrationError, match="changed after it was applied"):
        migrate(con, directory=migrations)

    shutil.rmtree(migrations)
    migrations.mkdir()
    (migrations / "0001_start.sql").write_text("CREATE TABLE t (x INTEGER);\n")
    with pytest.raises(MigrationError, match="0002_more, which this code does not know"):
        migrate(con, directory=migrations)

    (migrations / "2_oops.sql").write_text("SELECT 1;\n")
    with pytest.raises(MigrationError, match=r"NNNN_lowercase_name\.sql"):
        available_migrations(migrations)
    (migrations / "2_oops.sql").unlink()
    (migrations / "0001_again.sql").write_text("SELECT 1;\n")
    with pytest.raises(MigrationError, match="also used by"):
        available_migrations(migrations)
    con.close()


def test_docs_describe_every_column_of_every_0001_table_and_view() -> None:
    import re

    import duckdb

    docs = (Path(__file__).resolve().parent.parent / "docs" / "warehouse.md").read_text()
    sections = dict(re.findall(r"^### (\w+)\n(.*?)(?=^### |\Z)", docs, flags=re.M | re.S))
    con = duckdb.connect()
    migrate(con, target=1)
    names = [r[0] for r in con.execute("SELECT table_name FROM information_schema.tables").fetchall()]
    undocumented = {}
    for name in names:
        section = sections.get(name, "")
        columns = [r[0] for r in con.execute(f'DESCRIBE "{name}"').fetchall()]
        missing = [c for c in columns if not re.search(rf"(?<![\w]){c}(?![\w])", section)]
        if missing or not section:
            undocumented[name] = missing or "no section"
    assert not undocumented, f"docs/warehouse.md lacks: {undocumented}"
