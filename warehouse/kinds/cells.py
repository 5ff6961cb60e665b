"""Cell attempts (cells/<cell_id>.a<n>/: artifacts.documents.CellMeta, CellSummary, REQUEST_SCHEMA and
GAUGE_SCHEMA files) into `cells`, `requests`, `gauges`, `spec_decode` and `spec_decode_positions`.

The `cells` row is the meta's facts (below) and every summary field marked as a column in CellSummary
(artifacts.documents.Column), so a new summary figure reaches the table without a change here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandera.polars as pa
import polars as pl
from pandera.api.polars.types import PolarsData

from artifacts import ids, layout
from artifacts.documents import (
    ERROR_CLASSES,
    GAUGE_SCHEMA,
    REQUEST_OPTIONAL_COLUMNS,
    REQUEST_SCHEMA,
    CellMeta,
    CellSummary,
    Speculation,
    StoredReader,
    utc_datetime,
)
from warehouse.errors import ArtifactInvalid
from warehouse.frames import Files, Part, canonical_json, document, parquet_part, short_hash
from warehouse.kinds.base import check_place, directory_kind
from warehouse.kinds.columns import main_table, source_columns, tool_columns
from warehouse.kinds.deployments import settings_of
from warehouse.models import METHODS, Exact, with_columns

LOAD_MODES = ["closed", "open"]
SUMMARY = StoredReader(CellSummary)  # the summary's fields that are cells columns
_JSON_COLUMNS = [c.name for c in SUMMARY.columns if c.column.json]
_NonNegative = {"nullable": True, "ge": 0}


def _ok_implies(column: str) -> pl.Expr:
    return ~pl.col("ok") | pl.col(column).is_not_null()


@main_table()
class CellFacts(pa.DataFrameModel):
    """The cells columns that come from meta.json (and the artifact's place and hash); CellModel adds the
    summary's."""

    cell_key: pl.String = pa.Field(unique=True)
    campaign_id: pl.String = pa.Field(str_length={"min_value": 1})
    cell_id: pl.String = pa.Field(str_length={"min_value": 1})
    attempt: pl.Int32 = pa.Field(ge=1)
    deployment_id: pl.String = pa.Field(str_length={"min_value": 1})
    variant: pl.String = pa.Field(str_length={"min_value": 1})
    method: pl.String = pa.Field(isin=METHODS)
    k: pl.Int32 = pa.Field(nullable=True, gt=0)
    variant_config: pl.String = pa.Field(nullable=True)
    repeat: pl.Int32 = pa.Field(ge=0)
    workload: pl.String = pa.Field(str_length={"min_value": 1})
    workload_file: pl.String = pa.Field(nullable=True)
    workload_sha256: pl.String = pa.Field(nullable=True)
    prompt_ids: pl.List(pl.String) = pa.Field(nullable=True)
    load_label: pl.String = pa.Field(str_length={"min_value": 1})
    load_mode: pl.String = pa.Field(isin=LOAD_MODES)
    concurrency: pl.Int32 = pa.Field(nullable=True, gt=0)
    rate: pl.Float64 = pa.Field(nullable=True, gt=0)
    arrival: pl.String = pa.Field(nullable=True)
    requests_planned: pl.Int32 = pa.Field(nullable=True, ge=0)
    warmup: pl.Int32 = pa.Field(nullable=True, ge=0)
    time_cap_s: pl.Float64 = pa.Field(nullable=True, gt=0)
    request_timeout_s: pl.Float64 = pa.Field(nullable=True, gt=0)
    load_workers: pl.Int32 = pa.Field(nullable=True, gt=0)
    endpoint: pl.String = pa.Field(nullable=True, isin=["chat", "completions"])
    sampling: pl.String = pa.Field(nullable=True)
    sampling_key: pl.String = pa.Field()
    temperature: pl.Float64 = pa.Field(nullable=True, ge=0)
    max_tokens: pl.Int32 = pa.Field(nullable=True, gt=0)
    engine_settings: pl.String = pa.Field(nullable=True)
    engine_key: pl.String = pa.Field()
    engine_version: pl.String = pa.Field(nullable=True)
    kv_cache_tokens: pl.Int64 = pa.Field(nullable=True, gt=0)
    drafter_sha256: pl.String = pa.Field(nullable=True, str_length={"min_value": 64, "max_value": 64})
    launcher: pl.String = pa.Field(nullable=True)
    job_id: pl.String = pa.Field(nullable=True)
    specgauge_version: pl.String = pa.Field(nullable=True)
    git_revision: pl.String = pa.Field(nullable=True)
    hostname: pl.String = pa.Field(nullable=True)
    t0_utc: pl.Datetime = pa.Field(nullable=True)
    started_utc: pl.Datetime = pa.Field(nullable=True)
    ended_utc: pl.Datetime = pa.Field(nullable=True)
    capped: pl.Boolean = pa.Field(nullable=True)

    @pa.dataframe_check(error="load_mode: a closed-loop cell needs concurrency, an open-loop cell a rate")
    def load_has_its_parameter(cls, data: PolarsData) -> pl.LazyFrame:
        return data.lazyframe.select(
            pl.when(pl.col("load_mode") == "closed")
            .then(pl.col("concurrency").is_not_null())
            .otherwise(pl.col("rate").is_not_null())
        )

    @pa.dataframe_check(error="requests_total: must equal requests_ok + requests_failed")
    def request_counts_add_up(cls, data: PolarsData) -> pl.LazyFrame:
        return data.lazyframe.select(
            pl.col("requests_total").is_null()
            | (pl.col("requests_total") == pl.col("requests_ok") + pl.col("requests_failed"))
        )

    @pa.dataframe_check(error="wall_s: an ok cell needs wall_s and its request counts")
    def ok_cell_has_figures(cls, data: PolarsData) -> pl.LazyFrame:
        return data.lazyframe.select(
            (pl.col("status") != "ok")
            | (pl.col("wall_s").is_not_null() & pl.col("requests_total").is_not_null())
        )

    @pa.dataframe_check(error="method: a speculative variant needs k, plain must not have one")
    def method_and_k(cls, data: PolarsData) -> pl.LazyFrame:
        return data.lazyframe.select((pl.col("method") == "none") == pl.col("k").is_null())

    Config = Exact


# One row per cell attempt: meta.json's facts and every summary.json field that is a Column.
CellModel = with_columns(CellFacts, "CellModel", SUMMARY.columns)


class RequestModel(pa.DataFrameModel):
    """requests.parquet (artifacts.documents.REQUEST_SCHEMA), `index` renamed request_index."""

    cell_key: pl.String = pa.Field()
    request_index: pl.Int32 = pa.Field(ge=0)
    prompt_id: pl.String = pa.Field()
    workload: pl.String = pa.Field()
    phase: pl.String = pa.Field(isin=["warmup", "measured"])
    endpoint: pl.String = pa.Field(isin=["chat", "completions"])
    queued_s: pl.Float64 = pa.Field(ge=0)
    scheduled_s: pl.Float64 = pa.Field(**_NonNegative)
    sent_s: pl.Float64 = pa.Field(**_NonNegative)
    first_token_s: pl.Float64 = pa.Field(**_NonNegative)
    last_token_s: pl.Float64 = pa.Field(**_NonNegative)
    ended_s: pl.Float64 = pa.Field(**_NonNegative)
    client_queue_s: pl.Float64 = pa.Field(**_NonNegative)
    ttft_s: pl.Float64 = pa.Field(**_NonNegative)
    e2e_s: pl.Float64 = pa.Field(**_NonNegative)
    tpot_s: pl.Float64 = pa.Field(**_NonNegative)
    prompt_tokens: pl.Int64 = pa.Field(**_NonNegative)
    completion_tokens: pl.Int64 = pa.Field(**_NonNegative)
    chunks: pl.Int32 = pa.Field(ge=0)
    chunk_offsets_s: pl.List(pl.Float64) = pa.Field(nullable=True)
    chunk_tokens: pl.List(pl.Int32) = pa.Field(nullable=True)
    tokens_exact: pl.Boolean = pa.Field(nullable=True)
    finish_reason: pl.String = pa.Field(nullable=True)
    http_status: pl.Int32 = pa.Field(nullable=True, ge=100, le=599)
    ok: pl.Boolean = pa.Field()
    error_class: pl.String = pa.Field(nullable=True, isin=list(ERROR_CLASSES))
    error: pl.String = pa.Field(nullable=True)
    token_ids: pl.List(pl.Int64) = pa.Field(nullable=True)
    text: pl.String = pa.Field(nullable=True)
    spec_steps: pl.Int64 = pa.Field(**_NonNegative)
    spec_draft_tokens: pl.Int64 = pa.Field(**_NonNegative)
    spec_accepted_tokens: pl.Int64 = pa.Field(**_NonNegative)
    spec_acceptance_histogram: pl.List(pl.Int64) = pa.Field(nullable=True)

    @pa.dataframe_check(error="spec_accepted_tokens: must not exceed spec_draft_tokens")
    def accepted_within_drafts(cls, data: PolarsData) -> pl.LazyFrame:
        return data.lazyframe.select(
            (pl.col("spec_accepted_tokens") <= pl.col("spec_draft_tokens")).fill_null(True)
        )

    @pa.dataframe_check(error="request_index: each request index appears once per cell")
    def unique_index(cls, data: PolarsData) -> pl.LazyFrame:
        return data.lazyframe.select(~pl.struct("cell_key", "request_index").is_duplicated())

    @pa.dataframe_check(error="completion_tokens: an ok request needs completion_tokens (from usage)")
    def ok_have_usage(cls, data: PolarsData) -> pl.LazyFrame:
        return data.lazyframe.select(_ok_implies("completion_tokens"))

    @pa.dataframe_check(error="ttft_s: must not exceed e2e_s")
    def ttft_within_e2e(cls, data: PolarsData) -> pl.LazyFrame:
        return data.lazyframe.select(
            (pl.col("ttft_s") <= pl.col("e2e_s") + 1e-9).fill_null(True)  # null: not both measured
        )

    @pa.dataframe_check(error="chunk_offsets_s: one offset per token-bearing chunk (length == chunks)")
    def offsets_per_chunk(cls, data: PolarsData) -> pl.LazyFrame:
        return data.lazyframe.select(
            pl.col("chunk_offsets_s").is_null() | (pl.col("chunk_offsets_s").list.len() == pl.col("chunks"))
        )

    Config = Exact


class GaugeModel(pa.DataFrameModel):
    """gauges.parquet (artifacts.documents.GAUGE_SCHEMA): engine gauges sampled during the cell."""

    cell_key: pl.String = pa.Field()
    t_s: pl.Float64 = pa.Field(ge=0)
    kv_cache_usage: pl.Float64 = pa.Field(nullable=True, ge=0, le=1)
    running: pl.Int64 = pa.Field(**_NonNegative)
    waiting: pl.Int64 = pa.Field(**_NonNegative)
    preemptions_total: pl.Int64 = pa.Field(**_NonNegative)

    Config = Exact


class SpecDecodeModel(pa.DataFrameModel):
    """summary.json's speculation block (counter deltas over the measured window)."""

    cell_key: pl.String = pa.Field(unique=True)
    drafts: pl.Int64 = pa.Field(**_NonNegative)
    draft_tokens: pl.Int64 = pa.Field(**_NonNegative)
    accepted_tokens: pl.Int64 = pa.Field(**_NonNegative)
    acceptance_rate: pl.Float64 = pa.Field(nullable=True, ge=0, le=1)
    mean_acceptance_length: pl.Float64 = pa.Field(nullable=True, ge=1)
    decode_steps: pl.Int64 = pa.Field(**_NonNegative)
    inferred_step_time_s: pl.Float64 = pa.Field(**_NonNegative)

    @pa.dataframe_check(error="accepted_tokens: cannot exceed draft_tokens")
    def accepted_within_drafted(cls, data: PolarsData) -> pl.LazyFrame:
        return data.lazyframe.select((pl.col("accepted_tokens") <= pl.col("draft_tokens")).fill_null(True))

    Config = Exact


class SpecDecodePositionModel(pa.DataFrameModel):
    cell_key: pl.String = pa.Field()
    position: pl.Int32 = pa.Field(ge=0)
    acceptance_rate: pl.Float64 = pa.Field(nullable=True, ge=0, le=1)

    @pa.dataframe_check(error="position: each draft position appears once per cell")
    def unique_position(cls, data: PolarsData) -> pl.LazyFrame:
        return data.lazyframe.select(~pl.struct("cell_key", "position").is_duplicated())

    Config = Exact


MODELS: dict[str, type[pa.DataFrameModel]] = {
    "cells": CellModel,
    "requests": RequestModel,
    "gauges": GaugeModel,
    "spec_decode": SpecDecodeModel,
    "spec_decode_positions": SpecDecodePositionModel,
}
_REQUEST_COLUMNS = tuple(
    (c, "request_index" if c == "index" else c) for c in REQUEST_SCHEMA
)  # the file's `index` is the table's request_index
_GAUGE_COLUMNS = tuple((c, c) for c in GAUGE_SCHEMA)


def cell_frames(
    source_path: str,
    campaign_id: str,
    dir_name: str,
    files: Files,
    sha256: str,
    directory: Path | None = None,
) -> dict[str, Part]:
    """A cell attempt's rows. With `directory`, its parquet files come back as ParquetParts (read later,
    together with the batch's); without, as frames read from `files`."""
    parsed = ids.parse_attempt_name(dir_name)
    if parsed is None:
        raise ArtifactInvalid(f"{dir_name!r} is not a cell directory name (<cell_id>.a<attempt>)")
    cell_id, attempt = parsed
    cell_key = f"{campaign_id}/{dir_name}"
    meta = document(files, layout.META, CellMeta)
    summary = document(files, layout.SUMMARY, CellSummary)
    check_place(layout.META, meta, "the directory", cell_id=cell_id, attempt=attempt, campaign_id=campaign_id)
    variant, load, engine, sampling = meta.variant, meta.load, meta.deployment, meta.sampling
    settings = settings_of(engine, variant)
    sampling_written = sampling.as_written() if sampling is not None else {}
    row: dict[str, Any] = {
        "cell_key": cell_key,
        "campaign_id": campaign_id,
        "cell_id": cell_id,
        "attempt": attempt,
        "deployment_id": meta.deployment_id,
        "variant": variant.name,
        "method": variant.method or "none",
        "k": variant.k,
        "variant_config": canonical_json(variant),
        "repeat": meta.repeat,
        "workload": meta.workload.stratum,
        "workload_file": meta.workload.file,
        "workload_sha256": meta.workload.sha256,
        "prompt_ids": [str(p) for p in meta.workload.prompt_ids]
        if meta.workload.prompt_ids is not None
        else None,
        "load_label": ids.load_label(load.mode, load.concurrency, load.rate),
        "load_mode": load.mode,
        "concurrency": load.concurrency,
        "rate": load.rate,
        "arrival": load.arrival,
        "requests_planned": load.requests,
        "warmup": load.warmup,
        "time_cap_s": load.time_cap_s,
        "request_timeout_s": load.request_timeout_s,
        "load_workers": load.workers,
        "endpoint": meta.endpoint,
        "sampling": canonical_json(sampling_written),
        "sampling_key": short_hash(sampling_written),
        "temperature": sampling.temperature if sampling else None,
        "max_tokens": sampling.max_tokens if sampling else None,
        "engine_settings": canonical_json(settings),
        "engine_key": short_hash(settings),
        "engine_version": engine.engine_version if engine else None,
        "kv_cache_tokens": engine.kv_cache_tokens if engine else None,
        "drafter_sha256": engine.drafter.sha256 if engine and engine.drafter else None,
        "launcher": engine.launcher if engine else None,
        "job_id": None if engine is None or engine.job_id is None else str(engine.job_id),
        **tool_columns(meta.tool),
        "hostname": meta.host.hostname if meta.host else None,
        "t0_utc": utc_datetime(meta.t0_utc),
        "started_utc": utc_datetime(meta.started_utc),
        "ended_utc": utc_datetime(meta.ended_utc),
        "capped": meta.capped,
        **source_columns(source_path, sha256),
    }
    row |= SUMMARY(summary)
    for name in _JSON_COLUMNS:
        row[name] = None if row[name] is None else canonical_json(row[name])

    frames: dict[str, Part] = {"cells": [row]}
    needs_tables = summary.status == "ok"  # a failed cell may have stopped before writing them
    frames["requests"] = parquet_part(
        files,
        directory,
        layout.REQUESTS,
        RequestModel,
        "cell_key",
        cell_key,
        _REQUEST_COLUMNS,
        required=needs_tables,
        optional=REQUEST_OPTIONAL_COLUMNS,
    )
    frames["gauges"] = parquet_part(
        files,
        directory,
        layout.GAUGES,
        GaugeModel,
        "cell_key",
        cell_key,
        _GAUGE_COLUMNS,
        required=needs_tables,
    )
    if summary.speculation is not None:
        frames |= _speculation(summary.speculation, cell_key)
    return frames


def _speculation(spec: Speculation, cell_key: str) -> dict[str, Part]:
    row = {
        "cell_key": cell_key,
        "drafts": spec.drafts,
        "draft_tokens": spec.draft_tokens,
        "accepted_tokens": spec.accepted_tokens,
        "acceptance_rate": spec.acceptance_rate,
        "mean_acceptance_length": spec.mean_acceptance_length,
        "decode_steps": spec.decode_steps,
        "inferred_step_time_s": spec.inferred_step_time_s,
    }
    positions = []
    for key, rate in (spec.acceptance_rate_per_position or {}).items():
        if not str(key).isdigit():
            raise ArtifactInvalid(
                f"position {key!r} is not a whole number",
                file=layout.SUMMARY,
                column="speculation.acceptance_rate_per_position",
            )
        positions.append({"cell_key": cell_key, "position": int(key), "acceptance_rate": rate})
    return {
        "spec_decode": [row],
        "spec_decode_positions": sorted(positions, key=lambda p: p["position"]),
    }


KIND = directory_kind(
    name="cell",
    table="cells",
    key_column="cell_key",
    folder=layout.cells_dir,
    frames=lambda ref, files, sha: cell_frames(
        ref.source_path, ref.campaign_id, ref.name, files, sha, directory=ref.path
    ),
    models=MODELS,
    sources={
        "cells": f"{layout.META}/{layout.SUMMARY}",
        "requests": layout.REQUESTS,
        "gauges": layout.GAUGES,
        "spec_decode": layout.SUMMARY,
        "spec_decode_positions": layout.SUMMARY,
    },
    parted=("requests", "gauges"),
)
