"""campaign.json and its run records (artifacts.documents.CampaignRecord, RunRecord) into `campaigns`."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pandera.polars as pa
import polars as pl

from artifacts import layout
from artifacts.documents import CampaignRecord, RunRecord, utc_datetime
from warehouse.errors import ArtifactInvalid
from warehouse.frames import Files, Part, canonical_json, document
from warehouse.kinds.base import ArtifactKind, ArtifactRef
from warehouse.kinds.columns import main_table, source_columns, tool_columns
from warehouse.models import Exact

# created: no run has finished yet (one is running, or crashed); complete: the latest run left no failed
# cell; incomplete: it did. An explicit `status` in campaign.json must be one of these too.
CAMPAIGN_STATUSES = ["created", "complete", "incomplete"]


@main_table()
class CampaignModel(pa.DataFrameModel):
    campaign_id: pl.String = pa.Field(str_length={"min_value": 1}, unique=True)
    spec_name: pl.String = pa.Field(str_length={"min_value": 1})
    label: pl.String = pa.Field(nullable=True)
    spec_sha256: pl.String = pa.Field(nullable=True)
    status: pl.String = pa.Field(isin=CAMPAIGN_STATUSES)
    created_utc: pl.Datetime = pa.Field()
    runs: pl.Int32 = pa.Field(ge=0)
    last_run_utc: pl.Datetime = pa.Field(nullable=True)
    failed_cells: pl.List(pl.String) = pa.Field(nullable=True)
    repeats: pl.Int32 = pa.Field(nullable=True, gt=0)
    variant_order: pl.List(pl.List(pl.String)) = pa.Field(nullable=True)
    slo_ttft_p99_s: pl.Float64 = pa.Field(nullable=True, gt=0)
    slo_tpot_p99_s: pl.Float64 = pa.Field(nullable=True, gt=0)
    spec: pl.String = pa.Field()
    specgauge_version: pl.String = pa.Field(nullable=True)
    git_revision: pl.String = pa.Field(nullable=True)
    hostname: pl.String = pa.Field(nullable=True)
    host: pl.String = pa.Field(nullable=True)
    imported: pl.Boolean = pa.Field()
    imported_from: pl.String = pa.Field(nullable=True)

    Config = Exact


def campaign_frames(source_path: str, campaign_id: str, files: Files, sha256: str) -> dict[str, Part]:
    """campaign.json (written once) and its run records runs/*.json (one per finished run)."""
    name = layout.CAMPAIGN_FILE
    record = document(files, name, CampaignRecord)
    if record.campaign_id != campaign_id:
        raise ArtifactInvalid(
            f"campaign_id {record.campaign_id!r} does not match its directory {campaign_id!r}",
            file=name,
            column="campaign_id",
        )
    runs = sorted(
        ((f, document(files, f, RunRecord)) for f in files if f.startswith(f"{layout.RUNS}/")),
        key=lambda item: (item[1].ended_utc or "", item[0]),
    )
    last = runs[-1][1] if runs else None
    failed = last.failed_cells if last else None
    failed_cells = sorted(str(c) for c in failed) if failed is not None else None
    status = _extra_text(record, "status", name) or (
        "created" if last is None else "incomplete" if failed_cells else "complete"
    )
    spec_name = _extra_text(record, "spec_name", name) or record.name or record.spec.name
    if not spec_name:
        raise ArtifactInvalid("required field missing", file=name, column="spec.name")
    slo = record.spec.slo
    tool, host = record.tool, record.host
    row = {
        "campaign_id": campaign_id,
        "spec_name": spec_name,
        "label": record.label,
        "spec_sha256": record.spec_sha256,
        "status": status,
        "created_utc": utc_datetime(record.created_utc),
        "runs": len(runs),
        "last_run_utc": utc_datetime(last.ended_utc) if last else None,
        "failed_cells": failed_cells,
        "repeats": record.spec.max_repeats,
        "variant_order": record.variant_order,
        "slo_ttft_p99_s": slo.ttft_p99_s if slo else None,
        "slo_tpot_p99_s": slo.tpot_p99_s if slo else None,
        "spec": canonical_json(record.spec),
        **tool_columns(tool),
        "hostname": host.hostname if host else None,
        "host": canonical_json(host) if host else None,
        # A campaign translated from another harness's results (tasks.imports), and from where.
        "imported": record.imported is not None,
        "imported_from": canonical_json(record.imported) if record.imported else None,
        **source_columns(source_path, sha256),
    }
    return {"campaigns": [row]}


def _extra_text(record: CampaignRecord, field: str, file: str) -> str | None:
    """A field older or other writers may add (`status`, `spec_name`): text when present."""
    value = (record.model_extra or {}).get(field)
    if value is not None and not isinstance(value, str):
        raise ArtifactInvalid(f"expected a string, got {value!r}", file=file, column=field)
    return value


def _files(ref: ArtifactRef) -> list[str]:
    return [layout.CAMPAIGN_FILE, *(f"{layout.RUNS}/{p.name}" for p in layout.run_files(ref.path))]


def _discover(campaign_dir: Path, prefix: str) -> Iterator[ArtifactRef]:
    name = campaign_dir.name
    yield ArtifactRef("campaign", name, campaign_dir, f"{prefix}/{layout.CAMPAIGN_FILE}", name, name)


KIND = ArtifactKind(
    name="campaign",
    table="campaigns",
    key_column="campaign_id",
    discover=_discover,
    frames=lambda ref, files, sha: campaign_frames(ref.source_path, ref.campaign_id, files, sha),
    models={"campaigns": CampaignModel},
    sources={"campaigns": layout.CAMPAIGN_FILE},
    immutable=False,  # campaign.json is written once, but every finished run adds a runs/*.json record
    files=_files,
)
