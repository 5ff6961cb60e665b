"""Request-level rows as immutable Parquet files beside the DuckDB file: a write costs what it writes.

The big per-request tables (`requests`, `gauges`: the tables an ArtifactKind lists in `parted`) are not
stored in DuckDB. Each ingest batch writes its rows of such a table as one Parquet file per campaign,

    <parts root>/<table>/<campaign_id>/<ingest_id>-<n>.parquet

(written to a dot-name, then renamed: never seen half-written), and records it in the manifest table
`warehouse_parts` inside the same DuckDB transaction as the batch's small rows (cells, ingest_log). The
table's name is a view over exactly the committed files (`read_parquet([...])`, with the rows of the
migration-0010 table `<table>_legacy` written before this design); the view is recreated in that same
transaction. So a file whose transaction rolled back, or whose writer was killed before it committed, is
in no manifest and no view: invisible, and removed later by `sweep`.

The DuckDB file keeps only the small tables, so the reader snapshot (warehouse.db) copies megabytes, not
the request rows; readers of a snapshot read the same immutable files, which no writer changes.

The root: `<db folder>/<db name>.parts`, or `SPECGAUGE_WAREHOUSE_PARTS/<db name>.parts` (a shared
filesystem, say); the writer records it in `warehouse_settings` so views and readers find it. See
docs/warehouse.md, "Request rows in Parquet".
"""

from __future__ import annotations

import hashlib
import os
import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import duckdb
import polars as pl
import pyarrow as pa
import pyarrow.dataset as pads

from specgauge.settings import get_settings

__all__ = [
    "PARTED_TABLES",
    "PartFile",
    "committed_files",
    "discard",
    "ensure_root",
    "legacy_rows",
    "legacy_table",
    "parts_dir",
    "record",
    "refresh_views",
    "register_datasets",
    "root_of",
    "set_root",
    "sweep",
    "write_part",
]

PARTED_TABLES = ("requests", "gauges")
"""Tables stored as Parquet files (each kind names its own in ArtifactKind.parted; these are all of them)."""
MANIFEST = "warehouse_parts"
SETTINGS = "warehouse_settings"
ORPHAN_GRACE_S = 3600.0
"""A file in no manifest is deleted only this long after it was written or retired: a reader that opened
the snapshot before a rebuild may still be reading the files it lists."""
# zstd at its fastest level: request rows' doubles are mostly incompressible, the rest compresses well.
_COMPRESSION = "zstd"
_COMPRESSION_LEVEL = 1


def legacy_table(table: str) -> str:
    """The DuckDB table holding rows ingested before migration 0010 (empty in a warehouse built since)."""
    return f"{table}_legacy"


def legacy_rows(con: duckdb.DuckDBPyConnection) -> int:
    """Rows still in the `<table>_legacy` tables (ingested before migration 0010; a rebuild moves them)."""
    total = 0
    for table in PARTED_TABLES:
        if _has_table(con, legacy_table(table)):
            found = con.execute(f"SELECT count(*) FROM {legacy_table(table)}").fetchone()
            total += int(found[0]) if found else 0
    return total


def parts_dir(db_path: Path | str) -> Path:
    """Where the Parquet files of the warehouse at `db_path` live (see the module docstring)."""
    db_path = Path(db_path)
    shared = get_settings().warehouse_parts
    return (Path(shared) if shared is not None else db_path.parent) / f"{db_path.name}.parts"


def _has_table(con: duckdb.DuckDBPyConnection, name: str) -> bool:
    found = con.execute(
        "SELECT count(*) FROM duckdb_tables() WHERE database_name = current_database() AND table_name = ?",
        [name],
    ).fetchone()
    return bool(found and found[0])


def root_of(con: duckdb.DuckDBPyConnection) -> Path | None:
    """The parts root this database records (None: a database before migration 0010, or never written)."""
    if not _has_table(con, SETTINGS):
        return None
    found = con.execute(f"SELECT value FROM {SETTINGS} WHERE name = 'parts_root'").fetchone()
    return Path(found[0]) if found else None


