"""`specgauge ingest`, `specgauge warehouse rebuild|migrate|info` and `specgauge sql`: the warehouse CLI.

Thin shells over warehouse.ingest and warehouse.db. Expected failures (a missing database, a busy writer, a
broken migration) go to the CLI's one error boundary (cli/app.py): one line on stderr, exit 2; bad SQL
exits 1. Never a traceback.
"""

from __future__ import annotations

import os
import stat
import sys
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from cli.commands.warehouse_options import DbOption, LockTimeout, say_waiting
from cli.tables import ELISION

console = Console(soft_wrap=True)
err_console = Console(stderr=True, soft_wrap=True)


class OutputFormat(StrEnum):
    table = "table"
    csv = "csv"
    json = "json"
    parquet = "parquet"


def _fail(message: str, code: int) -> typer.Exit:
    """A failure that is not one of the project's errors (the boundary reports those): bad SQL."""
    err_console.print(f"error: {message}", highlight=False, markup=False, soft_wrap=True)
    return typer.Exit(code=code)


# ------------------------------------------------------------------------------------------------- ingest


def ingest(
    raw_dir: Annotated[
        Path | None,
        typer.Argument(
            help="Raw artifact folder: RAW (every campaign under it) or one RAW/<campaign_id>. "
            "Default: SPECGAUGE_HOME/raw.",
            file_okay=False,
        ),
    ] = None,
    db: DbOption = None,
    lock_timeout: LockTimeout = None,
) -> None:
    """Load raw artifacts (campaigns, deployments, cells, captures) into the warehouse.

    Idempotent: artifacts already ingested with the same content are skipped. An artifact that cannot be
    read or fails validation is quarantined (listed here and in the `quarantine` table) and the others
    still load. Exit code 0 when everything loaded or was already there, 1 when something was quarantined
    or an immutable artifact changed, 2 on other errors. A second writer waits for the first and says so.
    """
    from warehouse.ingest import ingest_raw

    report = ingest_raw(raw_dir, db, lock_timeout_s=lock_timeout, on_wait=say_waiting)
    _print_report(report)
    if not report.ok:
        raise typer.Exit(code=1)


def _print_report(report) -> None:
    table = Table(title=f"ingest {report.raw_dir} -> {report.db_path}", title_justify="left")
    actions = ("inserted", "updated", "skipped", "quarantined", "changed")
    table.add_column("artifact")
    for action in actions:
        table.add_column(action, justify="right")
    for kind, counts in report.counts().items():
        table.add_row(kind, *[str(counts.get(a, 0)) for a in actions])
    console.print(table)
    rows = ", ".join(f"{t} {n:,}" for t, n in sorted(report.rows_by_table.items()) if n)
    console.print(f"rows written: {rows or 'none'}; {report.seconds:.2f} s", highlight=False)
    for outcome in report.quarantined:
        err_console.print(f"[red]quarantined[/red] {outcome.message}", highlight=False, soft_wrap=True)
    for outcome in report.errors:
        err_console.print(f"[red]changed[/red] {outcome.message}", highlight=False, soft_wrap=True)


# ---------------------------------------------------------------------------------------------- warehouse

warehouse_app = typer.Typer(
    help="The DuckDB warehouse: rebuild it from raw artifacts, migrate its schema, show what it holds.",
    no_args_is_help=True,
)


@warehouse_app.command("rebuild")
def rebuild(
    raw_dir: Annotated[
        Path | None,
        typer.Option("--raw", help="Raw artifact folder (default: SPECGAUGE_HOME/raw).", file_okay=False),
    ] = None,
    db: DbOption = None,
    lock_timeout: LockTimeout = None,
) -> None:
    """Recreate the warehouse from raw artifacts (the source of truth).

    Builds a new database in a temporary file beside the old one, then swaps it in atomically; queries
    give the same results as before. Holds the writer lock throughout; readers keep working meanwhile.
    Repairs a damaged warehouse (not a DuckDB file, or unreadable): the damaged file is kept beside the
    new one as <name>.damaged-<UTC time>.
    """
    from warehouse.ingest import rebuild as rebuild_db

    report = rebuild_db(raw_dir, db, lock_timeout_s=lock_timeout, on_wait=say_waiting)
    _print_report(report)
    if not report.ok:
        raise typer.Exit(code=1)


