"""GPU telemetry of cell attempts (cells/<cell_id>.a<n>/gpu_telemetry.json: artifacts.documents.gpu_telemetry,
written by tasks.metrics.gpu_telemetry) into `gpu_telemetry_cells` (one row per attempt: was there telemetry,
and if not why) and `gpu_telemetry` (one row per attempt and GPU: energy, power, peak memory, utilization, SM
clock over the measured window); migration 0021, shown joined to v_cells in v_gpu_telemetry.

Only attempts that have gpu_telemetry.json are this kind's artifacts (cells written before it have none: the
view says "not recorded"). Keyed like the cell (`<campaign_id>/<cell_id>.a<n>`, `cell_key`). The raw samples
(gpu_samples.parquet) stay in the raw tree: the evidence behind the figures, not warehouse data.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pandera.polars as pa
import polars as pl

from artifacts import ids, layout
from artifacts.documents.gpu_telemetry import TELEMETRY_SOURCES, TELEMETRY_STATES, GpuTelemetryDocument
from warehouse.errors import ArtifactInvalid
from warehouse.frames import Files, document, to_frame
from warehouse.kinds.base import ArtifactKind, ArtifactRef, directory_refs
from warehouse.kinds.columns import main_table, source_columns
from warehouse.models import Strict

_NonNegative = {"nullable": True, "ge": 0}
# GpuSummary's fields stored as gpu_telemetry columns of the same names (its `name` is gpu_name)
_GPU_FIGURES = (
    "gpu_index",
    "samples",
    "energy_j",
    "energy_counter_j",
    "mean_power_w",
    "max_power_w",
    "peak_memory_mib",
    "mean_memory_mib",
    "mean_utilization_pct",
    "mean_sm_clock_mhz",
    "first_sample_s",
    "last_sample_s",
)


@main_table()
class GpuTelemetryCellModel(pa.DataFrameModel):
    cell_key: pl.String = pa.Field(unique=True)
    campaign_id: pl.String = pa.Field(str_length={"min_value": 1})
    cell_id: pl.String = pa.Field(str_length={"min_value": 1})
    attempt: pl.Int32 = pa.Field(ge=1)
    state: pl.String = pa.Field(isin=list(TELEMETRY_STATES))
    telemetry_status: pl.String = pa.Field(str_length={"min_value": 1})
    source: pl.String = pa.Field(nullable=True, isin=list(TELEMETRY_SOURCES))
    interval_s: pl.Float64 = pa.Field(gt=0)
    window_s: pl.Float64 = pa.Field(**_NonNegative)
    gpus: pl.Int32 = pa.Field(ge=0)
    energy_j: pl.Float64 = pa.Field(**_NonNegative)  # summed over GPUs; null: no GPU reported power
    samples_file: pl.String = pa.Field(nullable=True)
    read_failures: pl.Int32 = pa.Field(ge=0)

    Config = Strict

    @pa.dataframe_check(error="state: an absent window has no GPU and no energy (never zeros)")
    @classmethod
    def absent_is_empty(cls, data: pa.PolarsData) -> pl.LazyFrame:
        absent = pl.col("state") == "absent"
        return data.lazyframe.select(~absent | ((pl.col("gpus") == 0) & pl.col("energy_j").is_null()))


class GpuTelemetryModel(pa.DataFrameModel):
    cell_key: pl.String = pa.Field()
    gpu_index: pl.Int32 = pa.Field(ge=0)
    gpu_name: pl.String = pa.Field(nullable=True)
    samples: pl.Int32 = pa.Field(ge=0)
    energy_j: pl.Float64 = pa.Field(**_NonNegative)
    energy_counter_j: pl.Float64 = pa.Field(**_NonNegative)
    mean_power_w: pl.Float64 = pa.Field(**_NonNegative)
    max_power_w: pl.Float64 = pa.Field(**_NonNegative)
    peak_memory_mib: pl.Float64 = pa.Field(**_NonNegative)
    mean_memory_mib: pl.Float64 = pa.Field(**_NonNegative)
    mean_utilization_pct: pl.Float64 = pa.Field(nullable=True, ge=0, le=100)
    mean_sm_clock_mhz: pl.Float64 = pa.Field(**_NonNegative)
    first_sample_s: pl.Float64 = pa.Field(nullable=True)
    last_sample_s: pl.Float64 = pa.Field(nullable=True)

    Config = Strict


def telemetry_frames(ref: ArtifactRef, files: Files, sha256: str) -> dict[str, pl.DataFrame]:
    """One attempt's gpu_telemetry.json as its rows (pure: no database); ArtifactInvalid names the field."""
    doc = document(files, layout.GPU_TELEMETRY, GpuTelemetryDocument)
    parsed = ids.parse_attempt_name(ref.name)
    if parsed is None:
        raise ArtifactInvalid(f"{ref.name!r} is not a cell attempt's directory", file=layout.GPU_TELEMETRY)
    if doc.state == "absent" and doc.gpus:
        raise ArtifactInvalid("an absent window lists GPUs", file=layout.GPU_TELEMETRY, column="gpus")
    indexes = [g.gpu_index for g in doc.gpus]
    if len(set(indexes)) != len(indexes):
        raise ArtifactInvalid(f"a GPU listed twice: {indexes}", file=layout.GPU_TELEMETRY, column="gpus")
    energies = [g.energy_j for g in doc.gpus if g.energy_j is not None]
    row = {
        "cell_key": ref.key,
        "campaign_id": ref.campaign_id,
        "cell_id": parsed[0],
        "attempt": parsed[1],
        "state": doc.state,
        "telemetry_status": doc.status,
        "source": doc.source,
        "interval_s": doc.interval_s,
        "window_s": doc.window_s,
        "gpus": len(doc.gpus),
        "energy_j": sum(energies) if energies else None,
        "samples_file": doc.samples_file,
        "read_failures": doc.read_failures,
        **source_columns(ref.source_path, sha256),
    }
    gpus = [
        {"cell_key": ref.key, "gpu_name": g.name, **{name: getattr(g, name) for name in _GPU_FIGURES}}
        for g in sorted(doc.gpus, key=lambda g: g.gpu_index)
    ]
    return {
        "gpu_telemetry_cells": to_frame(GpuTelemetryCellModel, [row]),
        "gpu_telemetry": to_frame(GpuTelemetryModel, gpus),
    }


def _discover(campaign_dir: Path, prefix: str) -> Iterator[ArtifactRef]:
    """The campaign's cell attempts that hold gpu_telemetry.json."""
    for ref in directory_refs("gpu_telemetry", layout.cells_dir(campaign_dir), campaign_dir, prefix):
        if (ref.path / layout.GPU_TELEMETRY).is_file():
            yield ref


KIND = ArtifactKind(
    name="gpu_telemetry",
    table="gpu_telemetry_cells",
    key_column="cell_key",
    discover=_discover,
    frames=telemetry_frames,
    models={"gpu_telemetry_cells": GpuTelemetryCellModel, "gpu_telemetry": GpuTelemetryModel},
    sources={"gpu_telemetry_cells": layout.GPU_TELEMETRY, "gpu_telemetry": layout.GPU_TELEMETRY},
    files=(layout.GPU_TELEMETRY,),
)