def ensure_root(con: duckdb.DuckDBPyConnection) -> Path | None:
    """The recorded root or, for a connection not opened by warehouse.db.writer() (a bare, migrated one),
    the default root of the database file it opened, recorded now. None before migration 0010."""
    root = root_of(con)
    if root is not None or not _has_table(con, SETTINGS):
        return root
    found = con.execute(
        "SELECT path FROM duckdb_databases() WHERE database_name = current_database()"
    ).fetchone()
    if not found or not found[0]:
        return None
    set_root(con, parts_dir(found[0]))
    return root_of(con)


def set_root(con: duckdb.DuckDBPyConnection, root: Path) -> bool:
    """Record `root` as this database's parts root (a writer does, on opening) and, when it changed, point
    the views at it. False when the database is not yet at migration 0010."""
    if not _has_table(con, SETTINGS):
        return False
    root = Path(root).resolve()
    if root_of(con) == root:
        return True
    con.execute("BEGIN TRANSACTION")
    try:
        con.execute(f"INSERT OR REPLACE INTO {SETTINGS} VALUES ('parts_root', ?)", [str(root)])
        refresh_views(con, root)
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise
    return True


@dataclass(frozen=True)
class PartFile:
    """One Parquet file written by a batch: where (relative to the root), for which table and campaign."""

    table: str
    campaign_id: str
    name: str  # relative to the parts root, '/'-separated
    rows: int
    bytes: int
    ingest_id: str


def write_part(
    root: Path, table: str, campaign_id: str, rows: pl.DataFrame | pa.Table, ingest_id: str
) -> PartFile:
    """Write `rows` as a new, never-overwritten Parquet file of `table` for `campaign_id`: to a dot-name
    first, then renamed, so nothing ever sees a partial file. Not yet visible: `record` makes it so."""
    frame = rows if isinstance(rows, pl.DataFrame) else pl.from_arrow(rows)
    assert isinstance(frame, pl.DataFrame)
    folder = Path(root) / table / campaign_id
    folder.mkdir(parents=True, exist_ok=True)
    name = f"{ingest_id}-{uuid.uuid4().hex[:8]}.{schema_tag(frame)}.parquet"
    tmp = folder / f".{name}.tmp"
    try:
        # polars' writer encodes columns in parallel: 0.8 s per million request rows against 1.6 for
        # pyarrow's (one thread), 1.2-1.3 CPU-s against 1.6-1.9 (docs/performance.md "Warehouse").
        frame.write_parquet(
            tmp,
            compression=_COMPRESSION,
            compression_level=_COMPRESSION_LEVEL,
            row_group_size=131_072,  # DuckDB scans a file's row groups in parallel
        )
        os.replace(tmp, folder / name)
    finally:
        tmp.unlink(missing_ok=True)
    size = (folder / name).stat().st_size
    return PartFile(table, campaign_id, f"{table}/{campaign_id}/{name}", frame.height, size, ingest_id)


def discard(root: Path, parts: Iterable[PartFile]) -> None:
    """Delete files whose transaction did not commit (they are in no manifest, so no reader saw them)."""
    for part in parts:
        (Path(root) / part.name).unlink(missing_ok=True)


def record(con: duckdb.DuckDBPyConnection, root: Path, parts: Sequence[PartFile]) -> None:
    """Inside the caller's transaction: add `parts` to the manifest and recreate the views over it."""
    if not parts:
        return
    now = datetime.now(UTC).replace(tzinfo=None)
    con.executemany(
        f"INSERT INTO {MANIFEST} VALUES (?, ?, ?, ?, ?, ?, ?)",
        [[p.name, p.table, p.campaign_id, p.rows, p.bytes, p.ingest_id, now] for p in parts],
    )
    refresh_views(con, root, {p.table for p in parts})


def committed_files(con: duckdb.DuckDBPyConnection, table: str, root: Path | None = None) -> list[Path]:
    """The files of `table` the manifest lists, as absolute paths, in a stable order."""
    root = root or root_of(con)
    if root is None or not _has_table(con, MANIFEST):
        return []
    names = con.execute(f"SELECT file FROM {MANIFEST} WHERE table_name = ? ORDER BY file", [table]).fetchall()
    return [Path(root) / n for (n,) in names]