@warehouse_app.command("migrate")
def migrate(db: DbOption = None, lock_timeout: LockTimeout = None) -> None:
    """Apply pending schema migrations (warehouse/migrations/NNNN_*.sql), each in its own transaction."""
    from warehouse.db import default_path, schema_version, writer
    from warehouse.db import migrate as apply
    from warehouse.parts import legacy_rows

    path = db or default_path()
    with writer(path, timeout_s=lock_timeout, on_wait=say_waiting, migrate_schema=False) as con:
        done = apply(con)
        version = schema_version(con)
        in_duckdb = legacy_rows(con)
    for migration in done:
        console.print(f"applied {migration.label}", highlight=False)
    console.print(
        f"{path}: schema version {version:04d}" + ("" if done else " (up to date)"), highlight=False
    )
    if in_duckdb:
        console.print(
            f"{in_duckdb:,} request and gauge rows ingested before migration 0010 are still inside the DuckDB "
            "file (copied by every write): `specgauge warehouse rebuild` moves them to Parquet files",
            highlight=False,
        )


@warehouse_app.command("info")
def info(db: DbOption = None) -> None:
    """Schema version, pending migrations, row counts per table and view, the snapshot readers use, and the
    Parquet files that hold the request rows."""
    from warehouse.db import (
        applied_migrations,
        available_migrations,
        default_path,
        reader,
        snapshot_path,
    )
    from warehouse.parts import root_of

    path = db or default_path()
    with reader(path, on_wait=say_waiting) as con:
        applied = applied_migrations(con)
        objects = con.execute(
            "SELECT table_name, table_type FROM information_schema.tables "
            "WHERE table_schema = 'main' ORDER BY table_type, table_name"
        ).fetchall()
        counts = {name: con.execute(f'SELECT count(*) FROM "{name}"').fetchone()[0] for name, _ in objects}
        root = root_of(con)
        files, size = (
            con.execute("SELECT count(*), coalesce(sum(bytes), 0) FROM warehouse_parts").fetchone()
            if root is not None
            else (0, 0)
        )
    pending = [m.label for m in available_migrations() if m.version not in applied]
    version = max(applied) if applied else 0
    console.print(f"warehouse {path}: {path.stat().st_size / 1e6:.1f} MB", highlight=False)
    console.print(
        f"schema version {version:04d} ({', '.join(f'{v:04d}_{n}' for v, (n, _) in sorted(applied.items()))})"
        + (f"; pending: {', '.join(pending)} (run `specgauge warehouse migrate`)" if pending else ""),
        highlight=False,
    )
    snap = snapshot_path(path)
    if snap.exists():
        console.print(f"reader snapshot {snap} (as of the last write)", highlight=False)
    if root is not None:
        console.print(
            f"request rows: {files:,} Parquet files, {size / 1e6:,.1f} MB under {root}", highlight=False
        )
    table = Table("name", "kind", "rows")
    for name, kind in objects:
        table.add_row(name, "view" if kind == "VIEW" else "table", f"{counts[name]:,}")
    console.print(table)


# ---------------------------------------------------------------------------------------------------- sql


