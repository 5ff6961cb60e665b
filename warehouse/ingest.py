"""Raw artifacts into the warehouse: idempotent, validated, never half-written.

`ingest_raw(raw_dir, db_path)` walks RAW/<campaign_id>/ and hands each artifact to its kind (the modules of
warehouse.kinds, in the order of warehouse.kinds.KINDS). This module is the engine every kind shares; for
every artifact:

1. its key derives from its place in the raw tree (campaign_id, deployment_id, `<campaign_id>/<cell dir>`,
   `<campaign_id>/<capture_id>`), its sha256 from its files (warehouse.frames.artifact_sha256);
2. the same key with the same hash already in the warehouse: skipped (ingesting twice changes nothing);
   the same key with another hash: an error for immutable artifacts (cells, captures), an update for the
   living records (campaign.json and deployment.json are rewritten as a campaign progresses);
3. its files are read into frames and validated with the pandera models, a batch of artifacts at once;
4. an artifact that cannot be read or fails validation is quarantined (table `quarantine`: file, column,
   a few failing rows, the reason) and nothing of it is written; the others load;
5. valid artifacts are written whole inside one transaction (their rows, their child rows, their ingest_log
   rows): a batch of artifacts per transaction by default, because a commit costs milliseconds and cells
   are many and small (`per_artifact=True`: one transaction each). No artifact is ever half in the
   warehouse, even if the process dies mid-ingest.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from queue import Full, Queue
from typing import Any

import duckdb
import pandera.errors
import polars as pl
import pyarrow as pa
from pandera.polars import DataFrameModel

from artifacts import layout
from specgauge.errors import ArtifactError
from specgauge.settings import get_settings
from warehouse import parts, sketches
from warehouse.db import default_path, replacing, writer
from warehouse.errors import ArtifactInvalid
from warehouse.frames import (
    Files,
    ParquetPart,
    Part,
    artifact_sha256,
    read_files,
    read_parquet_parts,
    table_schema,
    to_frame,
)
from warehouse.kinds import KINDS
from warehouse.kinds.base import ArtifactKind, ArtifactRef
from warehouse.kinds.drafters import KIND as DRAFTERS_KIND
from warehouse.lock import WaitCallback
from warehouse.models import one_query

__all__ = [
    "ArtifactKind",
    "ArtifactRef",
    "IngestReport",
    "Outcome",
    "ingest_artifacts",
    "ingest_found",
    "ingest_path",
    "ingest_raw",
    "ingest_tree",
    "rebuild",
]

# before_commit(kind, keys) runs inside a write transaction, right before COMMIT (tests inject crashes there).
BeforeCommit = Callable[[str, list[str]], None]


# ---------------------------------------------------------------------------------------------- the report


@dataclass
class Outcome:
    kind: str
    key: str
    action: str  # inserted | updated | skipped | quarantined | changed
    rows: int = 0
    message: str = ""
    source_path: str = ""


@dataclass
class IngestReport:
    raw_dir: Path
    db_path: Path
    ingest_id: str
    outcomes: list[Outcome] = field(default_factory=list)
    rows_by_table: Counter[str] = field(default_factory=Counter)
    seconds: float = 0.0

    @property
    def quarantined(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.action == "quarantined"]

    @property
    def errors(self) -> list[Outcome]:
        """Immutable artifacts whose content changed after they were ingested."""
        return [o for o in self.outcomes if o.action == "changed"]

    @property
    def ok(self) -> bool:
        return not self.quarantined and not self.errors

    @property
    def rows(self) -> int:
        return sum(self.rows_by_table.values())

    def counts(self) -> dict[str, Counter[str]]:
        out: dict[str, Counter[str]] = {}
        for o in self.outcomes:
            out.setdefault(o.kind, Counter())[o.action] += 1
        return out

    def as_dict(self) -> dict[str, Any]:
        return {
            "raw_dir": str(self.raw_dir),
            "db_path": str(self.db_path),
            "ingest_id": self.ingest_id,
            "seconds": round(self.seconds, 3),
            "counts": {k: dict(v) for k, v in self.counts().items()},
            "rows": dict(self.rows_by_table),
            "quarantined": [f"{o.source_path}: {o.message}" for o in self.quarantined],
            "errors": [f"{o.source_path}: {o.message}" for o in self.errors],
        }


# ------------------------------------------------------------------------------------------------ the walk


def ingest_raw(
    raw_dir: Path | str | None = None,
    db_path: Path | str | None = None,
    *,
    before_commit: BeforeCommit | None = None,
    lock_timeout_s: float | None = None,
    on_wait: WaitCallback | None = None,
    per_artifact: bool = False,
) -> IngestReport:
    """Ingest every artifact under `raw_dir` (default: the settings' raw dir; a single campaign directory
    works too) into the warehouse at `db_path` (default: the settings' warehouse). Takes the writer lock
    (waiting up to `lock_timeout_s`, saying so through `on_wait`). `per_artifact`: one transaction per
    artifact instead of per batch."""
    raw_root = Path(raw_dir) if raw_dir is not None else get_settings().raw_dir
    target = Path(db_path) if db_path is not None else default_path()
    if not raw_root.is_dir():
        raise ArtifactError(f"no raw artifacts at {raw_root} (not a directory)")
    with writer(target, timeout_s=lock_timeout_s, on_wait=on_wait) as con:
        return ingest_tree(
            con, raw_root, db_path=target, before_commit=before_commit, per_artifact=per_artifact
        )


def rebuild(
    raw_dir: Path | str | None = None,
    db_path: Path | str | None = None,
    *,
    lock_timeout_s: float | None = None,
    on_wait: WaitCallback | None = None,
) -> IngestReport:
    """Recreate the warehouse from raw artifacts: built in a temporary file, then swapped in atomically. A
    damaged warehouse file is set aside, kept (warehouse.db.replacing)."""
    raw_root = Path(raw_dir) if raw_dir is not None else get_settings().raw_dir
    target = Path(db_path) if db_path is not None else default_path()
    if not raw_root.is_dir():
        raise ArtifactError(f"no raw artifacts at {raw_root}: nothing to rebuild from")
    with replacing(target, timeout_s=lock_timeout_s, on_wait=on_wait) as con:
        return ingest_tree(con, raw_root, db_path=target)


def ingest_tree(
    con: duckdb.DuckDBPyConnection,
    raw_dir: Path,
    *,
    db_path: Path | None = None,
    before_commit: BeforeCommit | None = None,
    per_artifact: bool = False,
) -> IngestReport:
    """Ingest a raw tree through an open, migrated, writable connection (the caller holds the writer)."""
    raw_dir = Path(raw_dir)
    if not raw_dir.is_dir():
        raise ArtifactError(f"no raw artifacts at {raw_dir} (not a directory)")
    report = IngestReport(raw_dir=raw_dir, db_path=db_path or Path("?"), ingest_id=uuid.uuid4().hex[:12])
    started = time.perf_counter()
    for campaign_dir in layout.campaign_dirs(raw_dir):
        for kind in KINDS:
            refs = list(kind.discover(campaign_dir, campaign_dir.name))
            report.outcomes += ingest_artifacts(
                con,
                kind,
                refs,
                ingest_id=report.ingest_id,
                before_commit=before_commit,
                report=report,
                per_artifact=per_artifact,
            )
    drafters = layout.drafters_dir(raw_dir)  # trained heads live beside the campaigns, not in one
    if drafters.is_dir():
        report.outcomes += ingest_artifacts(
            con,
            DRAFTERS_KIND,
            list(DRAFTERS_KIND.discover(drafters, layout.DRAFTERS)),
            ingest_id=report.ingest_id,
            before_commit=before_commit,
            report=report,
            per_artifact=per_artifact,
        )
    report.seconds = time.perf_counter() - started
    return report


# --------------------------------------------------------------------------------------- one kind, batched


@dataclass
class _Item:
    ref: ArtifactRef
    sha256: str
    parts: dict[str, Part]
    replacing: bool
    was_quarantined: bool
    started: float
    rows: int = 0  # rows written (known once validated)
    size: int = 0  # about the rows it brings to its batch (parquet files on disk: estimated from bytes)

    def __post_init__(self) -> None:
        for part in self.parts.values():
            if isinstance(part, ParquetPart):
                self.size += part.size // 250  # about the rows of a requests file
            else:
                self.size += part.height if isinstance(part, pl.DataFrame) else len(part)


def ingest_artifacts(
    con: duckdb.DuckDBPyConnection,
    kind: ArtifactKind,
    refs: list[ArtifactRef],
    *,
    ingest_id: str | None = None,
    before_commit: BeforeCommit | None = None,
    report: IngestReport | None = None,
    batch_rows: int = 200_000,
    batch_artifacts: int = 512,
    per_artifact: bool = False,
) -> list[Outcome]:
    """Ingest artifacts of one kind through a writer connection.

    Artifacts are read, then validated and written a batch at a time (up to `batch_artifacts` artifacts or
    `batch_rows` rows): one pandera call per table, one INSERT per table, one transaction per batch. Each
    transaction holds only whole, validated artifacts, so an artifact is entirely in the warehouse or not
    at all. `per_artifact=True` gives every artifact its own transaction (slower: see
    benchmarks/warehouse_bench.py).
    """
    if not refs:
        return []
    ingest_id = ingest_id or uuid.uuid4().hex[:12]
    keys = [r.key for r in refs]
    known = dict(
        con.execute(
            f"SELECT {kind.key_column}, sha256 FROM {kind.table} WHERE {kind.key_column} = ANY(?)", [keys]
        ).fetchall()
    )
    quarantined = {
        key: (sha, reason)
        for key, sha, reason in con.execute(
            "SELECT artifact_key, sha256, reason FROM quarantine WHERE kind = ? AND artifact_key = ANY(?)",
            [kind.name, keys],
        ).fetchall()
    }
    limit_rows, limit_artifacts = (1, 1) if per_artifact else (batch_rows, batch_artifacts)
    batches = _prepared(kind, refs, known, quarantined, limit_rows, limit_artifacts)
    outcomes: list[Outcome] = []
    # Reading and validating the next batch (polars, pandera) overlaps writing this one (DuckDB): both
    # release the GIL for their heavy work.
    for batch in _prefetch(batches):
        outcomes += batch.decided
        for ref, old, new in batch.changed:
            outcomes.append(_changed(con, kind, ref, old, new, ingest_id))
        for ref, sha, problem in batch.invalid:
            outcomes.append(_quarantine(con, kind, ref, sha, problem, ingest_id))
        if batch.items:
            outcomes += _write(
                con,
                kind,
                batch.items,
                batch.frames,
                ingest_id,
                before_commit,
                report,
                batch.arrow,
                batch.sketches,
            )
    return outcomes


@dataclass
class _Batch:
    decided: list[Outcome] = field(default_factory=list)  # skipped, or quarantined before and unchanged
    changed: list[tuple[ArtifactRef, str, str]] = field(default_factory=list)  # (ref, old sha, new sha)
    invalid: list[tuple[ArtifactRef, str | None, ArtifactInvalid]] = field(default_factory=list)
    items: list[_Item] = field(default_factory=list)  # read and validated: to write
    frames: dict[str, pl.DataFrame] = field(default_factory=dict)  # their validated rows, by table
    arrow: dict[str, pa.Table] = field(default_factory=dict)  # the same rows, contiguous, for the INSERT
    sketches: pl.DataFrame | None = None  # the cell_sketches rows of its request rows (warehouse.sketches)
    rows: int = 0


def _prepared(
    kind: ArtifactKind,
    refs: list[ArtifactRef],
    known: dict[str, str],
    quarantined: dict[str, tuple[str | None, str]],
    limit_rows: int,
    limit_artifacts: int,
) -> Iterator[_Batch]:
    """Read, hash, decide and validate artifacts, a batch at a time. No database access: runs in a thread."""
    batch = _Batch()
    for ref in refs:
        started = time.perf_counter()
        sha: str | None = None
        try:
            files = _read(kind, ref)
            sha = artifact_sha256(files)
            if ref.key in known and known[ref.key] == sha:
                batch.decided.append(Outcome(kind.name, ref.key, "skipped", source_path=ref.source_path))
                continue
            if ref.key in known and kind.immutable:
                batch.changed.append((ref, known[ref.key], sha))
                continue
            if ref.key in quarantined and quarantined[ref.key][0] == sha:
                batch.decided.append(_still_quarantined(kind, ref, quarantined[ref.key][1]))
                continue
            parts = _frames(kind, ref, files, sha)
        except ArtifactInvalid as exc:
            if ref.key in quarantined and quarantined[ref.key][0] == sha:
                batch.decided.append(_still_quarantined(kind, ref, quarantined[ref.key][1]))
            else:
                batch.invalid.append((ref, sha, exc))
            continue
        item = _Item(ref, sha, parts, ref.key in known, ref.key in quarantined, started)
        batch.items.append(item)
        batch.rows += item.size
        if batch.rows >= limit_rows or len(batch.items) >= limit_artifacts:
            yield _validated(kind, batch)
            batch = _Batch()
    if batch.items or batch.decided or batch.changed or batch.invalid:
        yield _validated(kind, batch)


_DONE = object()


def _prefetch(batches: Iterator[_Batch]) -> Iterator[_Batch]:
    """Iterate `batches`, preparing the next one in a background thread while the caller works."""
    queue: Queue[object] = Queue(maxsize=1)
    stop = threading.Event()

    def offer(item: object) -> bool:
        while not stop.is_set():  # the consumer may have stopped (an exception): never block on it
            try:
                queue.put(item, timeout=0.2)
                return True
            except Full:
                continue
        return False

    def produce() -> None:
        try:
            for batch in batches:
                if not offer(batch):
                    return
        except BaseException as exc:  # handed to the consumer, raised there
            offer(exc)
            return
        offer(_DONE)

    thread = threading.Thread(target=produce, name="warehouse-ingest-prefetch", daemon=True)
    thread.start()
    try:
        while True:
            item = queue.get()
            if item is _DONE:
                return
            if isinstance(item, BaseException):
                raise item
            yield item  # type: ignore[misc]
    finally:
        stop.set()
        thread.join()


def _frames(kind: ArtifactKind, ref: ArtifactRef, files: Files, sha: str) -> dict[str, Part]:
    try:
        return kind.frames(ref, files, sha)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
        # JSON of an unexpected shape that the reader did not foresee: the artifact's fault, quarantine it
        raise ArtifactInvalid(f"could not read it: {type(exc).__name__}: {exc}") from exc


def _read(kind: ArtifactKind, ref: ArtifactRef) -> Files:
    try:
        names = kind.files(ref) if callable(kind.files) else kind.files
        return read_files(ref.path, names)
    except FileNotFoundError:
        raise ArtifactInvalid("artifact directory vanished while reading") from None


def _validated(kind: ArtifactKind, batch: _Batch) -> _Batch:
    """Validate a batch table by table; move the artifacts that fail to `invalid`, keep the rest's rows."""
    failures: dict[str, ArtifactInvalid] = {}
    frames: dict[str, pl.DataFrame] = {}
    items = batch.items
    tables = [kind.table, *sorted({t for item in items for t in item.parts} - {kind.table})]
    for table in tables:
        members = [i for i in items if table in i.parts and i.ref.key not in failures]
        frames[table], bad = _validate_table(kind, table, members)
        failures.update(bad)
    if failures:  # an artifact failing in one table leaves every table
        failed = list(failures)
        frames = {t: f.filter(~pl.col(kind.key_column).is_in(failed)) for t, f in frames.items()}
        batch.invalid += [(i.ref, i.sha256, failures[i.ref.key]) for i in items if i.ref.key in failures]
        batch.items = [i for i in items if i.ref.key not in failures]
    keys = [f.get_column(kind.key_column) for f in frames.values() if f.height]
    rows = dict(pl.concat(keys).value_counts().iter_rows()) if keys else {}
    for item in batch.items:
        item.parts = {}  # the validated rows are in `frames` now
        item.rows = rows.get(item.ref.key, 0)
    # Converted here, in the reading thread, not by the writer: one chunk per column (not one per
    # artifact) makes the Arrow export a few calls instead of thousands that each need the GIL. The
    # Arrow tables share the rechunked frames' buffers. Parted tables (request rows) go to Parquet through
    # polars, which takes them chunked: neither copied into one chunk nor exported (docs/performance.md).
    batch.frames = {t: f if t in kind.parted else f.rechunk() for t, f in frames.items()}
    batch.arrow = {t: f.to_arrow() for t, f in batch.frames.items() if f.height and t not in kind.parted}
    # The latency sketches' rows too: counting ~24 values per request row is the heaviest step after the
    # Parquet I/O, and here it overlaps the writer's work instead of lengthening its transaction.
    if "requests" in batch.frames:
        batch.sketches = sketches.sketch_rows(batch.frames["requests"])
    return batch


def _validate_table(
    kind: ArtifactKind, table: str, items: list[_Item]
) -> tuple[pl.DataFrame, dict[str, ArtifactInvalid]]:
    """One pandera call over the batch's rows for `table`. Failing rows are traced to their artifact by
    its key column; failures that name no row (a column of the wrong type) are found artifact by artifact."""
    model = kind.models[table]
    bad: dict[str, ArtifactInvalid] = {}
    pieces: list[tuple[_Item, pl.DataFrame]] = []
    on_disk = [i for i in items if isinstance(i.parts[table], ParquetPart)]
    parquet = read_parquet_parts(model, [i.parts[table] for i in on_disk])  # type: ignore[misc]
    read: dict[str, pl.DataFrame | ArtifactInvalid] = dict(
        zip((i.ref.key for i in on_disk), parquet.results, strict=True)
    )
    read |= _rows_together(model, table, [i for i in items if isinstance(i.parts[table], list)])
    for item in items:
        if item.ref.key in read:
            result = read[item.ref.key]
            if isinstance(result, ArtifactInvalid):
                bad[item.ref.key] = result
            else:
                pieces.append((item, result))
            continue
        try:
            pieces.append((item, to_frame(model, item.parts[table])))
        except (pl.exceptions.PolarsError, TypeError, ValueError, OverflowError) as exc:
            bad[item.ref.key] = ArtifactInvalid(f"cannot make rows: {exc}", file=kind.source(table))
    pieces = [(i, f) for i, f in pieces if f.height]
    if not pieces:
        return pl.DataFrame(schema=table_schema(model)), bad
    try:
        if parquet.whole is not None and len(on_disk) == len(items):
            combined = parquet.whole  # the pieces are its slices, in order: no copy
        elif len(pieces) > 1:
            combined = pl.concat([f for _, f in pieces], how="vertical_relaxed")
        else:
            combined = pieces[0][1]
    except pl.exceptions.PolarsError:
        return _validate_each(kind, table, pieces, bad)
    try:
        return _checked(model, combined), bad
    except pandera.errors.SchemaErrors as exc:
        cases = exc.failure_cases
        if cases.get_column("index").null_count():
            return _validate_each(kind, table, pieces, bad)
        offsets, start = {}, 0
        for item, frame in pieces:
            offsets[item.ref.key] = start
            start += frame.height
        key_of_row = combined.get_column(kind.key_column)
        cases = cases.with_columns(
            pl.Series("_key", [key_of_row[int(i)] for i in cases.get_column("index")], dtype=pl.String)
        )
        for key, group in cases.group_by("_key", maintain_order=True):
            bad[str(key[0])] = _explain(group, kind.source(table), offsets[str(key[0])])
        keep = [(i, f) for i, f in pieces if i.ref.key not in bad]
        if not keep:
            return pl.DataFrame(schema=combined.schema), bad
        try:
            return model.validate(pl.concat([f for _, f in keep], how="vertical_relaxed"), lazy=True), bad
        except (pandera.errors.SchemaErrors, pandera.errors.SchemaError, pl.exceptions.PolarsError):
            return _validate_each(kind, table, keep, bad)
    except (pandera.errors.SchemaError, pl.exceptions.PolarsError):
        return _validate_each(kind, table, pieces, bad)


def _checked(model: type[DataFrameModel], frame: pl.DataFrame) -> pl.DataFrame:
    """`frame` validated: every check in one query first (all a valid batch needs); if that fails, by the
    model itself, whose errors name the column and the check (warehouse.models.one_query)."""
    try:
        return one_query(model).validate(frame, lazy=True)
    except (pandera.errors.SchemaErrors, pandera.errors.SchemaError):
        return model.validate(frame, lazy=True)


def _rows_together(model: type[DataFrameModel], table: str, items: list[_Item]) -> dict[str, pl.DataFrame]:
    """The row dicts of many artifacts as one frame (one construction, not one per artifact), sliced back
    per artifact. If that fails, returns nothing: each artifact is then built, and judged, alone."""
    if len(items) < 2:
        return {}
    try:
        frame = to_frame(model, [row for item in items for row in item.parts[table]])  # type: ignore[union-attr]
    except (pl.exceptions.PolarsError, TypeError, ValueError, OverflowError):
        return {}
    out, offset = {}, 0
    for item in items:
        n = len(item.parts[table])
        out[item.ref.key] = frame.slice(offset, n)
        offset += n
    return out


def _validate_each(
    kind: ArtifactKind, table: str, pieces: list[tuple[_Item, pl.DataFrame]], bad: dict[str, ArtifactInvalid]
) -> tuple[pl.DataFrame, dict[str, ArtifactInvalid]]:
    model = kind.models[table]
    good: list[pl.DataFrame] = []
    for item, frame in pieces:
        try:
            good.append(model.validate(frame, lazy=True))
        except pandera.errors.SchemaErrors as exc:
            bad[item.ref.key] = _explain(exc.failure_cases, kind.source(table), 0)
        except (pandera.errors.SchemaError, pl.exceptions.PolarsError) as exc:
            bad[item.ref.key] = ArtifactInvalid(str(exc).splitlines()[0], file=kind.source(table))
    if not good:
        return pl.DataFrame(schema=table_schema(model)), bad
    return pl.concat(good, how="vertical_relaxed"), bad


def _explain(cases: pl.DataFrame, file: str, offset: int) -> ArtifactInvalid:
    """The first failing check as a quarantine reason: file, column, check, a few rows (within the file)."""
    first = cases.row(0, named=True)
    column, check = first.get("column"), str(first.get("check"))
    same = cases.filter((pl.col("column") == column) & (pl.col("check") == check))
    rows = [int(i) - offset for i in same.get_column("index").drop_nulls().head(5).to_list()]
    values = [str(v) for v in same.get_column("failure_case").head(3).to_list()]
    if first.get("schema_context") == "DataFrameSchema" and ":" in check:
        column, check = check.split(":", 1)  # our frame-level checks read "column: rule"
        values = []
    failing = f" ({same.height} rows)" if same.height > len(rows) and rows else ""
    shown = f"; values {', '.join(values)}" if values else ""
    others = f"; and {cases.height - same.height} other failure(s)" if cases.height > same.height else ""
    return ArtifactInvalid(
        f"check {check.strip()} failed{failing}{shown}{others}",
        file=file,
        column=column,
        rows=rows,
    )


def _now() -> datetime:
    return datetime.now(UTC).replace(tzinfo=None)


_LOG_SCHEMA = {
    "ingest_id": pl.String,
    "at_utc": pl.Datetime("us"),
    "kind": pl.String,
    "artifact_key": pl.String,
    "sha256": pl.String,
    "action": pl.String,
    "rows": pl.Int64,
    "seconds": pl.Float64,
    "note": pl.String,
}


def _log(
    con: duckdb.DuckDBPyConnection,
    ingest_id: str,
    kind: str,
    key: str,
    sha: str | None,
    action: str,
    note: str | None,
) -> None:
    con.execute(
        "INSERT INTO ingest_log VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        [ingest_id, _now(), kind, key, sha, action, 0, 0.0, note],
    )


def _insert(con: duckdb.DuckDBPyConnection, table: str, frame: pl.DataFrame | pa.Table) -> None:
    con.register("_ingest_frame", frame)
    try:
        con.execute(f"INSERT INTO {table} BY NAME SELECT * FROM _ingest_frame")
    finally:
        con.unregister("_ingest_frame")


def _write(
    con: duckdb.DuckDBPyConnection,
    kind: ArtifactKind,
    items: list[_Item],
    frames: dict[str, pl.DataFrame],
    ingest_id: str,
    before_commit: BeforeCommit | None,
    report: IngestReport | None,
    arrow: dict[str, pa.Table] | None = None,
    sketch_rows: pl.DataFrame | None = None,
) -> list[Outcome]:
    """Write whole, validated artifacts in one transaction (with their ingest_log rows). `arrow`: the same
    rows as `frames`, already converted (see _validated); `sketch_rows`: the cell_sketches rows of
    frames["requests"], already counted (None: counted here). The kind's `parted` tables go to Parquet files
    (warehouse.parts), listed in the manifest in this same transaction: visible exactly when it commits."""
    keys = [i.ref.key for i in items]
    root = parts.ensure_root(con) if kind.parted else None
    if kind.parted and root is None:
        raise ArtifactError("the warehouse is not migrated: open it with warehouse.db.writer()")
    written: list[parts.PartFile] = []
    now = _now()
    log = pl.DataFrame(
        [
            {
                "ingest_id": ingest_id,
                "at_utc": now,
                "kind": kind.name,
                "artifact_key": i.ref.key,
                "sha256": i.sha256,
                "action": "updated" if i.replacing else "inserted",
                "rows": i.rows,
                "seconds": round(time.perf_counter() - i.started, 6),
                "note": None,
            }
            for i in items
        ],
        schema=_LOG_SCHEMA,
    )
    con.execute("BEGIN TRANSACTION")
    try:
        replacing = [i.ref.key for i in items if i.replacing]
        if replacing:
            if kind.parted:  # Parquet files are never rewritten; only immutable kinds have them
                raise ArtifactError(f"{kind.name}: an artifact with Parquet rows cannot be replaced")
            for table in (*kind.child_tables, kind.table):
                con.execute(f"DELETE FROM {table} WHERE {kind.key_column} = ANY(?)", [replacing])
        for table, frame in frames.items():
            if not frame.height:
                continue
            if table in kind.parted:
                assert root is not None
                written += _write_parts(root, kind, table, items, frame, ingest_id)
            else:
                _insert(con, table, (arrow or {}).get(table, frame))
        # The batch's cells' latency sketches, in their transaction (warehouse.sketches): a cell kind's only.
        sketches.insert(con, frames.get("requests"), frames.get("cells"), rows=sketch_rows)
        if written:
            assert root is not None
            parts.record(con, root, written)
        cleared = [i.ref.key for i in items if i.was_quarantined]
        if cleared:
            con.execute(
                "DELETE FROM quarantine WHERE kind = ? AND artifact_key = ANY(?)", [kind.name, cleared]
            )
        _insert(con, "ingest_log", log)
        if before_commit is not None:
            before_commit(kind.name, keys)
        con.execute("COMMIT")
    except duckdb.ConstraintException as exc:
        con.execute("ROLLBACK")
        parts.discard(root or Path(), written)
        if len(items) == 1:
            problem = ArtifactInvalid(f"rejected by the database: {exc}")
            return [_quarantine(con, kind, items[0].ref, items[0].sha256, problem, ingest_id)]
        out: list[Outcome] = []  # find the culprit: one transaction per artifact
        for item in items:
            own = {t: f.filter(pl.col(kind.key_column) == item.ref.key) for t, f in frames.items()}
            out += _write(con, kind, [item], own, ingest_id, before_commit, report)
        return out
    except BaseException:
        try:
            con.execute("ROLLBACK")
        except duckdb.Error:
            pass
        parts.discard(root or Path(), written)
        raise
    if report is not None:
        for table, frame in frames.items():
            report.rows_by_table[table] += frame.height
    return [
        Outcome(
            kind.name,
            i.ref.key,
            "updated" if i.replacing else "inserted",
            rows=i.rows,
            source_path=i.ref.source_path,
        )
        for i in items
    ]


def _write_parts(
    root: Path, kind: ArtifactKind, table: str, items: list[_Item], frame: pl.DataFrame, ingest_id: str
) -> list[parts.PartFile]:
    """A batch's rows of a parted table as one Parquet file per campaign (a batch is one campaign's when
    ingest_tree walks the tree; ingest_artifacts may be handed several)."""
    campaigns = sorted({i.ref.campaign_id for i in items})
    if len(campaigns) == 1:
        return [parts.write_part(root, table, campaigns[0], frame, ingest_id)]
    out = []
    for campaign in campaigns:
        keys = [i.ref.key for i in items if i.ref.campaign_id == campaign]
        own = frame.filter(pl.col(kind.key_column).is_in(keys))
        if own.height:
            out.append(parts.write_part(root, table, campaign, own, ingest_id))
    return out


def _still_quarantined(kind: ArtifactKind, ref: ArtifactRef, reason: str) -> Outcome:
    return Outcome(
        kind.name,
        ref.key,
        "quarantined",
        message=f"{ref.source_path}: {reason} (unchanged since)",
        source_path=ref.source_path,
    )


def _quarantine(
    con: duckdb.DuckDBPyConnection,
    kind: ArtifactKind,
    ref: ArtifactRef,
    sha: str | None,
    problem: ArtifactInvalid,
    ingest_id: str,
) -> Outcome:
    message = f"{ref.source_path}/{problem}" if problem.file else f"{ref.source_path}: {problem}"
    con.execute("BEGIN TRANSACTION")
    try:
        con.execute(
            "INSERT OR REPLACE INTO quarantine VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [
                kind.name,
                ref.key,
                ref.source_path,
                sha,
                problem.file,
                problem.column,
                problem.rows or None,
                str(problem),
                _now(),
            ],
        )
        _log(con, ingest_id, kind.name, ref.key, sha, "quarantined", str(problem))
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise
    return Outcome(kind.name, ref.key, "quarantined", message=message, source_path=ref.source_path)


