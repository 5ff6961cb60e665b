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

Its own commands cannot destroy it (issue 34): nothing is created beside a path that is not a warehouse
specgauge made (check_database: `--db /etc/passwd` is one error, a foreign DuckDB file is read in place);
`specgauge sql` writes no output onto the warehouse's files, parts or raw artifacts
(refuse_warehouse_place); a damaged file is named as such, and `replacing()` (rebuild) sets it aside and
builds a new one; a full disk rolls a write back whole (writer()); temporaries of killed processes are
removed by the next writer (remove_litter).
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
import shutil
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cached_property
from pathlib import Path

import duckdb
import psutil

from specgauge.errors import InputError
from specgauge.settings import get_settings
from warehouse import parts
from warehouse.errors import (
    MigrationError,
    NotAWarehouse,
    WarehouseBusy,
    WarehouseDamaged,
    WarehouseFull,
    WarehouseMissing,
)
from warehouse.lock import WRITER_LIMIT_NAME, WaitCallback, lock_path, log, writer_active, writer_lock

__all__ = [
    "MIGRATIONS_DIR",
    "VIEWS_FILE",
    "WRITER_LIMIT_NAME",
    "Migration",
    "applied_migrations",
    "apply_views",
    "available_migrations",
    "check_database",
    "connect",
    "default_path",
    "is_duckdb_file",
    "made_by_specgauge",
    "migrate",
    "pending_migrations",
    "reader",
    "reads_only",
    "refresh_snapshot",
    "refuse_warehouse_place",
    "remove_database",
    "remove_litter",
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
    An existing file DuckDB cannot open (not a database, corrupt) raises WarehouseDamaged.

    Prefer `writer()` and `reader()`: this bare call neither takes the writer lock nor migrates.
    """
    db_path = Path(path) if path is not None else default_path()
    if read_only and not db_path.exists():
        raise WarehouseMissing(f"no warehouse at {db_path}: run `specgauge ingest` first")
    if not read_only:
        db_path.parent.mkdir(parents=True, exist_ok=True)
    existed = db_path.exists()
    try:
        return duckdb.connect(str(db_path), read_only=read_only)
    except duckdb.Error as exc:
        if _LOCK_CONFLICT.search(str(exc)):
            raise WarehouseBusy(f"warehouse {db_path} is open in another process: {exc}") from None
        if existed and not disk_full(exc):
            raise damaged(db_path, f"DuckDB cannot open it: {_first_line(exc)}") from None
        raise


# ------------------------------------------------------------------------------ what is specgauge's to touch

_DUCKDB_MAGIC = b"DUCK"  # DuckDB's file header: an 8-byte checksum, then these 4 bytes
_DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})
# How DuckDB (IOException text), polars/arrow (Rust's io::Error) and Python say "the disk is full".
_DISK_FULL_TEXT = re.compile(
    r"No space left on device|Disk quota exceeded|File too large|os error (?:27|28|122)\b", re.IGNORECASE
)
_CORRUPT = re.compile(r"Corrupt database file|not a valid DuckDB database", re.IGNORECASE)
# Temporary names a writer or reader makes beside the warehouse, ending in the maker's pid: the snapshot's
# copy (.<db>.snapshot.tmp<pid>), its source note, the holder note (<db>.writer.json.tmp<pid>), a rebuild's
# new database (.<db>.rebuild<pid>, with its .wal and DuckDB's .tmp spill folder).
_LITTER = re.compile(r"\.(?:tmp|rebuild)(\d+)(?:\.wal|\.tmp)?$")


def is_duckdb_file(path: Path) -> bool:
    """Whether `path` is a file that starts with DuckDB's header. Read as plain bytes: opening it in DuckDB
    would take DuckDB's file lock, which makes a writer in another process fail at once."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(12)
    except OSError:
        return False
    return len(head) == 12 and head[8:12] == _DUCKDB_MAGIC


def made_by_specgauge(db_path: Path) -> bool:
    """Whether specgauge has written or read this warehouse before: its writers leave the lock file beside
    it (never deleted: waiters may hold it open), its readers the snapshot. Beside any other file specgauge
    creates nothing (check_database)."""
    return any(p.exists() for p in (lock_path(db_path), snapshot_path(db_path), _source_path(db_path)))


def damaged(db_path: Path, reason: str) -> WarehouseDamaged:
    """The one error for a damaged warehouse: what is wrong, and the command that repairs it."""
    db = "" if db_path.absolute() == default_path().absolute() else f" --db {db_path}"
    return WarehouseDamaged(
        f"the warehouse {db_path} is damaged ({reason}): `specgauge warehouse rebuild{db}` builds a new one "
        "from the raw artifacts and keeps the damaged file beside it",
        reason=reason,
    )


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else type(exc).__name__


def disk_full(exc: BaseException) -> bool:
    """Whether `exc` (an OSError, a DuckDB or polars error) says the disk or the file size limit is full."""
    if isinstance(exc, OSError) and exc.errno in _DISK_FULL_ERRNOS:
        return True
    return isinstance(exc, Exception) and bool(_DISK_FULL_TEXT.search(str(exc)))


def check_database(db_path: Path, *, writing: bool = False, repairing: bool = False) -> bool:
    """Before anything is created beside `db_path` (lock, snapshot): whether it is a warehouse specgauge
    may treat as its own. A missing path (for a writer: a new warehouse) and a DuckDB file specgauge made
    are; a non-DuckDB file raises NotAWarehouse, or, when it is a warehouse specgauge made that got
    overwritten, WarehouseDamaged (unless `repairing`: rebuild sets it aside). A DuckDB database specgauge
    never touched: False for a reader (which then opens it read-only, creating nothing beside it); for a
    writer, fine when it is empty or has specgauge's migrations table (a copied warehouse), else
    NotAWarehouse."""
    if not db_path.exists():
        if not writing:
            raise WarehouseMissing(f"no warehouse at {db_path}: run `specgauge ingest` first")
        return True
    if not db_path.is_file():
        raise NotAWarehouse(f"{db_path} is not a file: the warehouse is one DuckDB database file")
    ours = made_by_specgauge(db_path)
    if not is_duckdb_file(db_path):
        # A writer busy on it may be creating it this instant: judge it once that writer is done.
        if ours and (repairing or writer_active(db_path)):
            return True
        if ours:
            raise damaged(db_path, "it is not a DuckDB database file")
        raise NotAWarehouse(
            f"{db_path} is not a DuckDB database file; the warehouse is a DuckDB file specgauge made "
            "(SPECGAUGE_HOME/warehouse.duckdb by default)"
        )
    if ours:
        return True
    if not writing:
        return False
    # No lock file beside it: no specgauge writer holds it, so a look inside disturbs none.
    tables = _tables_of(db_path)
    if tables and "schema_migrations" not in tables:
        shown = ", ".join(sorted(tables)[:5]) + (", ..." if len(tables) > 5 else "")
        raise NotAWarehouse(
            f"{db_path} is a DuckDB database specgauge did not make (tables {shown}, no schema_migrations): "
            "specgauge writes only its own warehouse; give a new path to start one"
        )
    return True


def _tables_of(db_path: Path) -> set[str]:
    con = connect(db_path)  # read-write: a connection this process already holds may be read-write
    try:
        return {n for (n,) in con.execute("SELECT table_name FROM information_schema.tables").fetchall()}
    finally:
        con.close()


def refuse_warehouse_place(target: Path, db_path: Path, parts_root: Path | None = None, *, what: str) -> None:
    """Raise InputError when writing at `target` (a file, or a folder a query may write into) could
    overwrite the warehouse at `db_path`: its database, WAL, lock, holder note, snapshot and their
    temporaries (every name beside it that starts with its name), its Parquet parts, or the raw artifacts
    it is built from (what `warehouse rebuild` needs to repair it). Symlinks are resolved first."""
    real = Path(target).expanduser().resolve()
    db_given = Path(db_path).expanduser().absolute()
    db_real = db_given.resolve()
    for db in {db_given, db_real}:
        folder = db.parent.resolve()
        beside = real.parent == folder and (
            real.name == db.name or real.name.startswith((db.name + ".", "." + db.name))
        )
        if beside:
            raise InputError(f"{what} {target}: that is the warehouse {db} or one of its own files beside it")
        if real == folder or real in folder.parents:
            raise InputError(f"{what} {target}: that folder holds the warehouse {db}, not a place to write")
    trees = {
        "the warehouse's Parquet parts": [parts.parts_dir(db_given), parts.parts_dir(db_real), parts_root],
        "the raw artifacts the warehouse is built from": [get_settings().raw_dir],
    }
    for name, roots in trees.items():
        for root in roots:
            if root is None:
                continue
            tree = Path(root).expanduser().resolve()
            if real == tree or tree in real.parents or real in tree.parents:
                raise InputError(f"{what} {target}: that is inside {name} ({tree}), not a place to write")


def remove_litter(db_path: Path) -> list[Path]:
    """Delete the temporaries that a writer or reader killed mid-way left beside the warehouse (see
    _LITTER), when the process named in the name is gone; never a live process's. Callers hold the writer
    lock, under which every such file is made."""
    removed: list[Path] = []
    prefixes = (db_path.name + ".", "." + db_path.name + ".")
    try:
        entries = list(db_path.parent.iterdir())
    except OSError:
        return removed
    for entry in entries:
        found = _LITTER.search(entry.name) if entry.name.startswith(prefixes) else None
        if found is None:
            continue
        pid = int(found.group(1))
        if pid == os.getpid() or psutil.pid_exists(pid):
            continue
        try:
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
        except OSError as exc:
            log.warning("could not remove %s, left by process %d: %s", entry, pid, exc)
            continue
        removed.append(entry)
    return removed


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

# Paths this process is writing now (writer() re-enters for a nested writer of the same warehouse: the
# outermost one owns the checkpoints, the roll-back and the clean-up).
_WRITING: set[Path] = set()
# Room a write needs beyond the database's size to finish: its checkpoint grows the file by about what the
# WAL holds, and the readers' snapshot is a copy of the whole file.
_ROOM_MARGIN_BYTES = 1 << 20


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

    A write is all or nothing on a full disk: it begins by folding any earlier WAL into the file, keeps
    what it commits in the WAL (no automatic checkpoint), and ends with one checkpoint. When the disk (or
    the file size limit) fills up on the way, or would not hold the checkpoint and the readers' snapshot,
    the WAL is dropped, which leaves the file as it was before the write, and WarehouseFull says so.
    Nothing is created beside a file that is not specgauge's (check_database).
    """
    db_path = Path(path) if path is not None else default_path()
    check_database(db_path, writing=True)
    key = db_path.absolute()
    try:
        with writer_lock(db_path, timeout_s=timeout_s, on_wait=on_wait):
            if key in _WRITING:  # nested: the outer writer does the rest
                con = connect(db_path)
                try:
                    yield con
                finally:
                    _close_checkpointed(con)
                return
            _WRITING.add(key)
            try:
                with _whole_write(db_path, migrate_schema) as con:
                    yield con
            finally:
                _WRITING.discard(key)
    except OSError as exc:  # the lock's holder note on a full disk: before anything was written
        if disk_full(exc):
            raise WarehouseFull(
                f"warehouse {db_path}: the disk is full ({_first_line(exc)}); nothing was written"
            ) from None
        raise


@contextmanager
def _whole_write(db_path: Path, migrate_schema: bool) -> Iterator[duckdb.DuckDBPyConnection]:
    """writer()'s body, under the lock: see writer()."""
    remove_litter(db_path)
    if db_path.exists() and not is_duckdb_file(db_path):
        raise damaged(db_path, "it is not a DuckDB database file")
    con = connect(db_path)
    try:
        _tune_for_bulk_writes(con)
        _checkpoint(con)  # a killed writer's committed WAL goes into the file first
    except BaseException as exc:
        _close_without_checkpoint(con)  # its WAL is kept: it holds another writer's committed rows
        if disk_full(exc):
            raise WarehouseFull(
                f"warehouse {db_path}: the disk is full ({_first_line(exc)}); nothing was written"
            ) from None
        raise
    # All of this write is in the WAL until its final checkpoint (no automatic one on the way), so dropping
    # the WAL undoes all of it; unless the WAL held something before it began (a checkpoint that could not
    # run while another connection of this process was mid-transaction).
    can_roll_back = not _wal_has_data(db_path)
    snapshot_was_current = _snapshot_current(db_path)
    con.execute("SET checkpoint_threshold = '1TB'")
    try:
        try:
            if migrate_schema:
                migrate(con)
            if parts.set_root(con, parts.parts_dir(db_path)):
                parts.sweep(con)
        except (duckdb.CatalogException, duckdb.BinderException) as exc:
            raise damaged(db_path, f"its schema is broken: {_first_line(exc)}") from None
        yield con
        _check_room(db_path)
        _checkpoint(con)
    except BaseException as exc:
        if not disk_full(exc):
            _close_checkpointed(con)
            _refresh_snapshot_locked(db_path)
            if isinstance(exc, duckdb.CatalogException):
                raise damaged(db_path, f"its schema is broken: {_first_line(exc)}") from None
            if isinstance(exc, duckdb.Error) and _CORRUPT.search(str(exc)):
                raise damaged(db_path, f"it cannot be read: {_first_line(exc)}") from None
            raise
        _close_without_checkpoint(con)
        if not can_roll_back:
            raise WarehouseFull(f"warehouse {db_path}: the disk is full ({_first_line(exc)})") from None
        wal_path(db_path).unlink(missing_ok=True)
        if snapshot_was_current:  # the file holds what it held before: the snapshot still shows it
            _write_source(db_path)
        raise WarehouseFull(
            f"warehouse {db_path}: the disk is full ({_first_line(exc)}); the write was rolled back and the "
            "warehouse is as it was before it: free space and run the command again"
        ) from None
    _close_checkpointed(con)
    problem = _refresh_snapshot_locked(db_path)
    if problem is not None and disk_full(problem):
        raise WarehouseFull(
            f"warehouse {db_path}: the write is in the warehouse, but the disk is too full for the readers' "
            f"snapshot ({_first_line(problem)}): queries show the warehouse as before this write until space "
            "is freed and a specgauge command runs again"
        )


def _checkpoint(con: duckdb.DuckDBPyConnection) -> None:
    """CHECKPOINT, raising only when the disk is full (another connection of this process mid-transaction
    makes DuckDB refuse it: the last one to finish folds the WAL in)."""
    try:
        con.execute("CHECKPOINT")
    except duckdb.Error as exc:
        if disk_full(exc):
            raise
        log.info("checkpoint deferred: %s", _first_line(exc))


def _wal_has_data(db_path: Path) -> bool:
    try:
        return wal_path(db_path).stat().st_size > 0
    except FileNotFoundError:
        return False


def _check_room(db_path: Path) -> None:
    """Raise ENOSPC before the final checkpoint when the disk would not hold it and the snapshot copy."""
    size = db_path.stat().st_size
    wal = wal_path(db_path).stat().st_size if wal_path(db_path).exists() else 0
    needed = size + 2 * wal + _ROOM_MARGIN_BYTES
    free = shutil.disk_usage(db_path.parent).free
    if free < needed:
        raise OSError(
            errno.ENOSPC,
            f"No space left on device: {free / 1e6:.1f} MB free beside the warehouse, about "
            f"{needed / 1e6:.1f} MB needed for this write's checkpoint and the readers' snapshot",
        )


def _close_without_checkpoint(con: duckdb.DuckDBPyConnection) -> None:
    # DuckDB checkpoints on closing the last connection; after a failed write that would fold it in.
    with suppress(duckdb.Error):
        con.execute("PRAGMA disable_checkpoint_on_shutdown")
    with suppress(duckdb.Error):
        con.close()


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

    A live file that is damaged (not a DuckDB database, or one whose parts manifest cannot be read) is
    set aside as `<name>.damaged-<UTC time>` (with its WAL), kept for the user, when the new one is ready;
    `on_wait` says so.

    The new database writes new Parquet files under the same parts root; the old ones leave the manifest
    with the old file and are deleted by a later writer once no reader can still be reading them
    (warehouse.parts.sweep); a failed rebuild's files likewise."""
    db_path = Path(path) if path is not None else default_path()
    check_database(db_path, writing=True, repairing=True)
    say = on_wait or log.warning
    try:
        with writer_lock(db_path, timeout_s=timeout_s, on_wait=on_wait):
            remove_litter(db_path)
            tmp = db_path.with_name(f".{db_path.name}.rebuild{os.getpid()}")
            remove_database(tmp)
            root = parts.parts_dir(db_path)
            old_files, damage = _manifest_names(db_path)
            try:
                con = connect(tmp)
                _tune_for_bulk_writes(con)
                try:
                    migrate(con)
                    parts.set_root(con, root)
                    yield con
                    new_files = {n for (n,) in con.execute(f"SELECT file FROM {parts.MANIFEST}").fetchall()}
                    _check_room(tmp)
                finally:
                    _close_checkpointed(con)
                if damage is not None:
                    kept = _set_aside(db_path)
                    say(f"the warehouse {db_path} was damaged ({damage}): kept as {kept}; rebuilt from raw")
                # The old WAL belongs to the old file: it must not be replayed onto the new one.
                wal_path(db_path).unlink(missing_ok=True)
                os.replace(tmp, db_path)
                parts.retire(root, old_files - new_files)
            finally:
                remove_database(tmp)
            _refresh_snapshot_locked(db_path)
    except Exception as exc:
        if disk_full(exc):
            raise WarehouseFull(
                f"warehouse {db_path}: the disk is full ({_first_line(exc)}); the rebuild was abandoned and "
                "the warehouse is as it was before it"
            ) from None
        raise


def _set_aside(db_path: Path) -> Path:
    """Move a damaged warehouse file (and its WAL) out of the way, under a name that says what it is."""
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    kept = db_path.with_name(f"{db_path.name}.damaged-{stamp}")
    n = 1
    while kept.exists():
        n += 1
        kept = db_path.with_name(f"{db_path.name}.damaged-{stamp}-{n}")
    os.replace(db_path, kept)
    if wal_path(db_path).exists():
        os.replace(wal_path(db_path), wal_path(kept))
    return kept


def _manifest_names(db_path: Path) -> tuple[set[str], str | None]:
    """The Parquet files the live database lists (caller holds the writer lock), and what is wrong with the
    database when it cannot be read (None when it can, or does not exist)."""
    if not db_path.exists():
        return set(), None
    if not is_duckdb_file(db_path):
        return set(), "it is not a DuckDB database file"
    try:
        con = connect(db_path)
    except WarehouseDamaged as exc:
        return set(), exc.reason
    try:
        if parts.root_of(con) is None:
            return set(), None
        return {n for (n,) in con.execute(f"SELECT file FROM {parts.MANIFEST}").fetchall()}, None
    except duckdb.Error as exc:
        if disk_full(exc):
            raise
        return set(), f"it cannot be read: {_first_line(exc)}"
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
    with suppress(duckdb.Error):
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


def _refresh_snapshot_locked(db_path: Path) -> BaseException | None:
    # The snapshot is a cache for readers: failing to refresh it must not fail the write that just
    # committed (readers find it stale and refresh it themselves). Returns the failure, if any.
    try:
        if not _snapshot_current(db_path):  # a write that changed nothing leaves the file as it was
            _copy_snapshot(db_path)
    except (OSError, duckdb.Error, WarehouseDamaged) as exc:
        log.warning("could not refresh the warehouse snapshot of %s: %s", db_path, exc)
        return exc
    return None


def _copy_snapshot(db_path: Path) -> None:
    """Copy the (closed, checkpointed) live file to the snapshot; caller holds the writer lock. A file
    that is not a DuckDB database never replaces a snapshot (readers keep the last good one)."""
    remove_litter(db_path)
    if not is_duckdb_file(db_path):
        raise damaged(db_path, "it is not a DuckDB database file")
    if wal_path(db_path).exists():  # a writer died before its checkpoint: replay the WAL first
        _close_checkpointed(connect(db_path))
    snap = snapshot_path(db_path)
    tmp = snap.with_name(f".{snap.name}.tmp{os.getpid()}")
    signature = _signature(db_path)
    try:
        shutil.copyfile(db_path, tmp)
        _check_opens(db_path, tmp)
        os.replace(tmp, snap)
    finally:
        tmp.unlink(missing_ok=True)  # a copy that failed half-way (a full disk) leaves nothing
    _write_source(db_path, signature)


def _check_opens(db_path: Path, copy: Path) -> None:
    """A copy DuckDB cannot open (a corrupt live file) never replaces the readers' last good snapshot."""
    try:
        duckdb.connect(str(copy), read_only=True).close()
    except duckdb.Error as exc:
        if disk_full(exc):
            raise
        raise damaged(db_path, f"DuckDB cannot open it: {_first_line(exc)}") from None


def _write_source(db_path: Path, signature: str | None = None) -> None:
    """Record which state of the live file the snapshot copies: how readers tell it is current."""
    source = _source_path(db_path)
    source_tmp = source.with_name(f".{source.name}.tmp{os.getpid()}")
    try:
        source_tmp.write_text(signature or _signature(db_path))
        os.replace(source_tmp, source)
    finally:
        source_tmp.unlink(missing_ok=True)


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
    no snapshot at all and a writer busy, wait for it (saying so through `on_wait`). When the snapshot
    cannot be refreshed (a full disk), the last one is read and `on_wait` says so.

    A path that is not specgauge's (check_database) gets nothing beside it: a DuckDB database specgauge
    never wrote is opened read-only in place; anything else raises one clear error.
    """
    db_path = Path(path) if path is not None else default_path()
    if not check_database(db_path):
        con = _open_in_place(db_path)
        if con is not None:
            try:
                yield con
            finally:
                con.close()
            return
    snap = snapshot_path(db_path)
    try:
        if not refresh_snapshot(db_path) and not snap.exists():
            refresh_snapshot(db_path, wait=True, on_wait=on_wait)
    except OSError as exc:
        if not snap.exists():
            raise WarehouseFull(
                f"warehouse {db_path}: could not make the readers' snapshot ({_first_line(exc)})"
            ) from None
        (on_wait or log.warning)(
            f"could not refresh the warehouse snapshot ({_first_line(exc)}): reading it as of the last "
            "refresh"
        )
    con = None
    for _ in range(50):  # the snapshot is replaced by rename; an open in that instant may miss it
        try:
            con = duckdb.connect(str(snap), read_only=True)
            break
        except duckdb.IOException as exc:
            if _CORRUPT.search(str(exc)):
                raise damaged(db_path, f"its snapshot cannot be read: {_first_line(exc)}") from None
            time.sleep(0.05)
        except duckdb.Error as exc:
            raise damaged(db_path, f"its snapshot cannot be read: {_first_line(exc)}") from None
    if con is None:
        raise WarehouseBusy(f"could not open the warehouse snapshot {snap}")
    try:
        yield con
    finally:
        con.close()


def _open_in_place(db_path: Path) -> duckdb.DuckDBPyConnection | None:
    """A DuckDB database specgauge never wrote, opened read-only where it is (no snapshot, no lock). None
    when this process holds it open read-write already (then it is one this process is making)."""
    try:
        return duckdb.connect(str(db_path), read_only=True)
    except duckdb.ConnectionException:
        return None
    except duckdb.Error as exc:
        if _LOCK_CONFLICT.search(str(exc)):
            raise WarehouseBusy(f"{db_path} is open in another process: {_first_line(exc)}") from None
        raise NotAWarehouse(f"{db_path}: DuckDB cannot open it ({_first_line(exc)})") from None


def restrict_file_access(
    con: duckdb.DuckDBPyConnection,
    allow: Iterable[Path | str] = (),
    *,
    reads_only: bool = False,
    db_path: Path | None = None,
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
    statement can overwrite a committed file. `allow` may not reach into the parts folder, nor (given
    `db_path`, the live warehouse) the warehouse's own files or the raw artifacts (refuse_warehouse_place).
    """
    root = parts.root_of(con)
    folders: list[str] = []
    files: list[str] = []
    for entry in allow:
        path = Path(entry).expanduser().resolve()
        if root is not None and (path == root or root in path.parents or path in root.parents):
            raise InputError(f"{entry}: the warehouse's Parquet files ({root}) are not a place to write")
        if db_path is not None:
            refuse_warehouse_place(Path(entry), db_path, root, what="--allow-path")
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