def sql(
    query: Annotated[str, typer.Argument(help='SQL to run, e.g. "SELECT * FROM v_speedup".')],
    db: DbOption = None,
    output_format: Annotated[
        OutputFormat,
        typer.Option(
            "--format",
            "-f",
            help="table: a rich table on the terminal; csv: a header line, then rows; json: an array of "
            "objects; parquet: a file (needs --output).",
        ),
    ] = OutputFormat.table,
    output: Annotated[
        Path | None,
        typer.Option(
            "--output",
            "-o",
            help="Write the result to this file instead of stdout (parquet needs it).",
            dir_okay=False,
        ),
    ] = None,
    max_rows: Annotated[
        int, typer.Option("--max-rows", help="Rows shown by --format table (the rest are counted).", min=1)
    ] = 200,
    allow_path: Annotated[
        list[Path] | None,
        typer.Option(
            "--allow-path",
            help="A file or folder the query may read or write (COPY ... TO, read_csv, ATTACH); repeat for "
            "more. Without it a query reaches no file but the warehouse.",
        ),
    ] = None,
) -> None:
    """Query the warehouse read-only (tables, and views such as v_cells, v_speedup, v_acceptance, v_capacity).

    Reads the snapshot the last writer left, so a query never blocks a running ingest and sees the
    warehouse as of the last finished write (it waits only if no write has ever finished). The query
    reaches no other file (no read_csv of a system file, no COPY ... TO) unless --allow-path lets it;
    --output files are written for it: whole (to a temporary name beside, then renamed), and never onto
    the warehouse's own files, its Parquet parts or the raw artifacts.
    """
    import duckdb

    from specgauge.errors import InputError
    from warehouse.db import default_path, reader, reads_only, refuse_warehouse_place, restrict_file_access
    from warehouse.parts import root_of

    if output_format is OutputFormat.parquet and output is None:
        raise InputError("--format parquet writes a file: give --output FILE")
    db_path = db or default_path()
    if output is not None:
        _check_output(output, db_path)
    with reader(db_path, on_wait=say_waiting) as con:
        if output is not None:
            refuse_warehouse_place(output, db_path, root_of(con), what="--output")
        # parquet is written by DuckDB, to a temporary name beside the output (then renamed)
        staged = _staging(output) if output is not None and output_format is OutputFormat.parquet else None
        allowed = [*(allow_path or []), *([staged] if staged is not None else [])]
        restrict_file_access(con, allowed, reads_only=reads_only(query), db_path=db_path)
        try:
            relation = con.sql(query)
            if relation is None:
                err_console.print("(statement ran; it returns no rows)")
                return
            if output is not None and staged is not None:
                _write_parquet(con, relation, output, staged)
                return
            if output_format is OutputFormat.csv:
                relation = _nested_as_json(con, relation)
            types = [str(t) for t in relation.types]
            frame = relation.pl()
        except duckdb.Error as exc:
            hint = " (specgauge sql is read-only)" if "read-only" in str(exc) else ""
            if isinstance(exc, duckdb.PermissionException):
                hint = " (specgauge sql reaches no file but the warehouse: --allow-path PATH lets it)"
            raise _fail(f"SQL error: {exc}{hint}", code=1) from None
    if output_format is OutputFormat.table:
        _print_table(frame, types, max_rows)
    elif output_format is OutputFormat.csv:
        _emit(frame.write_csv(), output)
    else:
        _emit(frame.write_json() + "\n", output)


def _check_output(output: Path, db_path: Path) -> None:
    """--output before the query runs: its folder exists, and it is none of the warehouse's own files."""
    from specgauge.errors import InputError
    from warehouse.db import refuse_warehouse_place

    folder = output.expanduser().absolute().parent
    if not folder.is_dir():
        raise InputError(f"--output {output}: the folder {folder} does not exist")
    refuse_warehouse_place(output, db_path, what="--output")


def _in_place(output: Path) -> bool:
    """An existing output that is a symlink or not a regular file (/dev/stdout, /dev/null, a FIFO) is
    written where it is: a rename would replace the link, device or pipe with a file. (A link into the
    warehouse's files was refused before: refuse_warehouse_place resolves links.)"""
    try:
        mode = output.lstat().st_mode
    except FileNotFoundError:
        return False
    return not stat.S_ISREG(mode)