def _changed(
    con: duckdb.DuckDBPyConnection, kind: ArtifactKind, ref: ArtifactRef, old: str, new: str, ingest_id: str
) -> Outcome:
    message = (
        f"{ref.source_path}: content changed since it was ingested (sha256 {old[:12]} then, {new[:12]} now); "
        "raw artifacts are immutable: the warehouse keeps the ingested version"
    )
    _log(con, ingest_id, kind.name, ref.key, new, "changed", message)
    return Outcome(kind.name, ref.key, "changed", message=message, source_path=ref.source_path)


# ------------------------------------------------------------------------------------- one campaign, one kind


def ingest_found(con: duckdb.DuckDBPyConnection, kind: ArtifactKind, campaign_dir: Path) -> list[Outcome]:
    """Every artifact of one kind in one campaign directory (RAW/<campaign_id>) through a writer connection."""
    campaign_dir = Path(campaign_dir)
    return ingest_artifacts(con, kind, list(kind.discover(campaign_dir, campaign_dir.name)))


def ingest_path(
    con: duckdb.DuckDBPyConnection,
    kind: ArtifactKind,
    path: Path,
    *,
    before_commit: BeforeCommit | None = None,
) -> Outcome:
    """One artifact of `kind`, given its directory or file (a campaign: its directory or its campaign.json),
    through a writer connection. Found by the kind's own discovery in the campaign directory above it."""
    path = Path(path)
    for campaign_dir in (path, path.parent, path.parent.parent):
        for ref in kind.discover(campaign_dir, campaign_dir.name):
            located = campaign_dir.parent / ref.source_path  # its file (single-file kinds) or directory
            whole_campaign = located.name == layout.CAMPAIGN_FILE and path == ref.path
            if located.exists() and (path == located or whole_campaign):
                return ingest_artifacts(con, kind, [ref], before_commit=before_commit)[0]
    raise ArtifactError(f"{path}: not a {kind.name} artifact in a campaign directory")
