"""What an artifact kind is to the ingest engine (warehouse.ingest): how to find, hash, read and store one
kind of raw artifact. Each module of warehouse.kinds defines one (or a few related ones) as `KIND`, most
through `file_kind` (single files in a campaign's folder) or `directory_kind` (directories in one), which
find the artifacts and hand each kind's `PlacedFrames` its place; `check_place` holds a document to it."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pandera.polars import DataFrameModel
from pydantic import BaseModel

from artifacts import layout
from warehouse.errors import ArtifactInvalid
from warehouse.frames import Document, Files, Part, document

# An artifact's rows from its place and files: (source_path, campaign_id, its name, files, sha256). `placed`
# makes one an ArtifactKind's `frames`.
PlacedFrames = Callable[[str, str, str, Files, str], dict[str, Part]]
KindFrames = Callable[["ArtifactRef", Files, str], dict[str, Part]]
Models = Mapping[str, type[DataFrameModel]]


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
    frames: KindFrames
    models: Models
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


def directory_refs(
    kind: str, folder: Path, campaign_dir: Path, prefix: str, *, campaign_keyed: bool = True
) -> Iterator[ArtifactRef]:
    """One ref per artifact directory in `folder` (RAW/<campaign>/<folder>/<name>/), keyed
    `<campaign_id>/<name>` where names are unique within a campaign only, else (`campaign_keyed` False)
    `<name>`."""
    for d in layout.subdirs(folder):
        yield ArtifactRef(
            kind,
            f"{campaign_dir.name}/{d.name}" if campaign_keyed else d.name,
            d,
            f"{prefix}/{folder.name}/{d.name}",
            campaign_dir.name,
            d.name,
        )


def file_refs(
    kind: str, paths: Iterable[Path], campaign_dir: Path, prefix: str, *, campaign_keyed: bool = True
) -> Iterator[ArtifactRef]:
    """One ref per single-file artifact (RAW/<campaign>/<folder>/<name>.json, e.g. a gate verdict), keyed
    `<campaign_id>/<name>`, or `<name>` (`campaign_keyed` False) where the name is unique across campaigns;
    the folder holds the campaign's others of its kind."""
    for path in paths:
        yield ArtifactRef(
            kind,
            f"{campaign_dir.name}/{path.stem}" if campaign_keyed else path.stem,
            path.parent,
            f"{prefix}/{path.parent.name}/{path.name}",
            campaign_dir.name,
            path.stem,
        )


def placed(frames: PlacedFrames) -> KindFrames:
    """`frames` as an ArtifactKind's: given the ref's place."""
    return lambda ref, files, sha256: frames(ref.source_path, ref.campaign_id, ref.name, files, sha256)


def file_kind(
    *,
    name: str,
    table: str,
    key_column: str,
    found: Callable[[Path], Iterable[Path]],
    frames: KindFrames,
    models: Models,
    sources: Mapping[str, str] | None = None,
) -> ArtifactKind:
    """A kind of single-file artifacts, RAW/<campaign>/<folder>/<name>.json (`found`: a campaign's, from
    artifacts.layout, which leaves out the temporaries of files being written), keyed
    `<campaign_id>/<name>`. Each file is hashed and read on its own: its folder holds the campaign's others."""
    return ArtifactKind(
        name=name,
        table=table,
        key_column=key_column,
        discover=lambda campaign_dir, prefix: file_refs(name, found(campaign_dir), campaign_dir, prefix),
        frames=frames,
        models=models,
        sources=sources or {},
        files=lambda ref: (f"{ref.name}.json",),
    )


def directory_kind(
    *,
    name: str,
    table: str,
    key_column: str,
    folder: Callable[[Path], Path],
    frames: KindFrames,
    models: Models,
    sources: Mapping[str, str] | None = None,
    immutable: bool = True,
    files: tuple[str, ...] | None = None,
    parted: tuple[str, ...] = (),
    campaign_keyed: bool = True,
) -> ArtifactKind:
    """A kind of artifact directories, RAW/<campaign>/<folder>/<name>/ (`folder`: a campaign's, from
    artifacts.layout); keyed as directory_refs says. The other arguments are ArtifactKind's."""
    return ArtifactKind(
        name=name,
        table=table,
        key_column=key_column,
        discover=lambda campaign_dir, prefix: directory_refs(
            name, folder(campaign_dir), campaign_dir, prefix, campaign_keyed=campaign_keyed
        ),
        frames=frames,
        models=models,
        sources=sources or {},
        immutable=immutable,
        files=files,
        parted=parted,
    )


def file_document(
    files: Files, model: type[Document], campaign_id: str, artifact_id: str, id_field: str
) -> Document:
    """The document of a file_kind artifact, <artifact_id>.json: its own id (`id_field`) and campaign_id
    must be those of its place (file name, campaign directory)."""
    name = f"{artifact_id}.json"
    doc = document(files, name, model)
    check_place(name, doc, **{id_field: artifact_id, "campaign_id": campaign_id})
    return doc


def check_place(file: str, doc: BaseModel, where: str = "where it is", **expected: object) -> None:
    """A document's own ids (`expected`: field=value, checked in order) must be those of its place in the
    raw tree (file name, directory, campaign directory); ArtifactInvalid names the file and the field."""
    for column, value in expected.items():
        found = getattr(doc, column)
        if found != value:
            raise ArtifactInvalid(f"{found!r} does not match {where} ({value!r})", file=file, column=column)
