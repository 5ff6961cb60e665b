"""Client calibrations (calibration/<calibration_id>.json: artifacts.documents.ClientCalibrationDocument, written
once at a campaign's start by tasks.load.calibration) into `client_calibrations`, one row each (migration
0008)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pandera.polars as pa
import polars as pl

from artifacts import layout
from artifacts.documents import ClientCalibrationDocument, utc_datetime
from warehouse.errors import ArtifactInvalid
from warehouse.frames import Files, document, table_schema
from warehouse.kinds.base import ArtifactKind, ArtifactRef, file_refs
from warehouse.models import Strict


class ClientCalibrationModel(pa.DataFrameModel):
    calibration_key: pl.String = pa.Field(unique=True)
    calibration_id: pl.String = pa.Field(str_length={"min_value": 1})
    campaign_id: pl.String = pa.Field(str_length={"min_value": 1})
    started_utc: pl.Datetime = pa.Field(nullable=True)
    ended_utc: pl.Datetime = pa.Field(nullable=True)
    mode: pl.String = pa.Field(isin=["closed", "open"])
    concurrency: pl.Int32 = pa.Field(gt=0)
    rate: pl.Float64 = pa.Field(nullable=True, gt=0)
    requests: pl.Int32 = pa.Field(gt=0)
    requests_ok: pl.Int32 = pa.Field(ge=0)
    requests_failed: pl.Int32 = pa.Field(ge=0)
    injected_ttft_s: pl.Float64 = pa.Field(ge=0)
    injected_step_s: pl.Float64 = pa.Field(ge=0)
    ttft_error_p50_s: pl.Float64 = pa.Field(nullable=True)
    ttft_error_p99_s: pl.Float64 = pa.Field(nullable=True)
    tpot_error_p50_s: pl.Float64 = pa.Field(nullable=True)
    tpot_error_p99_s: pl.Float64 = pa.Field(nullable=True)
    send_lag_p50_s: pl.Float64 = pa.Field(nullable=True)
    send_lag_p99_s: pl.Float64 = pa.Field(nullable=True)
    emulator_late_p50_s: pl.Float64 = pa.Field(nullable=True)
    emulator_late_p99_s: pl.Float64 = pa.Field(nullable=True)
    specgauge_version: pl.String = pa.Field(nullable=True)
    git_revision: pl.String = pa.Field(nullable=True)
    hostname: pl.String = pa.Field(nullable=True)
    source_path: pl.String = pa.Field()
    sha256: pl.String = pa.Field(str_length={"min_value": 64, "max_value": 64})

    Config = Strict


FIGURES = (
    "mode",
    "concurrency",
    "rate",
    "requests",
    "requests_ok",
    "requests_failed",
    "injected_ttft_s",
    "injected_step_s",
    "ttft_error_p50_s",
    "ttft_error_p99_s",
    "tpot_error_p50_s",
    "tpot_error_p99_s",
    "send_lag_p50_s",
    "send_lag_p99_s",
    "emulator_late_p50_s",
    "emulator_late_p99_s",
)


def calibration_frames(
    source_path: str, campaign_id: str, calibration_id: str, files: Files, sha256: str
) -> dict[str, pl.DataFrame]:
    """One calibration file as its client_calibrations row (pure: no database)."""
    name = f"{calibration_id}.json"
    doc = document(files, name, ClientCalibrationDocument)
    for column, value, expected in (
        ("calibration_id", doc.calibration_id, calibration_id),
        ("campaign_id", doc.campaign_id, campaign_id),
    ):
        if value != expected:
            raise ArtifactInvalid(
                f"{value!r} does not match where it is ({expected!r})", file=name, column=column
            )
    row = {
        "calibration_key": f"{campaign_id}/{calibration_id}",
        "calibration_id": calibration_id,
        "campaign_id": campaign_id,
        "started_utc": utc_datetime(doc.started_utc),
        "ended_utc": utc_datetime(doc.ended_utc),
        **{name: getattr(doc, name) for name in FIGURES},
        "specgauge_version": doc.tool.specgauge_version if doc.tool else None,
        "git_revision": doc.tool.git_revision if doc.tool else None,
        "hostname": doc.host.hostname if doc.host else None,
        "source_path": source_path,
        "sha256": sha256,
    }
    return {
        "client_calibrations": pl.DataFrame([row], schema=table_schema(ClientCalibrationModel), orient="row")
    }


def _discover(campaign_dir: Path, prefix: str) -> Iterator[ArtifactRef]:
    return file_refs("calibration", layout.calibration_files(campaign_dir), campaign_dir, prefix)


KIND = ArtifactKind(
    name="calibration",
    table="client_calibrations",
    key_column="calibration_key",
    discover=_discover,
    frames=lambda ref, files, sha: calibration_frames(ref.source_path, ref.campaign_id, ref.name, files, sha),
    models={"client_calibrations": ClientCalibrationModel},
    files=lambda ref: (f"{ref.name}.json",),  # the folder holds every calibration of the campaign
)
