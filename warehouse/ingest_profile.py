"""Profiled windows (RAW/<campaign_id>/profiles/<profile_id>/) into the `profiles` table.

Importing this module registers the artifact kind `profile` with warehouse.ingest and its pandera model with
warehouse.models.MODELS. Only meta.json and breakdown.json are hashed and read (the trace and the /metrics
scrapes are the evidence behind them, not warehouse data). A failed window (status "failed", no
breakdown.json) is ingested too, with null figures, as failed cells are.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandera.polars as pa
import polars as pl

from warehouse import raw
from warehouse.errors import ArtifactInvalid
from warehouse.ingest import ArtifactKind, ArtifactRef, register_kind
from warehouse.models import METHODS, MODELS, Strict

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


class ProfileModel(pa.DataFrameModel):
    profile_key: pl.String = pa.Field(unique=True)
    profile_id: pl.String = pa.Field(str_length={"min_value": 1})
    campaign_id: pl.String = pa.Field(str_length={"min_value": 1})
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
    source_path: pl.String = pa.Field()
    sha256: pl.String = pa.Field(str_length={"min_value": 64, "max_value": 64})

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


MODELS["profiles"] = ProfileModel


def _discover(campaign_dir: Path, prefix: str) -> Iterator[ArtifactRef]:
    folder = campaign_dir / "profiles"
    if not folder.is_dir():
        return
    for d in sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith(".")):
        yield ArtifactRef(
            "profile",
            f"{campaign_dir.name}/{d.name}",
            d,
            f"{prefix}/profiles/{d.name}",
            campaign_dir.name,
            d.name,
        )


def _cross_check_ok(checks: raw.Doc) -> bool | None:
    found = [checks.get(f"{name}.ok") for name in ("draft_tokens", "drafts")]
    found = [f for f in found if f is not None]
    return None if not found else all(bool(f) for f in found)


def profile_frames(
    source_path: str, campaign_id: str, profile_id: str, files: raw.Files, sha256: str
) -> dict[str, pl.DataFrame]:
    """The `profiles` row of one artifact. ArtifactInvalid names the file and field that is wrong."""
    meta = raw.Doc(raw.load_json(files, "meta.json"), "meta.json")
    if meta.text("profile_id", required=True) != profile_id:
        raise ArtifactInvalid(
            f"{meta.get('profile_id')!r} does not match its directory ({profile_id!r})",
            file="meta.json",
            column="profile_id",
        )
    if meta.text("campaign_id", required=True) != campaign_id:
        raise ArtifactInvalid(
            f"{meta.get('campaign_id')!r} does not match its campaign directory ({campaign_id!r})",
            file="meta.json",
            column="campaign_id",
        )
    status = meta.text("status", required=True)
    has_breakdown = "breakdown.json" in files
    if status == "ok" and not has_breakdown:
        raise ArtifactInvalid("status is ok but breakdown.json is missing", file="breakdown.json")
    b = raw.Doc(raw.load_json(files, "breakdown.json") if has_breakdown else {}, "breakdown.json")
    variant = meta.sub("variant")
    concurrency = meta.number("load.concurrency", integer=True)
    per_pos = b.get("counters.accepted_per_position")
    if per_pos is not None and not (isinstance(per_pos, list) and all(isinstance(x, int) for x in per_pos)):
        raise ArtifactInvalid(
            "expected a list of whole numbers", file="breakdown.json", column="counters.accepted_per_position"
        )
    trace = meta.sub("trace")
    row: dict[str, Any] = {
        "profile_key": f"{campaign_id}/{profile_id}",
        "profile_id": profile_id,
        "campaign_id": campaign_id,
        "deployment_id": meta.text("deployment_id"),
        "variant": variant.text("name", required=True),
        "method": variant.text("method") or "none",
        "k": variant.number("k", integer=True),
        "variant_config": meta.json("variant"),
        "workload": meta.text("workload.stratum"),
        "workload_file": meta.text("workload.file"),
        "workload_sha256": meta.text("workload.sha256"),
        "load_label": raw.load_label("closed", concurrency, None),
        "concurrency": concurrency,
        "requests_planned": meta.number("load.requests", integer=True),
        "requests_ok": meta.number("requests.ok", integer=True),
        "requests_failed": meta.number("requests.failed", integer=True),
        "profiler": meta.text("profiler", required=True),
        "launcher": meta.text("deployment.launcher"),
        "engine_version": meta.text("deployment.engine_version"),
        "specgauge_version": meta.text("tool.specgauge_version"),
        "git_revision": meta.text("tool.git_revision"),
        "hostname": meta.text("host.hostname"),
        "started_utc": meta.time("started_utc"),
        "ended_utc": meta.time("ended_utc"),
        "status": status,
        "error": meta.text("error"),
        "steps": b.number("trace_counts.steps", integer=True),
        **{column: b.number(f"seconds.{key}") for column, key in SECONDS.items()},
        **{share: b.number(f"shares.{share}") for share in SHARES},
        "apportioning": b.text("apportioning"),
        "drafts": b.number("counters.drafts", integer=True),
        "draft_tokens": b.number("counters.draft_tokens", integer=True),
        "accepted_tokens": b.number("counters.accepted_tokens", integer=True),
        "acceptance_rate": b.number("counters.acceptance_rate"),
        "accepted_per_position": per_pos,
        "cross_check_ok": _cross_check_ok(b.sub("cross_checks")),
        "trace_file": trace.text("file") or trace.text("pointer"),
        "trace_sha256": trace.text("sha256"),
        "source_path": source_path,
        "sha256": sha256,
    }
    return {"profiles": raw.to_frame("profiles", [row])}


PROFILE = register_kind(
    ArtifactKind(
        name="profile",
        table="profiles",
        key_column="profile_key",
        discover=_discover,
        frames=lambda ref, files, sha: profile_frames(ref.source_path, ref.campaign_id, ref.name, files, sha),
        files=("meta.json", "breakdown.json"),
        order=50,
    )
)
