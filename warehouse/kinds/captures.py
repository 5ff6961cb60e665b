"""Greedy captures (captures/<capture_id>/: artifacts.documents.CaptureMeta and OUTPUT_SCHEMA rows) into
`captures` and `capture_outputs`. Capture ids are unique within a campaign only (`plain.r0`,
`plain.r0.again`, `plain.ctl1`), so captures are keyed `<campaign_id>/<capture_id>`."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pandera.polars as pa
import polars as pl
from pandera.api.polars.types import PolarsData

from artifacts import layout
from artifacts.documents import OUTPUT_SCHEMA, CaptureMeta, utc_datetime
from warehouse.errors import ArtifactInvalid
from warehouse.frames import Files, Part, canonical_json, conform, document, load_parquet, short_hash
from warehouse.kinds.base import ArtifactKind, ArtifactRef, directory_refs
from warehouse.models import Exact


class CaptureModel(pa.DataFrameModel):
    capture_key: pl.String = pa.Field(unique=True)
    capture_id: pl.String = pa.Field(str_length={"min_value": 1})
    campaign_id: pl.String = pa.Field(str_length={"min_value": 1})
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
    source_path: pl.String = pa.Field()
    sha256: pl.String = pa.Field(str_length={"min_value": 64, "max_value": 64})

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
    if meta.capture_id != capture_id:
        raise ArtifactInvalid(
            f"{meta.capture_id!r} does not match its directory ({capture_id!r})",
            file=layout.META,
            column="capture_id",
        )
    if meta.campaign_id is not None and meta.campaign_id != campaign_id:
        raise ArtifactInvalid(
            f"{meta.campaign_id!r} does not match its campaign directory ({campaign_id!r})",
            file=layout.META,
            column="campaign_id",
        )
    capture_key = f"{campaign_id}/{capture_id}"
    columns = list(OUTPUT_SCHEMA)
    outputs = load_parquet(files, layout.OUTPUTS, columns).select(
        pl.lit(capture_key, pl.String).alias("capture_key"), *[pl.col(c) for c in columns]
    )
    outputs = conform(outputs, CaptureOutputModel, layout.OUTPUTS)
    corpus = meta.corpus
    row = {
        "capture_key": capture_key,
        "capture_id": capture_id,
        "campaign_id": campaign_id,
        "deployment_id": meta.deployment_id,
        "variant": meta.variant_name,
        "corpus_file": corpus.file if corpus is not None else meta.corpus_file,
        "corpus_sha256": corpus.sha256 if corpus is not None else meta.corpus_sha256,
        "prompt_ids": [str(p) for p in meta.prompt_ids] if meta.prompt_ids is not None else None,
        "sampling": None if meta.sampling is None else canonical_json(meta.sampling),
        "sampling_key": None if meta.sampling is None else short_hash(meta.sampling),
        "engine_version": meta.deployment.engine_version if meta.deployment else None,
        "specgauge_version": meta.tool.specgauge_version if meta.tool else None,
        "git_revision": meta.tool.git_revision if meta.tool else None,
        "started_utc": utc_datetime(meta.started_utc),
        "ended_utc": utc_datetime(meta.ended_utc),
        "outputs": outputs.height,
        "outputs_ok": int(outputs.get_column("ok").cast(pl.Boolean, strict=False).fill_null(False).sum()),
        "source_path": source_path,
        "sha256": sha256,
    }
    return {"captures": [row], "capture_outputs": outputs}


def _discover(campaign_dir: Path, prefix: str) -> Iterator[ArtifactRef]:
    yield from directory_refs("capture", layout.captures_dir(campaign_dir), campaign_dir, prefix)


KIND = ArtifactKind(
    name="capture",
    table="captures",
    key_column="capture_key",
    discover=_discover,
    frames=lambda ref, files, sha: capture_frames(ref.source_path, ref.campaign_id, ref.name, files, sha),
    models={"captures": CaptureModel, "capture_outputs": CaptureOutputModel},
    sources={"captures": layout.META, "capture_outputs": layout.OUTPUTS},
)
