"""Capacity searches (capacity/<search_id>.json: artifacts.documents.CapacitySearchDocument, written once by
tasks.capacity.search_deployment) into `capacity_searches`, one row per search, and `capacity_points`, one row
per point in the order it ran (migration 0006). Each point is also a cell, in `cells`, by its cell_id."""

from __future__ import annotations

from typing import Any

import pandera.polars as pa
import polars as pl

from artifacts import layout
from artifacts.documents import CapacitySearchDocument, utc_datetime
from warehouse.frames import Files, canonical_json, to_frame
from warehouse.kinds.base import file_document, file_kind, placed
from warehouse.kinds.columns import RunTimes, Tool, main_table, placed_columns, source_columns, tool_columns
from warehouse.models import Strict

VERDICTS = ["met", "violated", "undecided"]


@main_table("search", last=(RunTimes, Tool))
class CapacitySearchModel(pa.DataFrameModel):
    deployment_id: pl.String = pa.Field(str_length={"min_value": 1})
    variant: pl.String = pa.Field(str_length={"min_value": 1})
    method: pl.String = pa.Field()
    k: pl.Int32 = pa.Field(nullable=True)
    variant_config: pl.String = pa.Field()
    repeat: pl.Int32 = pa.Field(ge=0)
    workload: pl.String = pa.Field()
    workload_sha256: pl.String = pa.Field(nullable=True)
    sampling: pl.String = pa.Field(nullable=True)
    quantile: pl.Float64 = pa.Field(gt=0, lt=1)
    confidence: pl.Float64 = pa.Field(gt=0, lt=1)
    ttft_limit_s: pl.Float64 = pa.Field(gt=0)
    tpot_limit_s: pl.Float64 = pa.Field(gt=0)
    requests_per_point: pl.Int32 = pa.Field(gt=0)
    capacity_rps: pl.Float64 = pa.Field(nullable=True, gt=0)
    first_failing_rps: pl.Float64 = pa.Field(nullable=True, gt=0)
    converged: pl.Boolean = pa.Field()
    stopped_because: pl.String = pa.Field()
    n_points: pl.Int32 = pa.Field(ge=0)
    settings: pl.String = pa.Field()

    @pa.dataframe_check(error="capacity_rps: the capacity lies below the first failing rate")
    def capacity_below_failure(cls, data: Any) -> pl.LazyFrame:
        return data.lazyframe.select(
            pl.col("capacity_rps").is_null()
            | pl.col("first_failing_rps").is_null()
            | (pl.col("capacity_rps") < pl.col("first_failing_rps"))
        )

    Config = Strict


class CapacityPointModel(pa.DataFrameModel):
    search_key: pl.String = pa.Field()
    point_index: pl.Int32 = pa.Field(ge=0)
    rate_rps: pl.Float64 = pa.Field(gt=0)
    cell_id: pl.String = pa.Field(str_length={"min_value": 1})
    requests: pl.Int32 = pa.Field(ge=0)
    failed: pl.Int32 = pa.Field(ge=0)
    achieved_rps: pl.Float64 = pa.Field(nullable=True, ge=0)
    goodput_rps: pl.Float64 = pa.Field(nullable=True, ge=0)
    ttft_p_s: pl.Float64 = pa.Field(nullable=True, ge=0)
    ttft_lower_s: pl.Float64 = pa.Field(nullable=True, ge=0)
    ttft_upper_s: pl.Float64 = pa.Field(nullable=True, ge=0)
    ttft_verdict: pl.String = pa.Field(isin=VERDICTS)
    tpot_p_s: pl.Float64 = pa.Field(nullable=True, ge=0)
    tpot_lower_s: pl.Float64 = pa.Field(nullable=True, ge=0)
    tpot_upper_s: pl.Float64 = pa.Field(nullable=True, ge=0)
    tpot_verdict: pl.String = pa.Field(isin=VERDICTS)
    status: pl.String = pa.Field()
    verdict: pl.String = pa.Field(isin=VERDICTS)

    Config = Strict


def search_frames(
    source_path: str, campaign_id: str, search_id: str, files: Files, sha256: str
) -> dict[str, pl.DataFrame]:
    """One search file as its capacity_searches row and capacity_points rows (pure: no database)."""
    doc = file_document(files, CapacitySearchDocument, campaign_id, search_id, "search_id")
    key = f"{campaign_id}/{search_id}"
    row = {
        **placed_columns("search", campaign_id, search_id),
        "deployment_id": doc.deployment_id,
        "variant": doc.variant.name,
        "method": doc.variant.method or "none",
        "k": doc.variant.k,
        "variant_config": canonical_json(doc.variant),
        "repeat": doc.repeat,
        "workload": doc.workload.stratum,
        "workload_sha256": doc.workload.sha256,
        "sampling": None if doc.sampling is None else canonical_json(doc.sampling),
        "quantile": doc.limits.quantile,
        "confidence": doc.limits.confidence,
        "ttft_limit_s": doc.limits.ttft_s,
        "tpot_limit_s": doc.limits.tpot_s,
        "requests_per_point": doc.requests_per_point,
        "capacity_rps": doc.capacity_rps,
        "first_failing_rps": doc.first_failing_rps,
        "converged": doc.converged,
        "stopped_because": doc.stopped_because,
        "n_points": len(doc.points),
        "settings": canonical_json(doc.settings),
        "started_utc": utc_datetime(doc.started_utc),
        "ended_utc": utc_datetime(doc.ended_utc),
        **tool_columns(doc.tool),
        **source_columns(source_path, sha256),
    }
    points = [
        {
            "search_key": key,
            "point_index": i,
            "rate_rps": p.rate,
            "cell_id": p.cell_id,
            "requests": p.requests,
            "failed": p.failed,
            "achieved_rps": p.achieved_rps,
            "goodput_rps": p.goodput_rps,
            "ttft_p_s": p.ttft.observed,
            "ttft_lower_s": p.ttft.lower,
            "ttft_upper_s": p.ttft.upper,
            "ttft_verdict": p.ttft.verdict,
            "tpot_p_s": p.tpot.observed,
            "tpot_lower_s": p.tpot.lower,
            "tpot_upper_s": p.tpot.upper,
            "tpot_verdict": p.tpot.verdict,
            "status": p.status,
            "verdict": p.verdict,
        }
        for i, p in enumerate(doc.points)
    ]
    return {
        "capacity_searches": to_frame(CapacitySearchModel, [row]),
        "capacity_points": to_frame(CapacityPointModel, points),
    }


KIND = file_kind(
    name="capacity",
    table="capacity_searches",
    key_column="search_key",
    found=layout.search_files,
    frames=placed(search_frames),
    models={"capacity_searches": CapacitySearchModel, "capacity_points": CapacityPointModel},
    sources={"capacity_points": "points"},
)
