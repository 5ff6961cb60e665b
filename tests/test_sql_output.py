"""`specgauge sql`'s table on a terminal too narrow for the result: the middle columns elided as DuckDB's own
CLI does (the first and last columns whole, one "…" column between, a count of the hidden ones), or one block
a row when not even that fits; a result that fits is printed as it always was."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest
from rich.console import Console
from rich.table import Table
from typer.testing import CliRunner

import cli.commands.warehouse as warehouse_cli
from cli.app import app

runner = CliRunner()
WIDTH = 80
# 21 columns: an id, a campaign id, 18 figures, and a last text column
WIDE = (
    "SELECT range AS id, 'demo-2024-05-01-' || range AS campaign_id, "
    + ", ".join(f"range * {n}.5 AS figure_{n:02d}" for n in range(18))
    + ", 'the end' AS closing_note FROM range(3) ORDER BY id"
)


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("sql_output") / "w.duckdb"
    done = runner.invoke(app, ["warehouse", "migrate", "--db", str(path)])
    assert done.exit_code == 0, done.output
    return path


@pytest.fixture(autouse=True)
def terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    """An 80-column terminal, whatever the one running the tests is."""
    monkeypatch.setattr(warehouse_cli, "console", Console(soft_wrap=True, width=WIDTH))


def sql(db: Path, query: str, *args: str):
    result = runner.invoke(app, ["sql", query, "--db", str(db), *args])
    assert result.exit_code == 0, result.output
    return result


def test_a_wide_result_keeps_its_first_and_last_columns_whole_and_counts_the_hidden(db: Path) -> None:
    result = sql(db, WIDE)
    lines = result.stdout.splitlines()
    assert lines and all(len(line) <= WIDTH for line in lines)
    header = lines[1]
    assert re.search(r"┃ id\s+┃ campaign_id\s+┃", header)  # the first columns, names whole
    assert header.rstrip().endswith("┃ closing_note ┃")  # the last one
    assert "┃ … ┃" in lines[2]  # one column stands for the hidden ones
    assert "BIGINT" in lines[2] and "VARCHAR" in lines[2]
    assert any("demo-2024-05-01-2" in line and "the end" in line for line in lines)  # values whole
    assert "figure_00" not in result.stdout
    hidden = re.search(r"(\d+) of 21 columns hidden", result.stderr)
    assert hidden is not None, result.stderr
    shown = lines[1].count("┃") - 1 - 1  # columns drawn, less the "…" one
    assert int(hidden.group(1)) == 21 - shown
    assert "3 rows" in result.stderr


def test_an_empty_wide_table_shows_its_first_columns(db: Path) -> None:
    result = sql(db, "SELECT * FROM tree_sim_validation")
    assert "campaign_id" in result.stdout and "columns hidden" in result.stderr
    assert "… ┃ …" not in result.stdout  # names are never cut to an ellipsis


def test_a_narrow_result_is_unchanged(db: Path) -> None:
    query = "SELECT 1 AS a, 'x' AS b, [1, 2] AS c, NULL AS d, 2.5::DOUBLE AS e"
    result = sql(db, query)
    expected = Table("a\n[dim]INTEGER[/dim]", "b\n[dim]VARCHAR[/dim]", "c\n[dim]INTEGER[][/dim]")
    for header in ('d\n[dim]"NULL"[/dim]', "e\n[dim]DOUBLE[/dim]"):
        expected.add_column(header)
    expected.add_row("1", "x", "[1, 2]", "[dim]null[/dim]", "2.5")
    out = io.StringIO()
    Console(file=out, width=WIDTH, soft_wrap=True).print(expected)
    assert result.stdout == out.getvalue()
    assert result.stderr == "1 row\n"


def test_one_long_value_is_wrapped_whole_not_cut(db: Path) -> None:
    result = sql(db, "SELECT repeat('x', 150) AS blob")
    assert "…" not in result.stdout
    assert result.stdout.count("x") == 150
    assert "hidden" not in result.stderr


def test_columns_that_cannot_stand_side_by_side_print_one_block_a_row(db: Path) -> None:
    first, last = (
        "a_column_with_a_name_much_too_long_to_share",
        "another_column_whose_name_is_as_long_as_that",
    )
    result = sql(db, f"SELECT range AS {first}, 'value ' || range AS {last} FROM range(2)")
    assert "row 1" in result.stdout and "row 2" in result.stdout
    assert "value 1" in result.stdout
    assert "one block a row" in result.stderr


def test_names_are_shown_as_written_not_read_as_markup(db: Path) -> None:
    result = sql(db, 'SELECT 1 AS "[/x]", 2 AS "[bold]b"')
    assert "[/x]" in result.stdout and "[bold]b" in result.stdout
