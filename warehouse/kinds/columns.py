"""The columns many artifact tables share, in one place: the sets their pandera models are framed with
(`main_table`) and the row values that fill them.

A main table (ArtifactKind.table: one row per artifact) opens, for an artifact placed in a campaign and keyed
`<campaign_id>/<id>`, with its key, its id and campaign_id, and ends with where it was read from and its
hash (Source). In between: the model's own columns, then the shared sets it names (RunTimes, Tool).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import pandera.polars as pa
import polars as pl
from pydantic import BaseModel

from artifacts.documents import ToolFacts

TableModel = TypeVar("TableModel", bound=type[pa.DataFrameModel])

SHA256_LENGTH = {"min_value": 64, "max_value": 64}
NON_EMPTY = {"min_value": 1}


class RunTimes(pa.DataFrameModel):
    """When the artifact's work ran."""

    started_utc: pl.Datetime = pa.Field(nullable=True)
    ended_utc: pl.Datetime = pa.Field(nullable=True)


class Tool(pa.DataFrameModel):
    """The specgauge that wrote the artifact (artifacts.documents.ToolFacts): `tool_columns`."""

    specgauge_version: pl.String = pa.Field(nullable=True)
    git_revision: pl.String = pa.Field(nullable=True)


class Source(pa.DataFrameModel):
    """Where the artifact was read from (relative to the raw root) and its hash (frames.artifact_sha256)."""

    source_path: pl.String = pa.Field()
    sha256: pl.String = pa.Field(str_length=SHA256_LENGTH)


def main_table(
    prefix: str | None = None, *, id_column: str | None = None, last: Sequence[type[pa.DataFrameModel]] = ()
) -> Callable[[TableModel], TableModel]:
    """Class decorator: the model of an artifact's main table, its own columns framed by the shared ones.

    With `prefix` (an artifact placed in a campaign, keyed `<campaign_id>/<id>`) it opens with
    `<prefix>_key` (unique), `id_column` (default `<prefix>_id`) and campaign_id, both non-empty; after its
    own columns come the sets of `last` in order, then Source. The model's checks and Config are its own.
    The order is the table's: pandera checks, and the ingest reports a first failure, in it."""

    def frame(own: TableModel) -> TableModel:
        opening = () if prefix is None else (_placed(f"{prefix}_key", id_column or f"{prefix}_id"),)
        # pandera collects columns base class first, along the reversed method resolution order: listing
        # the bases last-first puts the opening first and Source last.
        bases = (Source, *reversed(last), own, *opening)
        namespace = {
            "__module__": own.__module__,
            "__qualname__": own.__qualname__,
            "__doc__": own.__doc__,
            "Config": own.Config,  # its own: its options and the schema name pandera gives it
        }
        return type(own.__name__, bases, namespace)  # type: ignore[return-value]

    return frame


def _placed(key_column: str, id_column: str) -> type[pa.DataFrameModel]:
    """The opening columns of a placed artifact's main table."""
    namespace: dict[str, Any] = {
        "__module__": __name__,
        "__annotations__": {key_column: pl.String, id_column: pl.String, "campaign_id": pl.String},
        key_column: pa.Field(unique=True),
        id_column: pa.Field(str_length=NON_EMPTY),
        "campaign_id": pa.Field(str_length=NON_EMPTY),
    }
    return type(f"Placed_{key_column}", (pa.DataFrameModel,), namespace)


# ------------------------------------------------------------------------------------------------- row values


def placed_columns(
    prefix: str, campaign_id: str, artifact_id: str, id_column: str | None = None
) -> dict[str, str]:
    """The opening values of a placed artifact's main-table row (main_table's `prefix`)."""
    return {
        f"{prefix}_key": f"{campaign_id}/{artifact_id}",
        id_column or f"{prefix}_id": artifact_id,
        "campaign_id": campaign_id,
    }


def optional_fields(part: BaseModel | None, *names: str) -> dict[str, Any]:
    """The named fields of an optional part of a document, as columns of the same names: null when the part
    is absent."""
    return {name: getattr(part, name) if part is not None else None for name in names}


def tool_columns(tool: ToolFacts | None) -> dict[str, Any]:
    """The Tool columns of a document's `tool`."""
    return optional_fields(tool, "specgauge_version", "git_revision")


def source_columns(source_path: str, sha256: str) -> dict[str, str]:
    """The Source columns."""
    return {"source_path": source_path, "sha256": sha256}
