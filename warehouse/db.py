"""The DuckDB warehouse file: connections, numbered migrations, the writer, and readers that never block it.

Writers: `with writer(path) as con:` takes the writer lock (warehouse.lock), opens the file read-write,
applies pending migrations, records the parts root (warehouse.parts: request rows live in Parquet files
beside the database, not in it), yields, closes (checkpointing the WAL into the file) and then refreshes the
read snapshot, all while still holding the lock.

Readers: DuckDB's file lock is per process, and a read-only process on the file makes a writer in another
process fail at once. So readers never open the live file: `with reader(path) as con:` opens
`<db>.snapshot`, a copy the last writer made under the writer lock (copy to a temporary name, then an atomic
rename, so a reader that has the old snapshot open keeps reading it). A reader sees the warehouse as of the
last finished write; a write in progress is invisible until it ends. The snapshot holds the small tables
only (the request rows are immutable Parquet files both read), so the copy costs megabytes, not the
warehouse's size. See docs/warehouse.md for measurements.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import duckdb

from specgauge.errors import InputError
from specgauge.settings import get_settings
from warehouse import parts
from warehouse.errors import MigrationError, WarehouseBusy, WarehouseMissing
from warehouse.lock import WRITER_LIMIT_NAME, WaitCallback, log, writer_lock

__all__ = [
    "MIGRATIONS_DIR",
    "VIEWS_FILE",
    "WRITER_LIMIT_NAME",
    "Migration",
    "applied_migrations",
    "apply_views",
    "available_migrations",
    "connect",
    "default_path",
    "migrate",
    "pending_migrations",
    "reader",
    "reads_only",
    "refresh_snapshot",
    "remove_database",
    "replacing",
    "schema_version",
    "snapshot_path",
    "writer",
]

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"
VIEWS_FILE = Path(__file__).resolve().parent / "views.sql"
_MIGRATION_NAME = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")
_LOCK_CONFLICT = re.compile(r"could not set lock|conflicting lock", re.IGNORECASE)


def default_path() -> Path:
    """The project's warehouse: SPECGAUGE_WAREHOUSE, else SPECGAUGE_HOME/warehouse.duckdb."""
    return get_settings().warehouse_path


def snapshot_path(db_path: Path) -> Path:
    return db_path.with_name(db_path.name + ".snapshot")


def wal_path(db_path: Path) -> Path:
    return db_path.with_name(db_path.name + ".wal")


def connect(path: Path | str | None = None, *, read_only: bool = False) -> duckdb.DuckDBPyConnection:
    """Open the warehouse file. Read-only needs an existing file; read-write creates it (and its folder).

    Prefer `writer()` and `reader()`: this bare call neither takes the writer lock nor migrates.
    """
    db_path = Path(path) if path is not None else default_path()
    if read_only and not db_path.exists():
        raise WarehouseMissing(f"no warehouse at {db_path}: run `specgauge ingest` first")
    if not read_only:
        db_path.parent.mkdir(parents=True, exist_ok=True)
    try:
        return duckdb.connect(str(db_path), read_only=read_only)
    except duckdb.IOException as exc:
        if _LOCK_CONFLICT.search(str(exc)):
            raise WarehouseBusy(f"warehouse {db_path} is open in another process: {exc}") from None
        raise


# ---------------------------------------------------------------------------------------------- migrations


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    path: Path

    @cached_property
    def sql(self) -> str:
        return self.path.read_text(encoding="utf-8")

    @cached_property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()

    @property
    def label(self) -> str:
        return f"{self.version:04d}_{self.name}"


def available_migrations(directory: Path = MIGRATIONS_DIR) -> list[Migration]:
    """Every `NNNN_name.sql` in the folder, in order. Other .sql names and duplicate numbers are errors."""
    found: dict[int, Migration] = {}
    for path in sorted(Path(directory).glob("*.sql")):
        match = _MIGRATION_NAME.match(path.name)
        if not match:
            raise MigrationError(f"{path}: migration files are named NNNN_lowercase_name.sql")
        version = int(match.group(1))
        if version in found:
            raise MigrationError(
                f"{path}: migration number {version:04d} is also used by {found[version].path}"
            )
        found[version] = Migration(version, match.group(2), path)
    return [found[v] for v in sorted(found)]


def _ensure_migrations_table(con: duckdb.DuckDBPyConnection) -> None:
    con.execute(
        """CREATE TABLE IF NOT EXISTS schema_migrations (
               version INTEGER PRIMARY KEY,
               name VARCHAR NOT NULL,
               checksum VARCHAR NOT NULL,
               applied_utc TIMESTAMP NOT NULL DEFAULT (now()::TIMESTAMP)
           )"""
    )