def _staging(output: Path) -> Path:
    output = output.expanduser()
    if _in_place(output):
        return output
    return output.with_name(f".{output.name}.tmp{os.getpid()}")


def _output_error(output: Path, exc: BaseException) -> Exception:
    from specgauge.errors import InputError

    reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc).strip().splitlines()[0]
    return InputError(f"--output {output}: could not write it: {reason}")


def _write_parquet(con, relation, output: Path, staged: Path) -> None:
    import duckdb

    try:
        relation.write_parquet(str(staged))
        written = None
        if staged != output.expanduser():
            written = con.execute("SELECT count(*) FROM read_parquet(?)", [str(staged)]).fetchone()[0]
            os.replace(staged, output.expanduser())
    except (OSError, duckdb.IOException) as exc:
        raise _output_error(output, exc) from None
    finally:
        if staged != output.expanduser():
            staged.unlink(missing_ok=True)
    rows = "" if written is None else f"{written:,} rows "
    err_console.print(f"wrote {rows}to {output}", highlight=False)


def _nested_as_json(con, relation):
    """CSV cells cannot hold lists or structs: write those as JSON text."""
    nested = [
        name
        for name, dtype in zip(relation.columns, relation.types, strict=True)
        if any(mark in str(dtype) for mark in ("[]", "STRUCT", "MAP", "UNION")) or str(dtype).endswith("]")
    ]
    if not nested:
        return relation
    replaced = ", ".join(f'to_json("{c}")::VARCHAR AS "{c}"' for c in nested)
    return relation.select(f"* REPLACE ({replaced})")


def _emit(text: str, output: Path | None) -> None:
    if output is None:
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    # A temporary name beside the output, then a rename: a failed write leaves no half file, and a
    # symlink or hard link at the output's name is replaced, not written through.
    staged = _staging(output)
    try:
        with open(staged, "w", encoding="utf-8") as fh:
            fh.write(text)
        if staged != output.expanduser():
            os.replace(staged, output.expanduser())
    except OSError as exc:
        raise _output_error(output, exc) from None
    finally:
        if staged != output.expanduser():
            staged.unlink(missing_ok=True)
    err_console.print(f"wrote {output}", highlight=False)


def _print_table(frame, types: list[str], max_rows: int) -> None:
    """The result as a table that fits the terminal (middle columns elided when it is too wide, as DuckDB's
    CLI does), or one block a row when not even its first and last columns fit; counts on stderr."""
    from cli.tables import ResultColumn, result_records, result_table

    shown = list(frame.head(max_rows).iter_rows())
    columns = [
        ResultColumn(name, dtype, [_cell(row[index]) for row in shown])
        for index, (name, dtype) in enumerate(zip(frame.columns, types, strict=True))
    ]
    table, hidden = result_table(columns, len(shown), console.width)
    for renderable in [table] if table is not None else result_records(columns, len(shown), console.width):
        console.print(renderable)
    more = frame.height - len(shown)
    tail = f" ({more:,} not shown: raise --max-rows or use --format csv)" if more else ""
    err_console.print(f"{frame.height:,} row{'s' if frame.height != 1 else ''}{tail}", highlight=False)
    if table is None:
        err_console.print(
            f"{len(columns)} columns, too wide for {console.width} characters side by side: one block a row",
            highlight=False,
        )
    elif hidden:
        err_console.print(
            f"{hidden} of {len(columns)} columns hidden ({ELISION}): select fewer, widen the terminal or use "
            "--format csv",
            highlight=False,
        )


def _cell(value: object) -> Text:
    if value is None:
        return Text("null", style="dim")
    return Text(f"{value:.6g}" if isinstance(value, float) else str(value))


def register(app: typer.Typer) -> None:
    app.command("ingest")(ingest)
    app.command("sql")(sql)
    app.add_typer(warehouse_app, name="warehouse")
