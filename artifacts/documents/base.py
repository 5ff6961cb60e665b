"""What every document model shares: the value types, the `Document` and `Configuration` bases, and the
warehouse's column marks (`Column`, `Columns`, read by `stored_columns` and `StoredReader`).

Value types say what JSON value a field takes; they are strict (a value of another type is refused, not
converted; TYPE_ERRORS gives the words a reader gets): `Number` (an int or a float, taken as a float), `Whole`
(an int), `Text`, `Flag` (true/false), `Time` (ISO-8601 text, kept as written). Value *ranges* (a share
within 0..1) are the warehouse's checks: a field that the warehouse stores as a column carries a `Column`
(its name, type and checks there), and a block whose fields are columns carries `Columns` (the prefix of
their names). The cell summary's columns are all derived that way (`stored_columns`, `StoredReader`): a new
summary figure is one field on CellSummary (artifacts/documents/cells.py), one migration adding its column,
one line in the view that shows it (docs/design.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated, Any, get_args, get_origin

import polars as pl
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    model_serializer,
)
from pydantic_core import PydanticCustomError

from specgauge.redact import redact_data

# ---------------------------------------------------------------------------------------------- value types


def _time(value: str) -> str:
    try:
        datetime.fromisoformat(value)
    except ValueError:
        raise PydanticCustomError("time", "not an ISO-8601 time: {value}", {"value": repr(value)}) from None
    return value


def _integral(value: Any) -> Any:
    """Counts read from Prometheus text are floats (63.0), and summaries written before the contract kept
    them so: a float with no fraction is that whole number; 63.5 is still refused."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


# Strict: a JSON value of another type is refused, never converted ("3" is not a number, 1 not true).
Number = Annotated[float, Field(strict=True)]  # an int is taken, as a float
Whole = Annotated[int, Field(strict=True), BeforeValidator(_integral)]
Text = Annotated[str, Field(strict=True)]
Flag = Annotated[bool, Field(strict=True)]
Time = Annotated[str, Field(strict=True), AfterValidator(_time)]

# What a reader is told when a value has the wrong type (pydantic's error type -> words).
TYPE_ERRORS = {
    "float_type": "expected a number",
    "int_type": "expected a whole number",
    "string_type": "expected a string",
    "bool_type": "expected true/false",
    "dict_type": "expected an object",
    "model_type": "expected an object",
    "model_attributes_type": "expected an object",
    "list_type": "expected a list",
}


def utc_datetime(value: str | None) -> datetime | None:
    """A `Time` as naive UTC ('...Z' or any offset), as the warehouse stores times."""
    if value is None:
        return None
    parsed = datetime.fromisoformat(value)
    if parsed.tzinfo is not None:
        parsed = parsed.astimezone(UTC).replace(tzinfo=None)
    return parsed


class Document(BaseModel):
    """A raw JSON document or one of its blocks."""

    model_config = ConfigDict(
        extra="allow", defer_build=True
    )  # schemas built on first use: imports stay quick

    def as_written(self) -> dict[str, Any]:
        """The fields the document had (as read or as built), extras included: what hashes and canonical
        JSON of a block are computed from, so that fields a reader merely declares change nothing."""
        return self.model_dump(mode="json", exclude_unset=True)


class Configuration(Document):
    """A document, or block, of configuration (a spec, a variant, an engine command, a deployment, a run): its
    JSON form (every dump: the file written, the warehouse's columns, hashes of it) passes through
    specgauge.redact, so URL passwords, secret env values and flags, and SecretStr never leave the process. A
    document read from an older file is redacted again when dumped. Measurement documents (summaries,
    requests, outputs) are not: a corpus may hold the text "password=...". The run keeps the real values in
    memory (experiments.spec, tasks.launch.base.Deployment): only what is written is redacted."""

    @model_serializer(mode="wrap")
    def _redacted(self, handler: SerializerFunctionWrapHandler) -> Any:
        return redact_data(handler(self))


# ------------------------------------------------------------------------------------ warehouse columns


@dataclass(frozen=True)
class Column:
    """The warehouse stores this field as a column of the table its document fills.

    `name`: the column (default: the field's name), after the prefix of the blocks around it unless
    `prefixed` is False. `dtype`: its polars type (default from the field: Number Float64, Whole Int32,
    Flag Boolean, Text String; `json`: an object kept as canonical JSON text). The rest are its checks
    (pandera's ge, gt, le, isin; `nullable`)."""

    name: str | None = None
    dtype: Any = None
    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    isin: tuple[str, ...] | None = None
    nullable: bool = True
    prefixed: bool = True
    json: bool = False


@dataclass(frozen=True)
class Columns:
    """This block's `Column` fields are columns too, named `<prefix><column name>`."""

    prefix: str = ""


@dataclass(frozen=True)
class StoredColumn:
    path: tuple[str, ...]  # field names from the document's root
    name: str
    dtype: Any
    column: Column


def _dtype(annotation: Any, column: Column) -> Any:
    if column.dtype is not None:
        return column.dtype
    if column.json:
        return pl.String
    inner = [a for a in get_args(annotation) if a is not type(None)] or [annotation]
    kind = inner[0]
    if get_origin(kind) is Annotated:
        kind = get_args(kind)[0]
    if kind is bool:
        return pl.Boolean
    if kind is int:
        return pl.Int32
    if kind is str:
        return pl.String
    return pl.Float64  # Number


def _model_of(annotation: Any) -> type[BaseModel] | None:
    for candidate in (annotation, *get_args(annotation)):
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return candidate
    return None


def stored_columns(
    model: type[BaseModel], prefix: str = "", path: tuple[str, ...] = ()
) -> list[StoredColumn]:
    """Every `Column` field of `model`, through its `Columns` blocks, in declaration order."""
    out: list[StoredColumn] = []
    for name, info in model.model_fields.items():
        marks = info.metadata
        column = next((m for m in marks if isinstance(m, Column)), None)
        block = next((m for m in marks if isinstance(m, Columns)), None)
        if column is not None:
            label = column.name or name
            full = f"{prefix}{label}" if column.prefixed else label
            out.append(StoredColumn((*path, name), full, _dtype(info.annotation, column), column))
        elif block is not None:
            inner = _model_of(info.annotation)
            assert inner is not None, f"{model.__name__}.{name}: Columns on a field that is not a block"
            out += stored_columns(inner, prefix + block.prefix, (*path, name))
    return out


class StoredReader:
    """The stored columns of a document model, read from its instances: {column name: value}, null where a
    block on the way is null. Blocks are looked up once per document, then their fields by name."""

    def __init__(self, model: type[BaseModel]) -> None:
        self.columns = stored_columns(model)
        blocks: dict[tuple[str, ...], list[tuple[str, str]]] = {}
        for column in self.columns:
            blocks.setdefault(column.path[:-1], []).append((column.name, column.path[-1]))
        self._blocks = list(blocks.items())

    def __call__(self, document: BaseModel) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for path, fields in self._blocks:
            node: Any = document
            for part in path:
                node = getattr(node, part) if node is not None else None
            if node is None:
                out.update((name, None) for name, _ in fields)
            else:
                out.update((name, getattr(node, field)) for name, field in fields)
        return out
