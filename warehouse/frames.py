"""Raw files into typed polars frames: the readers every artifact kind (warehouse.kinds) shares.

Pure functions of the artifact's file bytes: no database here. Problems raise ArtifactInvalid naming the file
and the JSON field or column; value checks are the pandera models' job (each kind's models).
"""

from __future__ import annotations

import hashlib
import io
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import polars as pl
from pandera.polars import DataFrameModel
from pydantic import BaseModel, ValidationError

from artifacts.documents import TYPE_ERRORS
from warehouse.errors import ArtifactInvalid

Files = Mapping[str, bytes]
Rows = list[dict[str, Any]]
Model = type[DataFrameModel]
Document = TypeVar("Document", bound=BaseModel)

# --------------------------------------------------------------------------------------------- file helpers


def read_files(directory: Path, names: Sequence[str] | None = None) -> dict[str, bytes]:
    """The artifact's files by name (relative to `directory`): `names` (those present), or every regular,
    non-hidden file directly in it."""
    directory = Path(directory)
    if names is None:
        names = sorted(p.name for p in directory.iterdir() if p.is_file() and not p.name.startswith("."))
    out: dict[str, bytes] = {}
    for name in names:
        path = directory / name
        if not path.is_file():
            continue
        try:
            out[name] = path.read_bytes()
        except OSError as exc:
            raise ArtifactInvalid(f"cannot read: {exc.strerror or exc}", file=name) from None
    return out


def artifact_sha256(files: Files) -> str:
    """Hash of an artifact: its file names and contents, in name order."""
    digest = hashlib.sha256()
    for name in sorted(files):
        digest.update(name.encode() + b"\0" + hashlib.sha256(files[name]).digest())
    return digest.hexdigest()


def canonical_json(value: Any) -> str:
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json", exclude_unset=True)  # the fields as written, no defaults
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


def short_hash(value: Any) -> str:
    return hashlib.sha256(canonical_json(value).encode()).hexdigest()[:16]


def document(files: Files, name: str, model: type[Document]) -> Document:
    """A JSON file read through its model (artifacts.documents); ArtifactInvalid names the file and field."""
    if name not in files:
        raise ArtifactInvalid("file missing", file=name)
    try:
        return model.model_validate_json(files[name])
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
    if not first["loc"]:  # not JSON, or not an object: say where and what, as json does
        try:
            parsed = json.loads(files[name])
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            where = (
                f" at line {error.lineno} column {error.colno}"
                if isinstance(error, json.JSONDecodeError)
                else ""
            )
            raise ArtifactInvalid(f"not valid JSON{where}: {error}", file=name) from None
        raise ArtifactInvalid(f"expected a JSON object, got {type(parsed).__name__}", file=name)
    where = ".".join(str(part) for part in first["loc"])
    value = first.get("input")
    if first["type"] == "missing" or (value is None and first["type"] in TYPE_ERRORS):
        message = "required field missing"
    elif first["type"] in TYPE_ERRORS:
        message = f"{TYPE_ERRORS[first['type']]}, got {value!r}"
    else:
        message = first["msg"]
    raise ArtifactInvalid(message, file=name, column=where)


def load_parquet(files: Files, name: str, required: Sequence[str]) -> pl.DataFrame:
    if name not in files:
        raise ArtifactInvalid("file missing", file=name)
    try:
        frame = pl.read_parquet(io.BytesIO(files[name]))
    except Exception as exc:  # polars raises several kinds for a corrupt file
        raise ArtifactInvalid(f"not a readable parquet file: {exc}", file=name) from None
    missing = [c for c in required if c not in frame.columns]
    if missing:
        raise ArtifactInvalid(f"missing column(s): {', '.join(missing)}", file=name, column=missing[0])
    return frame


# ---------------------------------------------------------------------------------------- tables and frames


_SCHEMAS: dict[Model, dict[str, pl.DataType]] = {}


def table_schema(model: Model) -> dict[str, pl.DataType]:
    """Polars column types of a table, from its pandera model."""
    if model not in _SCHEMAS:
        _SCHEMAS[model] = {name: col.dtype.type for name, col in model.to_schema().columns.items()}
    return _SCHEMAS[model]


def to_frame(model: Model, part: Part) -> pl.DataFrame:
    if isinstance(part, pl.DataFrame):
        return part
    if isinstance(part, ParquetPart):
        return part.read(model)
    return pl.DataFrame(part, schema=table_schema(model), orient="row")


def conform(frame: pl.DataFrame, model: Model, file: str) -> pl.DataFrame:
    """The table's columns, in its order and of its types. A value that does not convert (text in a number
    column, say) is an ArtifactInvalid naming the column and the first rows concerned."""
    schema = table_schema(model)
    have = dict(zip(frame.columns, frame.dtypes, strict=True))  # cheaper than frame.schema
    if list(have) == list(schema) and all(have[n] == d for n, d in schema.items()):
        return frame
    casts = []
    for name, dtype in schema.items():
        if have[name] == dtype:
            casts.append(pl.col(name))
            continue
        try:
            frame.select(pl.col(name).cast(dtype, strict=True))
        except (pl.exceptions.PolarsError, TypeError, ValueError):
            lost = frame.with_row_index("_row").filter(
                pl.col(name).is_not_null() & pl.col(name).cast(dtype, strict=False).is_null()
            )
            rows = lost.get_column("_row").head(5).to_list()
            raise ArtifactInvalid(
                f"{have[name]} values do not convert to {dtype}", file=file, column=name, rows=rows
            ) from None
        casts.append(pl.col(name).cast(dtype, strict=True))
    return frame.select(casts)


