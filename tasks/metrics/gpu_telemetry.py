"""GPU telemetry of a cell's measured window: memory used, power, SM clock and utilization of every GPU.

Where the GPUs are read from, first that works: NVML through `nvidia-ml-py` (`import pynvml`), polled every
`interval_s` on a thread (plus NVML's own energy counter where the GPU has one); else `nvidia-smi
--query-gpu=... -lms N`, streaming CSV lines read on a thread; else nothing, and the cell records telemetry
as ABSENT with why ("absent: no NVML (...) and no nvidia-smi on PATH"), never as zeros. A reading a GPU does
not report (power on some boards) is null, and so is every figure made from it.

Only the local launcher's engine is known to run on this host; for any other launcher the sampler could read
another machine's GPUs (or none), so it records "absent: the engine was not launched on this host"
(docs/telemetry.md says what a cluster launch would need).

    telemetry = GpuTelemetry.for_launcher(deployment.launcher)
    telemetry.start()  # the measured window opens
    ...
    telemetry.stop()  # it closes
    telemetry.write(cell_directory)  # gpu_telemetry.json (+ gpu_samples.parquet)

Reading the GPUs is tasks/metrics/gpu_sampler.py's (standard library only); this module summarises the
window and writes the cell's files. The sampler never fails the cell: a reading that fails is skipped and counted, a source that dies is
recorded as "failed: <why>" with the samples it gave.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from artifacts import layout
from artifacts.documents.gpu_telemetry import GPU_SAMPLE_SCHEMA, GpuSummary, GpuTelemetryDocument
from artifacts.store import write_json
from tasks.metrics.gpu_sampler import GpuSampler

_LOCAL_LAUNCHERS = frozenset({"local"})  # launchers whose engine runs on this host


def integrate(times: Sequence[float], values: Sequence[float | None], window_s: float) -> float | None:
    """The integral of a sampled quantity over [0, window_s]: linear between samples, the first and last
    sample's value held to the window's edges; samples outside the window only shape the edges. None
    without a reported value (never 0: nothing was measured)."""
    pairs = sorted((t, v) for t, v in zip(times, values, strict=True) if v is not None)
    if not pairs or window_s <= 0:
        return None
    ts = np.array([t for t, _ in pairs])
    vs = np.array([v for _, v in pairs])
    inner = ts[(ts > 0) & (ts < window_s)]
    xs = np.concatenate(([0.0], inner, [window_s]))
    return float(np.trapezoid(np.interp(xs, ts, vs), xs))


def _time_mean(times: list[float], values: list[float | None], window_s: float) -> float | None:
    total = integrate(times, values, window_s)
    return None if total is None else total / window_s


def _max(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return max(present) if present else None


def _counter_delta(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return present[-1] - present[0] if len(present) >= 2 else None


def summarize(samples: pl.DataFrame, window_s: float, names: dict[int, str]) -> list[GpuSummary]:
    """Per GPU (every GPU in `names`, and any other that has samples): energy, power, peak and mean memory,
    mean utilization and SM clock over the window (time-weighted, as `integrate` says)."""
    out = []
    for index in sorted(set(names) | set(samples["gpu_index"].unique().to_list())):
        own = samples.filter(pl.col("gpu_index") == index).sort("t_s")
        t = own["t_s"].to_list()
        power = own["power_w"].to_list()
        memory = own["memory_used_mib"].to_list()
        energy = integrate(t, power, window_s)
        out.append(
            GpuSummary(
                gpu_index=index,
                name=names.get(index),
                samples=own.height,
                energy_j=energy,
                energy_counter_j=_counter_delta(own["energy_counter_j"].to_list()),
                mean_power_w=None if energy is None else energy / window_s,
                max_power_w=_max(power),
                peak_memory_mib=_max(memory),
                mean_memory_mib=_time_mean(t, memory, window_s),
                mean_utilization_pct=_time_mean(t, own["utilization_pct"].to_list(), window_s),
                mean_sm_clock_mhz=_time_mean(t, own["sm_clock_mhz"].to_list(), window_s),
                first_sample_s=t[0] if t else None,
                last_sample_s=t[-1] if t else None,
            )
        )
    return out


class GpuTelemetry(GpuSampler):
    """The sampler of a cell's measured window, with the window's per-GPU summaries and files."""

    @classmethod
    def for_launcher(cls, launcher: str, **kwargs: Any) -> GpuTelemetry:
        """The sampler for a deployment of `launcher`: this host's GPUs only where the engine runs here."""
        if launcher in _LOCAL_LAUNCHERS:
            return cls(**kwargs)
        return cls(
            absent_because=f"the engine was not launched on this host (launcher {launcher}); this host's "
            "GPUs need not be its GPUs (docs/telemetry.md: what a cluster launch needs)",
            **kwargs,
        )

    def frame(self) -> pl.DataFrame:
        """The samples so far, in gpu_samples.parquet's columns."""
        return pl.DataFrame(self.rows(), schema=GPU_SAMPLE_SCHEMA, orient="row")

    def document(self) -> GpuTelemetryDocument:
        """What gpu_telemetry.json holds (stop() first; a sampler never stopped is stopped here)."""
        self.stop()
        samples = self.frame()
        window = self.window_s
        gpus = summarize(samples, window, self.names) if window and self.state != "absent" else []
        return GpuTelemetryDocument(
            state=self.state,  # type: ignore[arg-type]  # one of TELEMETRY_STATES, set above
            status=self.status,
            source=self.source,
            interval_s=self.interval_s,
            window_s=window,
            samples_file=layout.GPU_SAMPLES if samples.height else None,
            gpus=gpus,
            errors=self.errors,
            read_failures=self.read_failures,
        )

    def write(self, directory: Path) -> GpuTelemetryDocument:
        """gpu_telemetry.json, and gpu_samples.parquet when there are samples, into a cell's directory."""
        doc = self.document()
        write_json(Path(directory) / layout.GPU_TELEMETRY, doc)
        if doc.samples_file:
            self.frame().write_parquet(Path(directory) / layout.GPU_SAMPLES)
        return doc