def applied_migrations(con: duckdb.DuckDBPyConnection) -> dict[int, tuple[str, str]]:
    """version -> (name, checksum) of what this database has applied (empty for a new file)."""
    exists = con.execute(
        "SELECT count(*) FROM information_schema.tables WHERE table_name = 'schema_migrations'"
    ).fetchone()
    if not exists or not exists[0]:
        return {}
    rows = con.execute("SELECT version, name, checksum FROM schema_migrations ORDER BY version").fetchall()
    return {int(v): (n, c) for v, n, c in rows}


def schema_version(con: duckdb.DuckDBPyConnection) -> int:
    applied = applied_migrations(con)
    return max(applied) if applied else 0


def pending_migrations(con: duckdb.DuckDBPyConnection, directory: Path = MIGRATIONS_DIR) -> list[Migration]:
    applied = applied_migrations(con)
    available = available_migrations(directory)
    known = {m.version: m for m in available}
    for version, (name, checksum) in applied.items():
        if version not in known:
            raise MigrationError(
                f"the warehouse has migration {version:04d}_{name}, which this code does not know: "
                "it was written by a newer specgauge"
            )
        if known[version].checksum != checksum:
            raise MigrationError(
                f"{known[version].path} changed after it was applied to this warehouse (migrations are "
                "append-only: add a new numbered file); `specgauge warehouse rebuild` recreates the database"
            )
    return [m for m in available if m.version not in applied]


def migrate(
    con: duckdb.DuckDBPyConnection, *, directory: Path = MIGRATIONS_DIR, target: int | None = None
) -> list[Migration]:
    """Apply pending migrations in order (up to `target`, default all), each in its own transaction, and
    record each in schema_migrations; then, at the project's head, the current views (apply_views). Returns
    the migrations applied."""
    _ensure_migrations_table(con)
    done: list[Migration] = []
    for migration in pending_migrations(con, directory):
        if target is not None and migration.version > target:
            break
        con.execute("BEGIN TRANSACTION")
        try:
            con.execute(migration.sql)
            con.execute(
                "INSERT INTO schema_migrations (version, name, checksum) VALUES (?, ?, ?)",
                [migration.version, migration.name, migration.checksum],
            )
            con.execute("COMMIT")
        except duckdb.Error as exc:
            con.execute("ROLLBACK")
            raise MigrationError(f"{migration.path}: {exc}") from None
        done.append(migration)
    if Path(directory) == MIGRATIONS_DIR and not pending_migrations(con, directory):
        apply_views(con)
    return done


def apply_views(con: duckdb.DuckDBPyConnection, path: Path = VIEWS_FILE) -> bool:
    """(Re)create the views of `path` when it differs from what this database last applied (its checksum
    is kept in schema_views), in one transaction. Views are derived from the tables: replacing them loses
    nothing, and a new column reaches a view by one line in views.sql. True when they were (re)created."""
    sql = Path(path).read_text(encoding="utf-8")
    checksum = hashlib.sha256(sql.encode()).hexdigest()
    con.execute("CREATE TABLE IF NOT EXISTS schema_views (checksum VARCHAR NOT NULL, applied_utc TIMESTAMP)")
    if con.execute("SELECT count(*) FROM schema_views WHERE checksum = ?", [checksum]).fetchone() == (1,):
        return False
    con.execute("BEGIN TRANSACTION")
    try:
        con.execute(sql)
        con.execute("DELETE FROM schema_views")
        con.execute("INSERT INTO schema_views VALUES (?, now()::TIMESTAMP)", [checksum])
        con.execute("COMMIT")
    except duckdb.Error as exc:
        con.execute("ROLLBACK")
        raise MigrationError(f"{path}: {exc}") from None
    return True


# ------------------------------------------------------------------------------------------ writer, reader


@contextmanager
def writer(
    path: Path | str | None = None,
    *,
    timeout_s: float | None = None,
    on_wait: WaitCallback | None = None,
    migrate_schema: bool = True,
) -> Iterator[duckdb.DuckDBPyConnection]:
    """The one way to write: lock, open, migrate, yield; then close and refresh the reader snapshot.

    A second writer (another process, or a Prefect task) waits for the first and says so through
    `on_wait`; after `timeout_s` (None: no limit) it raises WarehouseBusy.
    """
    db_path = Path(path) if path is not None else default_path()
    with writer_lock(db_path, timeout_s=timeout_s, on_wait=on_wait):
        con = connect(db_path)
        _tune_for_bulk_writes(con)
        try:
            if migrate_schema:
                migrate(con)
            if parts.set_root(con, parts.parts_dir(db_path)):
                parts.sweep(con)
            yield con
        finally:
            _close_checkpointed(con)
            _refresh_snapshot_locked(db_path)


