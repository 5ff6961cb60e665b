"""`specgauge ingest`, `specgauge warehouse info|rebuild` and `specgauge sql` with its four output formats."""

from __future__ import annotations

import csv
import io
import json
import shutil
from pathlib import Path

import polars as pl
import pytest
from typer.testing import CliRunner
from warehouse_fixtures import RawBuilder, make_spec

from cli.app import app
from specgauge.settings import get_settings
from warehouse.db import reader
from warehouse.parts import parts_dir

runner = CliRunner()


@pytest.fixture(scope="module")
def warehouse(tmp_path_factory: pytest.TempPathFactory) -> tuple[RawBuilder, Path]:
    root = tmp_path_factory.mktemp("cli")
    raw = RawBuilder(root / "raw", spec=make_spec(repeats=2))
    raw.write_all()
    db = root / "w.duckdb"
    result = runner.invoke(app, ["ingest", str(raw.raw_dir), "--db", str(db)])
    assert result.exit_code == 0, result.output
    return raw, db


def sql(db: Path, query: str, *args: str):
    return runner.invoke(app, ["sql", query, "--db", str(db), *args])


SPEEDUPS = (
    "SELECT cell_id, throughput_speedup, acceptance_rate_per_position FROM v_speedup "
    "JOIN v_acceptance USING (campaign_id, cell_id) ORDER BY cell_id"
)


def expected(db: Path) -> list[tuple]:
    with reader(db) as con:
        return con.execute(SPEEDUPS).fetchall()


def test_ingest_prints_what_it_did(warehouse: tuple[RawBuilder, Path]) -> None:
    raw, db = warehouse
    again = runner.invoke(app, ["ingest", str(raw.raw_dir), "--db", str(db)])
    assert again.exit_code == 0
    assert "skipped" in again.stdout and "rows written: none" in again.stdout


def test_sql_csv_is_a_header_then_rows(warehouse: tuple[RawBuilder, Path]) -> None:
    _, db = warehouse
    result = sql(db, SPEEDUPS, "--format", "csv")
    assert result.exit_code == 0, result.output
    lines = list(csv.reader(io.StringIO(result.stdout)))
    assert lines[0] == ["cell_id", "throughput_speedup", "acceptance_rate_per_position"]
    want = expected(db)
    assert len(lines) == 1 + len(want) == 9
    for (cell_id, speedup, per_position), (w_cell, w_speedup, w_positions) in zip(
        lines[1:], want, strict=True
    ):
        assert (cell_id, float(speedup), json.loads(per_position)) == (w_cell, w_speedup, w_positions)