def _quoted(path: Path) -> str:
    return "'" + str(path).replace("'", "''") + "'"


def schema_tag(frame: pl.DataFrame) -> str:
    """8 hex of the hash of a frame's column names and types: part of its file's name, so that the view
    reads files of one schema with one `read_parquet` (which then reads one file's footer to bind, not
    every file's, as `union_by_name` does: a cost that would grow with the warehouse)."""
    columns = ",".join(f"{name}:{dtype}" for name, dtype in frame.schema.items())
    return hashlib.sha256(columns.encode()).hexdigest()[:8]


def _tag_of(path: Path) -> str:
    parts = path.name.split(".")
    return parts[-2] if len(parts) >= 3 else ""


def view_sql(table: str, files: Sequence[Path]) -> str:
    """The view: the legacy table's rows, then each schema's files through one `read_parquet`, combined
    BY NAME (the legacy table's columns first; a column some files lack reads as null in their rows)."""
    selects = [f"SELECT * FROM {legacy_table(table)}"]
    groups: dict[str, list[Path]] = {}
    for f in files:
        groups.setdefault(_tag_of(f), []).append(f)
    for group in groups.values():
        selects.append(f"SELECT * FROM read_parquet([{', '.join(_quoted(f) for f in group)}])")
    return f"CREATE OR REPLACE VIEW {table} AS " + " UNION ALL BY NAME ".join(selects)


def refresh_views(con: duckdb.DuckDBPyConnection, root: Path, tables: Iterable[str] = PARTED_TABLES) -> None:
    """(Re)create each parted table's view over its committed files (inside the caller's transaction)."""
    for table in tables:
        con.execute(view_sql(table, committed_files(con, table, root)))


def register_datasets(con: duckdb.DuckDBPyConnection) -> None:
    """For a connection that will reach no file itself (warehouse.db.restrict_file_access): shadow each
    parted view with a temporary one over Arrow datasets of the committed files, read by Arrow, not by
    DuckDB's file system. Letting DuckDB read the parts folder would let a query write there too (`COPY
    ... TO` overwrites), since DuckDB's allowed directories do not tell reading from writing."""
    root = root_of(con)
    if root is None:
        return
    for table in PARTED_TABLES:
        files = committed_files(con, table, root)
        if not files:
            continue
        dataset = pads.dataset([str(f) for f in files], format="parquet")
        con.register(f"_parts_{table}", dataset)
        con.execute(
            f"CREATE OR REPLACE TEMP VIEW {table} AS SELECT * FROM main.{legacy_table(table)} "
            f"UNION ALL BY NAME SELECT * FROM _parts_{table}"
        )


def retire(root: Path, names: Iterable[str]) -> None:
    """Files that just left the manifest (a rebuild replaced them): start their grace period now."""
    now = time.time()
    for name in names:
        try:
            os.utime(Path(root) / name, (now, now))
        except FileNotFoundError:
            pass


def sweep(con: duckdb.DuckDBPyConnection, grace_s: float = ORPHAN_GRACE_S) -> list[Path]:
    """Delete files under the root that the manifest does not list and that were written or retired more
    than `grace_s` ago (a killed writer's, a rolled-back batch's, a rebuild's predecessor's). The caller
    holds the writer lock, so no batch is in flight. Returns what was deleted."""
    root = root_of(con)
    if root is None or not root.is_dir():
        return []
    listed = {str(root / n) for (n,) in con.execute(f"SELECT file FROM {MANIFEST}").fetchall()}
    cutoff = time.time() - grace_s
    removed: list[Path] = []
    for table in PARTED_TABLES:
        folder = root / table
        if not folder.is_dir():
            continue
        for path in folder.glob("*/*.parquet*"):
            if str(path) in listed:
                continue
            try:
                if path.stat().st_mtime < cutoff:
                    path.unlink()
                    removed.append(path)
            except FileNotFoundError:
                continue
    return removed
