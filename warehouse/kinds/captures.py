"""Greedy captures (captures/<capture_id>/: artifacts.documents.CaptureMeta and OUTPUT_SCHEMA rows) into
`captures` and `capture_outputs`. Capture ids are unique within a campaign only (`plain.r0`,
`plain.r0.again`, `plain.ctl1`), so captures are keyed `<campaign_id>/<capture_id>`."""

from __future__ import annotations

import pandera.polars as pa
import polars as pl
from pandera.api.polars.types import PolarsData

from artifacts import layout
from artifacts.documents import OUTPUT_SCHEMA, CaptureMeta, utc_datetime
from warehouse.frames import Files, Part, canonical_json, conform, document, load_parquet, short_hash
from warehouse.kinds.base import check_place, directory_kind, placed
from warehouse.kinds.columns import main_table, placed_columns, source_columns, tool_columns
from warehouse.models import Exact


@main_table("capture")
class CaptureModel(pa.DataFrameModel):
    deployment_id: pl.String = pa.Field(nullable=True)
    variant: pl.String = pa.Field(nullable=True)
    corpus_file: pl.String = pa.Field(nullable=True)
    corpus_sha256: pl.String = pa.Field(nullable=True)
    prompt_ids: pl.List(pl.String) = pa.Field(nullable=True)
    sampling: pl.String = pa.Field(nullable=True)
    sampling_key: pl.String = pa.Field(nullable=True)
    engine_version: pl.String = pa.Field(nullable=True)
    specgauge_version: pl.String = pa.Field(nullable=True)
    git_revision: pl.String = pa.Field(nullable=True)
    started_utc: pl.Datetime = pa.Field(nullable=True)
    ended_utc: pl.Datetime = pa.Field(nullable=True)
    outputs: pl.Int32 = pa.Field(ge=0)
    outputs_ok: pl.Int32 = pa.Field(ge=0)

    Config = Exact


class CaptureOutputModel(pa.DataFrameModel):
    """outputs.parquet of a greedy capture (artifacts.documents.OUTPUT_SCHEMA), one row per prompt."""

    capture_key: pl.String = pa.Field()
    prompt_id: pl.String = pa.Field()
    workload: pl.String = pa.Field(nullable=True)
    ok: pl.Boolean = pa.Field()
    error: pl.String = pa.Field(nullable=True)
    text: pl.String = pa.Field(nullable=True)
    token_ids: pl.List(pl.Int64) = pa.Field(nullable=True)
    finish_reason: pl.String = pa.Field(nullable=True)
    prompt_tokens: pl.Int64 = pa.Field(nullable=True, ge=0)
    completion_tokens: pl.Int64 = pa.Field(nullable=True, ge=0)

    @pa.dataframe_check(error="prompt_id: each prompt appears once per capture")
    def one_output_per_prompt(cls, data: PolarsData) -> pl.LazyFrame:
        return data.lazyframe.select(~pl.struct("capture_key", "prompt_id").is_duplicated())

    @pa.dataframe_check(error="error: a failed output must say why")
    def failed_say_why(cls, data: PolarsData) -> pl.LazyFrame:
        return data.lazyframe.select(pl.col("ok") | pl.col("error").is_not_null())

    Config = Exact


def capture_frames(
    source_path: str, campaign_id: str, capture_id: str, files: Files, sha256: str
) -> dict[str, Part]:
    meta = document(files, layout.META, CaptureMeta)
    check_place(layout.META, meta, "its directory", capture_id=capture_id)
    if meta.campaign_id is not None:  # a capture need not name its campaign
        check_place(layout.META, meta, "its campaign directory", campaign_id=campaign_id)
    capture_key = f"{campaign_id}/{capture_id}"
    columns = list(OUTPUT_SCHEMA)
    outputs = load_parquet(files, layout.OUTPUTS, columns).select(
        pl.lit(capture_key, pl.String).alias("capture_key"), *[pl.col(c) for c in columns]
    )
    outputs = conform(outputs, CaptureOutputModel, layout.OUTPUTS)
    corpus = meta.corpus
    row = {
        **placed_columns("capture", campaign_id, capture_id),
        "deployment_id": meta.deployment_id,
        "variant": meta.variant_name,
        "corpus_file": corpus.file if corpus is not None else meta.corpus_file,
        "corpus_sha256": corpus.sha256 if corpus is not None else meta.corpus_sha256,
        "prompt_ids": [str(p) for p in meta.prompt_ids] if meta.prompt_ids is not None else None,
        "sampling": None if meta.sampling is None else canonical_json(meta.sampling),
        "sampling_key": None if meta.sampling is None else short_hash(meta.sampling),
        "engine_version": meta.deployment.engine_version if meta.deployment else None,
        **tool_columns(meta.tool),
        "started_utc": utc_datetime(meta.started_utc),
        "ended_utc": utc_datetime(meta.ended_utc),
        "outputs": outputs.height,
        "outputs_ok": int(outputs.get_column("ok").cast(pl.Boolean, strict=False).fill_null(False).sum()),
        **source_columns(source_path, sha256),
    }
    return {"captures": [row], "capture_outputs": outputs}


KIND = directory_kind(
    name="capture",
    table="captures",
    key_column="capture_key",
    folder=layout.captures_dir,
    frames=placed(capture_frames),
    models={"captures": CaptureModel, "capture_outputs": CaptureOutputModel},
    sources={"captures": layout.META, "capture_outputs": layout.OUTPUTS},
)