def test_sql_json_is_an_array_of_objects(warehouse: tuple[RawBuilder, Path]) -> None:
    _, db = warehouse
    result = sql(db, SPEEDUPS, "--format", "json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert [tuple(d.values()) for d in data] == [tuple(r) for r in expected(db)]
    assert set(data[0]) == {"cell_id", "throughput_speedup", "acceptance_rate_per_position"}


def test_sql_parquet_needs_an_output_file(warehouse: tuple[RawBuilder, Path], tmp_path: Path) -> None:
    _, db = warehouse
    out = tmp_path / "speedups.parquet"
    result = sql(db, SPEEDUPS, "--format", "parquet", "--output", str(out))
    assert result.exit_code == 0, result.output
    assert "wrote 8 rows" in result.stderr
    assert pl.read_parquet(out).rows() == expected(db)

    missing = sql(db, SPEEDUPS, "--format", "parquet")
    assert missing.exit_code == 2
    assert "give --output FILE" in missing.stderr and "Traceback" not in missing.output


def test_sql_table_shows_rows_and_says_what_it_left_out(warehouse: tuple[RawBuilder, Path]) -> None:
    _, db = warehouse
    result = sql(db, "SELECT cell_id, variant FROM v_speedup ORDER BY cell_id", "--max-rows", "3")
    assert result.exit_code == 0, result.output
    first_three = [r[0] for r in expected(db)[:3]]
    assert all(cell in result.stdout for cell in first_three)
    assert expected(db)[3][0] not in result.stdout
    assert "cell_id" in result.stdout and "VARCHAR" in result.stdout
    assert "8 rows (5 not shown" in result.stderr


def test_sql_errors_are_one_clear_line(warehouse: tuple[RawBuilder, Path], tmp_path: Path) -> None:
    _, db = warehouse
    bad = sql(db, "SELEC * FROM v_cells")
    assert bad.exit_code == 1
    assert "SQL error" in bad.stderr and "syntax error" in bad.stderr
    assert "Traceback" not in bad.output

    unknown = sql(db, "SELECT * FROM v_nothing")
    assert unknown.exit_code == 1 and "v_nothing" in unknown.stderr

    write = sql(db, "DELETE FROM cells")
    assert write.exit_code == 1 and "read-only" in write.stderr
    assert sql(db, "SELECT count(*) FROM cells", "-f", "csv").stdout.splitlines() == ["count_star()", "12"]

    missing = sql(tmp_path / "nothing.duckdb", "SELECT 1")
    assert missing.exit_code == 2
    assert "no warehouse at" in missing.stderr and "specgauge ingest" in missing.stderr
    assert "Traceback" not in missing.output


def test_default_raw_dir_and_warehouse_come_from_settings(
    warehouse: tuple[RawBuilder, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    raw, _ = warehouse
    monkeypatch.setenv("SPECGAUGE_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("SPECGAUGE_WAREHOUSE", raising=False)
    get_settings.cache_clear()
    try:
        shutil.copytree(raw.raw_dir, tmp_path / "home" / "raw")
        assert runner.invoke(app, ["ingest"]).exit_code == 0
        assert (tmp_path / "home" / "warehouse.duckdb").exists()
        result = runner.invoke(app, ["sql", "SELECT count(*) AS n FROM v_speedup", "-f", "csv"])
        assert result.stdout.splitlines() == ["n", "8"]
    finally:
        get_settings.cache_clear()


def test_ingest_exit_codes(tmp_path: Path) -> None:
    raw = RawBuilder(tmp_path / "raw", spec=make_spec())
    raw.write_all(captures=False)
    slot = raw.slot("plain", 0)
    broken = raw.write_cell(slot, slot.cells[0])
    (broken / "gauges.parquet").write_bytes(b"not parquet")
    db = tmp_path / "w.duckdb"

    result = runner.invoke(app, ["ingest", str(raw.raw_dir), "--db", str(db)])

    assert result.exit_code == 1
    assert f"quarantined {raw.campaign_id}/cells/{broken.name}/gauges.parquet" in result.stderr
    nothing = runner.invoke(app, ["ingest", str(tmp_path / "no-such-dir"), "--db", str(db)])
    assert nothing.exit_code == 2 and "no raw artifacts at" in nothing.stderr


def test_info_and_rebuild(warehouse: tuple[RawBuilder, Path], tmp_path: Path) -> None:
    raw, original = warehouse
    db = tmp_path / "copy.duckdb"
    shutil.copy(original, db)

    info = runner.invoke(app, ["warehouse", "info", "--db", str(db)])
    assert info.exit_code == 0, info.output
    assert "schema version" in info.stdout and "0001_core" in info.stdout
    assert any(line.split()[:3] == ["│", "cells", "│"] and "12" in line for line in info.stdout.splitlines())

    before = expected(db)
    rebuilt = runner.invoke(app, ["warehouse", "rebuild", "--raw", str(raw.raw_dir), "--db", str(db)])
    assert rebuilt.exit_code == 0, rebuilt.output
    assert expected(db) == before


def test_sql_reaches_no_file_but_the_warehouse(warehouse: tuple[RawBuilder, Path], tmp_path: Path) -> None:
    _, db = warehouse
    outside = tmp_path / "outside.csv"
    outside.write_text("secret\nvalue\n")
    for query in (
        f"SELECT * FROM read_csv('{outside}')",
        "SELECT * FROM read_text('/etc/hostname')",
        f"COPY (SELECT 1 AS one) TO '{tmp_path / 'written.csv'}'",
        f"ATTACH '{tmp_path / 'other.duckdb'}' AS other",
        "SET enable_external_access = true",
        "INSTALL httpfs",
    ):
        refused = sql(db, query)
        assert refused.exit_code == 1, (query, refused.output)
        assert "SQL error" in refused.stderr and "Traceback" not in refused.output
    assert not (tmp_path / "written.csv").exists() and not (tmp_path / "other.duckdb").exists()
    assert "--allow-path" in sql(db, f"SELECT * FROM read_csv('{outside}')").stderr
    # the warehouse itself still answers, and --output files are written for the query
    assert sql(db, "SELECT count(*) FROM cells", "-f", "csv").stdout.splitlines() == ["count_star()", "12"]
    out = tmp_path / "cells.parquet"
    assert sql(db, "SELECT * FROM cells", "-f", "parquet", "-o", str(out)).exit_code == 0
    assert pl.read_parquet(out).height == 12


def test_sql_reads_the_parquet_rows_but_cannot_write_among_them(
    warehouse: tuple[RawBuilder, Path], tmp_path: Path
) -> None:
    raw, db = warehouse
    root = parts_dir(db)
    committed = sorted(root.rglob("*.parquet"))[0]
    before = committed.read_bytes()
    per_cell = raw.spec.load.requests + raw.spec.load.warmup
    # a query reads them through DuckDB itself (only queries: nothing that writes)
    counted = sql(db, "SELECT count(*) AS n FROM requests", "-f", "csv")
    assert counted.stdout.splitlines() == ["n", str(12 * per_cell)], counted.output
    # a statement that writes gets them through Arrow, and DuckDB never reaches their folder
    exports = tmp_path / "exports"
    exports.mkdir()
    wrote = sql(db, f"COPY (SELECT * FROM requests) TO '{exports / 'r.csv'}'", "--allow-path", str(exports))
    assert wrote.exit_code == 0, wrote.output
    assert len((exports / "r.csv").read_text().splitlines()) == 1 + 12 * per_cell
    for query in (
        f"COPY (SELECT 1 AS one) TO '{committed}' (FORMAT parquet)",
        f"SELECT 1; COPY (SELECT 1 AS one) TO '{root / 'extra.csv'}'",
        f"EXPORT DATABASE '{root / 'export'}'",
    ):
        refused = sql(db, query)
        assert refused.exit_code == 1 and "SQL error" in refused.stderr, (query, refused.output)
    into = sql(db, f"COPY (SELECT 1 AS one) TO '{committed}'", "--allow-path", str(committed.parent))
    assert into.exit_code == 2 and "not a place to write" in into.stderr
    assert committed.read_bytes() == before
    assert not (root / "extra.csv").exists() and not (root / "export").exists()


def test_sql_allow_path_lets_a_local_export_through(
    warehouse: tuple[RawBuilder, Path], tmp_path: Path
) -> None:
    _, db = warehouse
    exports = tmp_path / "exports"
    exports.mkdir()
    target = exports / "cells.csv"
    wrote = sql(db, f"COPY (SELECT cell_id FROM cells) TO '{target}'", "--allow-path", str(exports))
    assert wrote.exit_code == 0, wrote.output
    assert len(target.read_text().splitlines()) == 1 + 12
    back = sql(
        db, f"SELECT count(*) AS n FROM read_csv('{target}')", "--allow-path", str(target), "-f", "csv"
    )
    assert back.stdout.splitlines() == ["n", "12"]
    # a listed folder is not a way out of it
    escape = sql(
        db, f"SELECT * FROM read_text('{exports}/../../../etc/hostname')", "--allow-path", str(exports)
    )
    assert escape.exit_code == 1 and "--allow-path" in escape.stderr
