"""Capacity searches (capacity/<search_id>.json: artifacts.documents.CapacitySearchDocument, written once by
tasks.capacity.search_deployment) into `capacity_searches`, one row per search, and `capacity_points`, one row
per point in the order it ran (migration 0006). Each point is also a cell, in `cells`, by its cell_id."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandera.polars as pa
import polars as pl

from artifacts import layout
from artifacts.documents import CapacitySearchDocument, utc_datetime
from warehouse.errors import ArtifactInvalid
from warehouse.frames import Files, canonical_json, document, table_schema
from warehouse.kinds.base import ArtifactKind, ArtifactRef, file_refs
from warehouse.models import Strict

VERDICTS = ["met", "violated", "undecided"]


class CapacitySearchModel(pa.DataFrameModel):
    search_key: pl.String = pa.Field(unique=True)
    search_id: pl.String = pa.Field(str_length={"min_value": 1})
    campaign_id: pl.String = pa.Field(str_length={"min_value": 1})
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
    started_utc: pl.Datetime = pa.Field(nullable=True)
    ended_utc: pl.Datetime = pa.Field(nullable=True)
    specgauge_version: pl.String = pa.Field(nullable=True)
    git_revision: pl.String = pa.Field(nullable=True)
    source_path: pl.String = pa.Field()
    sha256: pl.String = pa.Field(str_length={"min_value": 64, "max_value": 64})

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
    name = f"{search_id}.json"
    doc = document(files, name, CapacitySearchDocument)
    for column, value, expected in (
        ("search_id", doc.search_id, search_id),
        ("campaign_id", doc.campaign_id, campaign_id),
    ):
        if value != expected:
            raise ArtifactInvalid(
                f"{value!r} does not match where it is ({expected!r})", file=name, column=column
            )
    key = f"{campaign_id}/{search_id}"
    row = {
        "search_key": key,
        "search_id": search_id,
        "campaign_id": campaign_id,
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
        "specgauge_version": doc.tool.specgauge_version if doc.tool else None,
        "git_revision": doc.tool.git_revision if doc.tool else None,
        "source_path": source_path,
        "sha256": sha256,
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
        "capacity_searches": pl.DataFrame([row], schema=table_schema(CapacitySearchModel), orient="row"),
        "capacity_points": pl.DataFrame(points, schema=table_schema(CapacityPointModel), orient="row"),
    }


def _discover(campaign_dir: Path, prefix: str) -> Iterator[ArtifactRef]:
    # a search being written has a temporary '.' name: layout.search_files leaves it out
    return file_refs("capacity", layout.search_files(campaign_dir), campaign_dir, prefix)


KIND = ArtifactKind(
    name="capacity",
    table="capacity_searches",
    key_column="search_key",
    discover=_discover,
    frames=lambda ref, files, sha: search_frames(ref.source_path, ref.campaign_id, ref.name, files, sha),
    models={"capacity_searches": CapacitySearchModel, "capacity_points": CapacityPointModel},
    sources={"capacity_points": "points"},
    files=lambda ref: (f"{ref.name}.json",),  # the capacity folder holds every search of the campaign
)