@contextmanager
def replacing(
    path: Path | str | None = None,
    *,
    timeout_s: float | None = None,
    on_wait: WaitCallback | None = None,
) -> Iterator[duckdb.DuckDBPyConnection]:
    """Build a new warehouse in a temporary file beside the live one and, when the block succeeds, swap it
    in atomically (rename). The writer lock is held throughout, so no write lands in the old file meanwhile;
    readers keep reading the old snapshot until the new one replaces it. On failure the live file is kept.

    The new database writes new Parquet files under the same parts root; the old ones leave the manifest
    with the old file and are deleted by a later writer once no reader can still be reading them
    (warehouse.parts.sweep); a failed rebuild's files likewise."""
    db_path = Path(path) if path is not None else default_path()
    with writer_lock(db_path, timeout_s=timeout_s, on_wait=on_wait):
        tmp = db_path.with_name(f".{db_path.name}.rebuild{os.getpid()}")
        remove_database(tmp)
        root = parts.parts_dir(db_path)
        old_files = _manifest_names(db_path)
        try:
            con = connect(tmp)
            _tune_for_bulk_writes(con)
            try:
                migrate(con)
                parts.set_root(con, root)
                yield con
                new_files = {n for (n,) in con.execute(f"SELECT file FROM {parts.MANIFEST}").fetchall()}
            finally:
                _close_checkpointed(con)
            # The old WAL belongs to the old file: it must not be replayed onto the new one.
            wal_path(db_path).unlink(missing_ok=True)
            os.replace(tmp, db_path)
            parts.retire(root, old_files - new_files)
        finally:
            remove_database(tmp)
        _refresh_snapshot_locked(db_path)


def _manifest_names(db_path: Path) -> set[str]:
    """The Parquet files the live database lists (caller holds the writer lock)."""
    if not db_path.exists():
        return set()
    con = connect(db_path)
    try:
        if parts.root_of(con) is None:
            return set()
        return {n for (n,) in con.execute(f"SELECT file FROM {parts.MANIFEST}").fetchall()}
    finally:
        _close_checkpointed(con)


def _tune_for_bulk_writes(con: duckdb.DuckDBPyConnection) -> None:
    # Rows need no particular physical order (every query orders what it shows); letting DuckDB write
    # row groups in any order cut the CPU of a 200,000-row INSERT + COMMIT by about a third.
    con.execute("SET preserve_insertion_order = false")
    # A checkpoint's vacuum merges the row groups that batched INSERTs leave part-filled, decompressing
    # and compressing them again: over a second for a million requests (and a file half again as large,
    # the old blocks staying allocated). Part-filled row groups cost queries nothing measurable.
    con.execute("SET max_vacuum_tasks = 0")


def _close_checkpointed(con: duckdb.DuckDBPyConnection) -> None:
    # Fold the WAL into the file now, so the snapshot copy is the whole database.
    with suppress(duckdb.Error):
        con.execute("CHECKPOINT")
    con.close()


def _source_path(db_path: Path) -> Path:
    return db_path.with_name(db_path.name + ".snapshot.source")


def _signature(db_path: Path) -> str:
    # ctime moves on every write to the file, even one that keeps its size and lands in the same mtime tick
    st = db_path.stat()
    return f"{st.st_ino} {st.st_size} {st.st_mtime_ns} {st.st_ctime_ns}"


def _snapshot_current(db_path: Path) -> bool:
    """The snapshot is a copy of the live file as it is now (and the live file has no pending WAL)."""
    try:
        return (
            snapshot_path(db_path).exists()
            and not wal_path(db_path).exists()
            and _source_path(db_path).read_text() == _signature(db_path)
        )
    except FileNotFoundError:
        return False


def _refresh_snapshot_locked(db_path: Path) -> None:
    # The snapshot is a cache for readers: failing to refresh it must not fail the write that just
    # committed (readers find it stale and refresh it themselves).
    try:
        if not _snapshot_current(db_path):  # a write that changed nothing leaves the file as it was
            _copy_snapshot(db_path)
    except (OSError, duckdb.Error) as exc:
        log.warning("could not refresh the warehouse snapshot of %s: %s", db_path, exc)


def _copy_snapshot(db_path: Path) -> None:
    """Copy the (closed, checkpointed) live file to the snapshot; caller holds the writer lock."""
    if wal_path(db_path).exists():  # a writer died before its checkpoint: replay the WAL first
        _close_checkpointed(connect(db_path))
    snap = snapshot_path(db_path)
    tmp = snap.with_name(f".{snap.name}.tmp{os.getpid()}")
    signature = _signature(db_path)
    shutil.copyfile(db_path, tmp)
    os.replace(tmp, snap)
    source = _source_path(db_path)
    source_tmp = source.with_name(f".{source.name}.tmp{os.getpid()}")
    source_tmp.write_text(signature)
    os.replace(source_tmp, source)  # how readers tell the snapshot is current