@dataclass(frozen=True)
class ParquetPart:
    """An artifact's parquet file, left on disk so that a batch reads all its files of one table at once
    (polars reads many small files in one call for a fraction of the per-file cost)."""

    path: Path
    file: str  # its name within the artifact
    key_column: str
    key: str
    columns: tuple[tuple[str, str], ...]  # (column in the file, column in the table), after the key
    size: int = 0  # bytes: sizes batches (about 250 bytes a request row)
    optional: frozenset[str] = frozenset()  # columns a file may lack (read as null)

    def read(self, model: Model) -> pl.DataFrame:
        """This file alone; problems are ArtifactInvalid naming the file and column."""
        try:
            data = self.path.read_bytes()
        except OSError as exc:
            raise ArtifactInvalid(f"cannot read: {exc.strerror or exc}", file=self.file) from None
        required = [c for c, _ in self.columns if c not in self.optional]
        frame = load_parquet({self.file: data}, self.file, required)
        frame = frame.select(
            pl.lit(self.key, pl.String).alias(self.key_column),
            *_columns(frame.columns, self.columns, self.optional),
        )
        return conform(frame, model, self.file)


# What an artifact contributes to a table: a frame, a parquet file read with its batch, or rows made into
# one frame per batch.
Part = pl.DataFrame | ParquetPart | Rows


def parquet_part(
    files: Files,
    directory: Path | None,
    file: str,
    model: Model,
    key_column: str,
    key: str,
    columns: tuple[tuple[str, str], ...],
    *,
    required: bool,
    optional: frozenset[str] = frozenset(),
) -> Part:
    """A parquet file of an artifact: a ParquetPart when the caller reads in batches (it gave the
    directory), else the frame, read from the bytes at hand; an empty frame when it is absent and may be."""
    if file not in files:
        if required:
            raise ArtifactInvalid("file missing", file=file)
        return pl.DataFrame(schema=table_schema(model))
    if directory is not None:
        return ParquetPart(Path(directory) / file, file, key_column, key, columns, len(files[file]), optional)
    frame = load_parquet(files, file, [c for c, _ in columns if c not in optional])
    frame = frame.select(
        pl.lit(key, pl.String).alias(key_column), *_columns(frame.columns, columns, optional)
    )
    return conform(frame, model, file)


def _columns(
    present: Sequence[str], columns: tuple[tuple[str, str], ...], optional: frozenset[str]
) -> list[pl.Expr]:
    """The file's columns renamed to the table's; an optional column the file lacks (written before the
    column existed) reads as null."""
    have = set(present)
    return [
        pl.col(c).alias(t) if c in have or c not in optional else pl.lit(None).alias(t) for c, t in columns
    ]


@dataclass
class ReadParts:
    """What `read_parquet_parts` read: each part's rows (or its problem) and, when every file was read in one
    call, the whole frame those rows are consecutive slices of (one chunk per file), so that a batch needs
    no concatenation or copy before validating and writing it."""

    results: list[pl.DataFrame | ArtifactInvalid]
    whole: pl.DataFrame | None = None


def read_parquet_parts(model: Model, parts: Sequence[ParquetPart]) -> ReadParts:
    """Each part's rows (or its problem), reading all the files in one polars call when they agree; when
    they do not (a missing column, a corrupt file, a bad value), file by file to find which one is wrong."""
    if (
        len(parts) > 1
        and len({(p.columns, p.optional) for p in parts}) == 1
        and len({p.path for p in parts}) == len(parts)
    ):
        try:
            return _read_together(model, parts)
        except (pl.exceptions.PolarsError, OSError, ArtifactInvalid, ValueError):
            pass
    out: list[pl.DataFrame | ArtifactInvalid] = []
    for part in parts:
        try:
            out.append(part.read(model))
        except ArtifactInvalid as exc:
            out.append(exc)
    return ReadParts(out)


def _read_together(model: Model, parts: Sequence[ParquetPart]) -> ReadParts:
    first = parts[0]
    paths = [str(p.path) for p in parts]
    # The first file's schema for all (a file that differs raises, and is then found file by file): polars
    # then skips inferring each file's schema, about a sixth of the read.
    schema = pl.read_parquet_schema(paths[0])
    wanted = [c for c, _ in first.columns if c in schema or c not in first.optional]
    combined = (
        pl.scan_parquet(paths, schema=schema, include_file_paths="_path").select(*wanted, "_path").collect()
    )
    runs = combined.get_column("_path").rle()
    files = runs.struct.field("value").to_list()
    counts = runs.struct.field("len").to_list()
    present = set(files)
    if files != [p for p in paths if p in present]:
        raise ValueError("rows did not come back in file order")
    # The key column by file index, not by mapping every row's path: no hashing of a million strings.
    key_of = {str(p.path): p.key for p in parts}
    keys = pl.Series(first.key_column, [key_of[f] for f in files], dtype=pl.String)
    combined = combined.select(
        keys.gather(np.repeat(np.arange(len(files)), counts)),
        *_columns(combined.columns, first.columns, first.optional),
    )
    # Not rechunked: the frame keeps one chunk per file (the writer's Parquet encoder and the checks take
    # chunks as they come); a copy of every request row into one chunk cost 0.2-0.4 CPU-s per million rows,
    # most of it the kernel's, faulting in fresh pages (docs/performance.md "Warehouse").
    combined = conform(combined, model, first.file)
    rows_of = dict(zip(files, counts, strict=True))
    out: list[pl.DataFrame | ArtifactInvalid] = []
    offset = 0
    for path in paths:
        n = rows_of.get(path, 0)
        out.append(combined.slice(offset, n))
        offset += n
    return ReadParts(out, combined)
