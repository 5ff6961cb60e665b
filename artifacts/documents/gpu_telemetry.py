"""GPU telemetry of a cell: cells/<cell_id>.a<n>/gpu_telemetry.json (GpuTelemetryDocument, per-GPU summaries
of the measured window) and gpu_samples.parquet (GPU_SAMPLE_SCHEMA, the raw samples), written by
tasks.metrics.gpu_telemetry. A cell without GPUs still has the document: `state` "absent" and `status` saying
why, and no GPU rows; its figures are never zeros (docs/telemetry.md)."""

from __future__ import annotations

from typing import Literal

import polars as pl
from pydantic import Field

from artifacts.documents.base import Document, Number, Text, Whole

TelemetryState = Literal["ok", "absent", "failed"]
TELEMETRY_STATES: tuple[str, ...] = ("ok", "absent", "failed")
TELEMETRY_SOURCES: tuple[str, ...] = ("nvml", "nvidia-smi")

# gpu_samples.parquet: one row per GPU per sample. t_s: seconds since the measured window opened (the
# sampler's start), on time.perf_counter(); a reading the GPU does not report is null, never 0.
GPU_SAMPLE_SCHEMA: dict[str, pl.DataType] = {
    "t_s": pl.Float64(),
    "gpu_index": pl.Int32(),
    "memory_used_mib": pl.Float64(),
    "power_w": pl.Float64(),
    "sm_clock_mhz": pl.Float64(),
    "utilization_pct": pl.Float64(),
    "energy_counter_j": pl.Float64(),  # NVML's total-energy counter since driver load (null: nvidia-smi)
}


class GpuSummary(Document):
    """One GPU over the measured window. `energy_j`: power integrated over the whole window (trapezoids
    between samples, the first and last sample's power held to the window's edges); `energy_counter_j`:
    NVML's own energy counter, last - first sample (covers first to last sample only; null where the GPU
    or the source has none); null means not reported, never zero power."""

    gpu_index: Whole
    name: Text | None = None
    samples: Whole
    energy_j: Number | None = None
    energy_counter_j: Number | None = None
    mean_power_w: Number | None = None  # energy_j / window_s
    max_power_w: Number | None = None
    peak_memory_mib: Number | None = None
    mean_memory_mib: Number | None = None
    mean_utilization_pct: Number | None = None
    mean_sm_clock_mhz: Number | None = None
    first_sample_s: Number | None = None  # seconds after the window opened (nvidia-smi starts late)
    last_sample_s: Number | None = None


class GpuTelemetryDocument(Document):
    """gpu_telemetry.json: what the sampler saw during the cell's measured window."""

    state: TelemetryState
    status: Text  # "ok", or "absent: <why>" / "failed: <why>" (what v_gpu_telemetry shows)
    source: Text | None = None  # nvml | nvidia-smi; null when absent
    interval_s: Number
    window_s: Number | None = None  # the measured window the figures cover (sampler start to stop)
    samples_file: Text | None = None  # gpu_samples.parquet when there are samples
    gpus: list[GpuSummary] = Field(default_factory=list)
    errors: list[Text] = Field(
        default_factory=list
    )  # the first few readings that failed (skipped, counted in read_failures)
    read_failures: Whole = 0