def refresh_snapshot(
    path: Path | str | None = None, *, wait: bool = False, on_wait: WaitCallback | None = None
) -> bool:
    """Bring the snapshot up to date with the live file if it is stale. Without `wait`, skip (return False)
    when a writer holds the lock: it refreshes the snapshot itself when it finishes."""
    db_path = Path(path) if path is not None else default_path()
    if _snapshot_current(db_path):
        return True
    if not db_path.exists():
        raise WarehouseMissing(f"no warehouse at {db_path}: run `specgauge ingest` first")
    try:
        with writer_lock(db_path, timeout_s=None if wait else 0.0, on_wait=on_wait or (lambda _m: None)):
            if not _snapshot_current(db_path):
                _copy_snapshot(db_path)
        return True
    except WarehouseBusy:
        return False


@contextmanager
def reader(
    path: Path | str | None = None, *, on_wait: WaitCallback | None = None
) -> Iterator[duckdb.DuckDBPyConnection]:
    """A read-only connection to the latest snapshot; never holds the live file, so never blocks a writer.

    A stale snapshot (the live file changed outside `writer()`) is refreshed when no writer is busy. With
    no snapshot at all and a writer busy, wait for it (saying so through `on_wait`).
    """
    db_path = Path(path) if path is not None else default_path()
    if not db_path.exists():
        raise WarehouseMissing(f"no warehouse at {db_path}: run `specgauge ingest` first")
    snap = snapshot_path(db_path)
    if not refresh_snapshot(db_path) and not snap.exists():
        refresh_snapshot(db_path, wait=True, on_wait=on_wait)
    con = None
    for _ in range(50):  # the snapshot is replaced by rename; an open in that instant may miss it
        try:
            con = duckdb.connect(str(snap), read_only=True)
            break
        except duckdb.IOException:
            time.sleep(0.05)
    if con is None:
        raise WarehouseBusy(f"could not open the warehouse snapshot {snap}")
    try:
        yield con
    finally:
        con.close()


def restrict_file_access(
    con: duckdb.DuckDBPyConnection, allow: Iterable[Path | str] = (), *, reads_only: bool = False
) -> None:
    """Let SQL on `con` reach no file but the database it opened, and the files and folders in `allow`.

    For SQL run on someone else's behalf (`specgauge sql`): without this, a read-only connection still
    reads any file the user can (`read_csv('/etc/passwd')`), writes anywhere (`COPY ... TO`), attaches other
    databases and installs extensions. DuckDB checks every file system operation against
    `enable_external_access` and the listed paths; `lock_configuration` keeps the query from undoing it.
    Spilling to the database's own temp directory keeps working.

    The request rows (`requests`, `gauges`: Parquet files under the parts root, warehouse.parts) stay
    readable. DuckDB's allowed directories do not tell reading from writing, so DuckDB itself may read the
    parts folder only for SQL that `reads_only` (every statement a query: see `reads_only()`), which
    writes no file; for other SQL (a `COPY ... TO` an --allow-path folder, say) Arrow reads the files
    (warehouse.parts.register_datasets: slower) and the folder stays out of DuckDB's reach, so no
    statement can overwrite a committed file. `allow` may not reach into the parts folder.
    """
    root = parts.root_of(con)
    folders: list[str] = []
    files: list[str] = []
    for entry in allow:
        path = Path(entry).expanduser().resolve()
        if root is not None and (path == root or root in path.parents or path in root.parents):
            raise InputError(f"{entry}: the warehouse's Parquet files ({root}) are not a place to write")
        (folders if path.is_dir() else files).append(str(path))
    if reads_only and root is not None:
        folders.append(str(root))
    else:
        parts.register_datasets(con)
    con.execute("SET allowed_directories = ?", [folders])
    con.execute("SET allowed_paths = ?", [files])
    con.execute("SET enable_external_access = false")
    con.execute("SET lock_configuration = true")


def reads_only(sql: str) -> bool:
    """Whether every statement of `sql` is a query (SELECT, FROM, WITH, VALUES, DESCRIBE, SHOW, SUMMARIZE:
    DuckDB's SELECT statements), none of which writes a file (COPY, EXPORT, ATTACH, CALL, PRAGMA, SET and
    the rest are other kinds). By DuckDB's own parser; SQL it cannot parse is not."""
    try:
        return all(s.type == duckdb.StatementType.SELECT for s in duckdb.extract_statements(sql))
    except duckdb.Error:
        return False


def remove_database(db_path: Path) -> None:
    """Delete a warehouse file with its WAL and snapshot (not its lock file, which waiters may hold open)."""
    for p in (db_path, wal_path(db_path), snapshot_path(db_path), _source_path(db_path)):
        p.unlink(missing_ok=True)
