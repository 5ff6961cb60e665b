"""Profiled windows (profiles/<profile_id>/: artifacts.documents.ProfileMeta and ProfileBreakdown) into the
`profiles` table. Only meta.json and breakdown.json are hashed and read (the trace and the /metrics scrapes
are the evidence behind them, not warehouse data). A failed window (status "failed", no breakdown.json) is
ingested too, with null figures, as failed cells are.
"""

from __future__ import annotations

from typing import Any

import pandera.polars as pa
import polars as pl

from artifacts import ids, layout
from artifacts.documents import ProfileBreakdown, ProfileCrossChecks, ProfileMeta, utc_datetime
from warehouse.errors import ArtifactInvalid
from warehouse.frames import Files, canonical_json, document, to_frame
from warehouse.kinds.base import check_place, directory_kind, placed
from warehouse.kinds.columns import main_table, optional_fields, placed_columns, source_columns, tool_columns
from warehouse.models import METHODS, Strict

PROFILERS = ["torch-profiler", "nsys"]
SHARES = (
    "wasted_share",
    "drafting_share",
    "verification_share",
    "rejection_share",
    "other_share",
    "useful_share",
    "added_share",
    "wasted_share_of_added",
    "wasted_drafting_share",
    "wasted_verification_share",
)
SECONDS = {
    "engine_s": "engine",
    "drafting_s": "drafting",
    "verification_s": "verification",
    "rejection_s": "rejection",
    "other_s": "other",
    "verification_drafted_s": "verification_drafted",
    "added_s": "added",
    "wasted_s": "wasted",
    "wasted_drafting_s": "wasted_drafting",
    "wasted_verification_s": "wasted_verification",
}
# Shares are fractions of engine time; a rounding hair below 0 or above 1 is tolerated.
_EPS = 1e-9


def _share_field() -> Any:
    return pa.Field(nullable=True, ge=-_EPS, le=1 + _EPS)


@main_table("profile")
class ProfileModel(pa.DataFrameModel):
    deployment_id: pl.String = pa.Field(nullable=True)
    variant: pl.String = pa.Field(str_length={"min_value": 1})
    method: pl.String = pa.Field(isin=METHODS)
    k: pl.Int32 = pa.Field(nullable=True, gt=0)
    variant_config: pl.String = pa.Field(nullable=True)
    workload: pl.String = pa.Field(nullable=True)
    workload_file: pl.String = pa.Field(nullable=True)
    workload_sha256: pl.String = pa.Field(nullable=True)
    load_label: pl.String = pa.Field(str_length={"min_value": 1})
    concurrency: pl.Int32 = pa.Field(nullable=True, gt=0)
    requests_planned: pl.Int32 = pa.Field(nullable=True, gt=0)
    requests_ok: pl.Int32 = pa.Field(nullable=True, ge=0)
    requests_failed: pl.Int32 = pa.Field(nullable=True, ge=0)
    profiler: pl.String = pa.Field(isin=PROFILERS)
    launcher: pl.String = pa.Field(nullable=True)
    engine_version: pl.String = pa.Field(nullable=True)
    specgauge_version: pl.String = pa.Field(nullable=True)
    git_revision: pl.String = pa.Field(nullable=True)
    hostname: pl.String = pa.Field(nullable=True)
    started_utc: pl.Datetime = pa.Field(nullable=True)
    ended_utc: pl.Datetime = pa.Field(nullable=True)
    status: pl.String = pa.Field(isin=["ok", "failed"])
    error: pl.String = pa.Field(nullable=True)
    steps: pl.Int32 = pa.Field(nullable=True, ge=0)
    engine_s: pl.Float64 = pa.Field(nullable=True, ge=0)
    drafting_s: pl.Float64 = pa.Field(nullable=True, ge=0)
    verification_s: pl.Float64 = pa.Field(nullable=True, ge=0)
    rejection_s: pl.Float64 = pa.Field(nullable=True, ge=0)
    other_s: pl.Float64 = pa.Field(nullable=True, ge=-_EPS)
    verification_drafted_s: pl.Float64 = pa.Field(nullable=True, ge=0)
    added_s: pl.Float64 = pa.Field(nullable=True, ge=0)
    wasted_s: pl.Float64 = pa.Field(nullable=True, ge=0)
    wasted_drafting_s: pl.Float64 = pa.Field(nullable=True, ge=0)
    wasted_verification_s: pl.Float64 = pa.Field(nullable=True, ge=0)
    wasted_share: pl.Float64 = _share_field()
    drafting_share: pl.Float64 = _share_field()
    verification_share: pl.Float64 = _share_field()
    rejection_share: pl.Float64 = _share_field()
    other_share: pl.Float64 = _share_field()
    useful_share: pl.Float64 = _share_field()
    added_share: pl.Float64 = _share_field()
    wasted_share_of_added: pl.Float64 = _share_field()
    wasted_drafting_share: pl.Float64 = _share_field()
    wasted_verification_share: pl.Float64 = _share_field()
    apportioning: pl.String = pa.Field(nullable=True, isin=["position-aware", "uniform", "none"])
    drafts: pl.Int64 = pa.Field(nullable=True, ge=0)
    draft_tokens: pl.Int64 = pa.Field(nullable=True, ge=0)
    accepted_tokens: pl.Int64 = pa.Field(nullable=True, ge=0)
    acceptance_rate: pl.Float64 = pa.Field(nullable=True, ge=0, le=1)
    accepted_per_position: pl.List(pl.Int64) = pa.Field(nullable=True)
    cross_check_ok: pl.Boolean = pa.Field(nullable=True)
    trace_file: pl.String = pa.Field(nullable=True)
    trace_sha256: pl.String = pa.Field(nullable=True)

    Config = Strict

    @pa.dataframe_check(
        error="status: an ok window has its breakdown (engine_s, wasted_share when speculative)"
    )
    @classmethod
    def ok_has_breakdown(cls, data: pa.PolarsData) -> pl.LazyFrame:
        ok = pl.col("status") == "ok"
        has = pl.col("engine_s").is_not_null() & (
            (pl.col("method") == "none") | pl.col("wasted_share").is_not_null()
        )
        return data.lazyframe.select(~ok | has)

    @pa.dataframe_check(error="wasted_s: wasted work cannot exceed the work speculation adds")
    @classmethod
    def wasted_within_added(cls, data: pa.PolarsData) -> pl.LazyFrame:
        return data.lazyframe.select(
            pl.col("wasted_s").is_null() | (pl.col("wasted_s") <= pl.col("added_s") * (1 + 1e-9) + 1e-12)
        )


