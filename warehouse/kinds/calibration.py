"""Client calibrations (calibration/<calibration_id>.json: artifacts.documents.ClientCalibrationDocument, written
once at a campaign's start by tasks.load.calibration) into `client_calibrations`, one row each (migration
0008)."""

from __future__ import annotations

import pandera.polars as pa
import polars as pl

from artifacts import layout
from artifacts.documents import ClientCalibrationDocument, utc_datetime
from warehouse.frames import Files, to_frame
from warehouse.kinds.base import file_document, file_kind, placed
from warehouse.kinds.columns import main_table, placed_columns, source_columns, tool_columns
from warehouse.models import Strict


@main_table("calibration")
class ClientCalibrationModel(pa.DataFrameModel):
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
    doc = file_document(files, ClientCalibrationDocument, campaign_id, calibration_id, "calibration_id")
    row = {
        **placed_columns("calibration", campaign_id, calibration_id),
        "started_utc": utc_datetime(doc.started_utc),
        "ended_utc": utc_datetime(doc.ended_utc),
        **{name: getattr(doc, name) for name in FIGURES},
        **tool_columns(doc.tool),
        "hostname": doc.host.hostname if doc.host else None,
        **source_columns(source_path, sha256),
    }
    return {"client_calibrations": to_frame(ClientCalibrationModel, [row])}


KIND = file_kind(
    name="calibration",
    table="client_calibrations",
    key_column="calibration_key",
    found=layout.calibration_files,
    frames=placed(calibration_frames),
    models={"client_calibrations": ClientCalibrationModel},
)
