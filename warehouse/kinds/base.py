"""What an artifact kind is to the ingest engine (warehouse.ingest): how to find, hash, read and store one
kind of raw artifact. Each module of warehouse.kinds defines one (or a few related ones) as `KIND`."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pandera.polars import DataFrameModel

from artifacts import layout
from warehouse.frames import Files, Part


@dataclass(frozen=True)
class ArtifactRef:
    """One raw artifact found in the tree."""

    kind: str
    key: str
    path: Path  # the artifact's directory (or its single file's directory)
    source_path: str  # relative to the raw root, as recorded in the warehouse
    campaign_id: str
    name: str  # the artifact's own name: its directory (or file stem)


@dataclass(frozen=True)
class ArtifactKind:
    """How to find, hash, read and store one kind of raw artifact.

    `frames(ref, files, sha256)` returns {table: frame, ParquetPart or list of row dicts} for the tables
    this artifact fills; `table` gets its single main row (key column `key_column`, plus `sha256` and
    `source_path`), and every table's rows carry `key_column`. `models` gives each of those tables its
    pandera model (the main table first); `sources` names the file a table's rows come from, for quarantine
    messages (default: the table's name).
    """

    name: str
    table: str
    key_column: str
    discover: Callable[[Path, str], Iterable[ArtifactRef]]  # (campaign dir, raw root-relative prefix)
    frames: Callable[[ArtifactRef, Files, str], dict[str, Part]]
    models: Mapping[str, type[DataFrameModel]]
    sources: Mapping[str, str] = field(default_factory=dict)
    immutable: bool = True
    # The files hashed and read: names, a function of the ref giving names (several single-file artifacts
    # in one folder), or None: every regular file in the artifact's directory.
    files: tuple[str, ...] | Callable[[ArtifactRef], Sequence[str]] | None = None
    # Tables whose rows are written as immutable Parquet files (warehouse.parts), not into DuckDB: the big
    # per-request ones. Only immutable kinds may have them (their rows are never replaced).
    parted: tuple[str, ...] = ()

    @property
    def child_tables(self) -> tuple[str, ...]:
        return tuple(t for t in self.models if t != self.table)

    def source(self, table: str) -> str:
        return self.sources.get(table, table)


def directory_refs(kind: str, folder: Path, campaign_dir: Path, prefix: str) -> Iterator[ArtifactRef]:
    """One ref per artifact directory in `folder` (RAW/<campaign>/<folder>/<name>/), keyed
    `<campaign_id>/<name>`: names are unique within a campaign only."""
    for d in layout.subdirs(folder):
        yield ArtifactRef(
            kind,
            f"{campaign_dir.name}/{d.name}",
            d,
            f"{prefix}/{folder.name}/{d.name}",
            campaign_dir.name,
            d.name,
        )


def file_refs(kind: str, paths: Iterable[Path], campaign_dir: Path, prefix: str) -> Iterator[ArtifactRef]:
    """One ref per single-file artifact (RAW/<campaign>/<folder>/<name>.json, e.g. a gate verdict), keyed
    `<campaign_id>/<name>`; the folder holds the campaign's others of its kind."""
    for path in paths:
        yield ArtifactRef(
            kind,
            f"{campaign_dir.name}/{path.stem}",
            path.parent,
            f"{prefix}/{path.parent.name}/{path.name}",
            campaign_dir.name,
            path.stem,
        )