def _cross_check_ok(checks: ProfileCrossChecks | None) -> bool | None:
    found = (
        [c.ok for c in (checks.draft_tokens, checks.drafts) if c is not None and c.ok is not None]
        if checks
        else []
    )
    return None if not found else all(bool(f) for f in found)


def profile_frames(
    source_path: str, campaign_id: str, profile_id: str, files: Files, sha256: str
) -> dict[str, pl.DataFrame]:
    """The `profiles` row of one artifact. ArtifactInvalid names the file and field that is wrong."""
    meta = document(files, layout.META, ProfileMeta)
    check_place(layout.META, meta, "its directory", profile_id=profile_id)
    check_place(layout.META, meta, "its campaign directory", campaign_id=campaign_id)
    has_breakdown = layout.BREAKDOWN in files
    if meta.status == "ok" and not has_breakdown:
        raise ArtifactInvalid("status is ok but breakdown.json is missing", file=layout.BREAKDOWN)
    b = document(files, layout.BREAKDOWN, ProfileBreakdown) if has_breakdown else ProfileBreakdown()
    workload = meta.workload
    concurrency = meta.load.concurrency if meta.load else None
    seconds, shares, counters = b.seconds or {}, b.shares or {}, b.counters
    row: dict[str, Any] = {
        **placed_columns("profile", campaign_id, profile_id),
        "deployment_id": meta.deployment_id,
        "variant": meta.variant.name,
        "method": meta.variant.method or "none",
        "k": meta.variant.k,
        "variant_config": canonical_json(meta.variant),
        "workload": workload.stratum if workload else None,
        "workload_file": workload.file if workload else None,
        "workload_sha256": workload.sha256 if workload else None,
        "load_label": ids.load_label("closed", concurrency, None),
        "concurrency": concurrency,
        "requests_planned": meta.load.requests if meta.load else None,
        "requests_ok": meta.requests.ok if meta.requests else None,
        "requests_failed": meta.requests.failed if meta.requests else None,
        "profiler": meta.profiler,
        "launcher": meta.deployment.launcher if meta.deployment else None,
        "engine_version": meta.deployment.engine_version if meta.deployment else None,
        **tool_columns(meta.tool),
        "hostname": meta.host.hostname if meta.host else None,
        "started_utc": utc_datetime(meta.started_utc),
        "ended_utc": utc_datetime(meta.ended_utc),
        "status": meta.status,
        "error": meta.error,
        "steps": b.trace_counts.steps if b.trace_counts else None,
        **{column: seconds.get(key) for column, key in SECONDS.items()},
        **{share: shares.get(share) for share in SHARES},
        "apportioning": b.apportioning,
        **optional_fields(
            counters, "drafts", "draft_tokens", "accepted_tokens", "acceptance_rate", "accepted_per_position"
        ),
        "cross_check_ok": _cross_check_ok(b.cross_checks),
        "trace_file": (meta.trace.file or meta.trace.pointer) if meta.trace else None,
        "trace_sha256": meta.trace.sha256 if meta.trace else None,
        **source_columns(source_path, sha256),
    }
    return {"profiles": to_frame(ProfileModel, [row])}


KIND = directory_kind(
    name="profile",
    table="profiles",
    key_column="profile_key",
    folder=layout.profiles_dir,
    frames=placed(profile_frames),
    models={"profiles": ProfileModel},
    files=layout.PROFILE_DOCUMENTS,
)
