"""GPU telemetry per cell (tasks/metrics/gpu_telemetry.py, docs/telemetry.md): the sampler against a fake NVML
(pynvml's names over planted traces, handed in as `nvml`) and a fake `nvidia-smi` on PATH (a script that
prints planted CSV lines), energy integration against the planted power, peak memory, absent recorded as
absent (never zeros), the warehouse's rows and view, and the real engine's cells (this machine has no GPU)."""

from __future__ import annotations

import json
import math
import shutil
import stat
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import polars as pl
import pytest
from warehouse_fixtures import RawBuilder, make_spec

from artifacts import layout
from artifacts.documents.gpu_telemetry import GpuTelemetryDocument
from tasks.metrics.gpu_sampler import SMI_QUERY, parse_smi_line
from tasks.metrics.gpu_telemetry import GpuTelemetry, integrate

_MIB = 1024 * 1024

# ----------------------------------------------------------------------------------------------- fake NVML


class FakeNvmlError(Exception):
    """pynvml.NVMLError's stand-in."""


@dataclass
class PlantedGpu:
    """A GPU's readings as functions of seconds since the fake's origin; None: the GPU does not report it."""

    name: str
    power_w: Callable[[float], float] | None
    memory_mib: Callable[[float], float]
    utilization_pct: float = 75.0
    sm_clock_mhz: float = 1980.0
    # the integral of power_w from the origin (NVML's counter, in joules); None: no counter on this GPU
    energy_j: Callable[[float], float] | None = None


@dataclass
class FakeNvml:
    """The functions of pynvml that the sampler calls, reading the planted traces at the time of the call."""

    gpus: list[PlantedGpu]
    origin: float = field(default_factory=time.perf_counter)
    init_error: str | None = None
    inits: int = 0
    shutdowns: int = 0

    NVMLError = FakeNvmlError
    NVML_CLOCK_SM = 1

    def _t(self) -> float:
        return time.perf_counter() - self.origin

    def nvmlInit(self) -> None:
        if self.init_error:
            raise FakeNvmlError(self.init_error)
        self.inits += 1

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetName(self, handle: int) -> bytes:
        return self.gpus[handle].name.encode()  # older pynvml answers bytes

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> SimpleNamespace:
        return SimpleNamespace(
            used=int(self.gpus[handle].memory_mib(self._t()) * _MIB), total=141 * 1024 * _MIB
        )

    def nvmlDeviceGetPowerUsage(self, handle: int) -> int:
        power = self.gpus[handle].power_w
        if power is None:
            raise FakeNvmlError("Not Supported")
        return round(power(self._t()) * 1000)  # milliwatts

    def nvmlDeviceGetClockInfo(self, handle: int, clock: int) -> int:
        assert clock == self.NVML_CLOCK_SM
        return int(self.gpus[handle].sm_clock_mhz)

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> SimpleNamespace:
        return SimpleNamespace(gpu=self.gpus[handle].utilization_pct, memory=10)

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: int) -> int:
        energy = self.gpus[handle].energy_j
        if energy is None:
            raise FakeNvmlError("Not Supported")
        return round(energy(self._t()) * 1000)  # millijoules


def _ramp(t: float) -> float:  # W: linear, so trapezoids between samples are exact
    return 100.0 + 200.0 * t


def _ramp_energy(t: float) -> float:  # J: its integral from the origin
    return 100.0 * t + 100.0 * t * t


def _memory_peak(t: float) -> float:  # MiB: a plateau of 0.3 s at the peak, which 50 ms samples cannot miss
    return 30_000.0 if 0.3 <= t < 0.6 else 1_000.0 + 100.0 * t


def _run(telemetry: GpuTelemetry, seconds: float) -> None:
    telemetry.start()
    time.sleep(seconds)
    telemetry.stop()


def test_energy_from_a_fake_nvml_matches_the_planted_power(tmp_path: Path) -> None:
    nvml = FakeNvml(
        [
            PlantedGpu("NVIDIA H200", _ramp, _memory_peak, energy_j=_ramp_energy),
            PlantedGpu("NVIDIA H200", None, lambda t: 512.0, utilization_pct=0.0),  # no power reading
        ]
    )
    telemetry = GpuTelemetry(interval_s=0.05, nvml=nvml, nvidia_smi=None)
    _run(telemetry, 1.0)
    doc = telemetry.write(tmp_path)
    assert (doc.state, doc.status, doc.source) == ("ok", "ok", "nvml")
    assert nvml.inits == 1 and nvml.shutdowns == 1
    assert telemetry.started_at is not None and telemetry.stopped_at is not None
    begin, end = telemetry.started_at - nvml.origin, telemetry.stopped_at - nvml.origin
    planted = _ramp_energy(end) - _ramp_energy(begin)
    first, second = doc.gpus
    assert first.energy_j is not None and math.isclose(first.energy_j, planted, rel_tol=1e-3)
    assert first.mean_power_w is not None and math.isclose(
        first.mean_power_w, planted / (end - begin), rel_tol=1e-3
    )
    # NVML's counter covers first to last sample (the last taken as the sampler stopped)
    assert first.energy_counter_j is not None and first.first_sample_s is not None
    assert first.last_sample_s is not None
    counted = _ramp_energy(begin + first.last_sample_s) - _ramp_energy(begin + first.first_sample_s)
    assert math.isclose(first.energy_counter_j, counted, rel_tol=1e-2)
    assert first.peak_memory_mib == pytest.approx(30_000.0, abs=1e-3)
    assert first.mean_utilization_pct == pytest.approx(75.0) and first.mean_sm_clock_mhz == pytest.approx(
        1980.0
    )
    assert first.name == "NVIDIA H200" and first.samples >= 8  # 1 s at 50 ms, even on busy cores
    # a GPU that reports no power has no energy: null, never 0
    assert second.energy_j is None and second.mean_power_w is None and second.energy_counter_j is None
    assert second.peak_memory_mib == pytest.approx(512.0) and second.mean_utilization_pct == 0.0
    # the raw samples are the cell's: one parquet file, both GPUs
    samples = pl.read_parquet(tmp_path / layout.GPU_SAMPLES)
    assert doc.samples_file == layout.GPU_SAMPLES
    assert samples.group_by("gpu_index").len().sort("gpu_index")["len"].to_list() == [
        first.samples,
        second.samples,
    ]
    assert samples.filter(pl.col("gpu_index") == 1)["power_w"].is_null().all()
    assert GpuTelemetryDocument.model_validate_json((tmp_path / layout.GPU_TELEMETRY).read_text()) == doc


def test_integration_holds_the_edges_and_ignores_what_is_not_reported() -> None:
    # a step from 100 W to 300 W at 0.5 s, samples every 0.1 s from 0.05 s; window 1.0 s
    times = [0.05 + 0.1 * i for i in range(10)]
    power = [100.0 if t < 0.5 else 300.0 for t in times]
    # held edges: 100 W over [0, 0.05], 300 W over [0.95, 1.0]; the step's sampled ramp between 0.45 and 0.55
    assert integrate(times, power, 1.0) == pytest.approx(200.0)
    # a sample outside the window shapes the edge only by interpolation (50 W at 0, then 100 W from 0.5 s)
    assert integrate([-0.5, 0.5], [0.0, 100.0], 1.0) == pytest.approx((50 + 100) / 2 * 0.5 + 100 * 0.5)
    assert integrate([0.1, 0.2], [None, None], 1.0) is None  # nothing reported: no figure, not 0
    assert integrate([], [], 1.0) is None
    assert integrate([0.5], [250.0], 2.0) == pytest.approx(500.0)  # one sample held over the window


def test_a_failing_nvml_falls_back_and_says_why(tmp_path: Path) -> None:
    nvml = FakeNvml([], init_error="NVML Shared Library Not Found")
    telemetry = GpuTelemetry(nvml=nvml, nvidia_smi=str(tmp_path / "nowhere" / "nvidia-smi"))
    _run(telemetry, 0.05)
    doc = telemetry.document()
    assert doc.state == "absent" and doc.gpus == [] and doc.source is None
    assert doc.status.startswith("absent: no NVML (NVML Shared Library Not Found) and no ")
    assert doc.status.endswith("nvidia-smi on PATH")
    empty = GpuTelemetry(nvml=FakeNvml([]), nvidia_smi=None)
    _run(empty, 0.01)
    assert (
        empty.document().status == "absent: no NVML GPU (NVML lists none) and no nvidia-smi (not asked for)"
    )


# --------------------------------------------------------------------------------------------- nvidia-smi

_FAKE_SMI = """#!{python}
# A fake nvidia-smi: --query-gpu=... --format=csv,noheader,nounits -lms N prints one line per GPU every N ms.
import sys, time, json
argv = sys.argv[1:]
open({argv_file!r}, "w").write(json.dumps(argv))
if {fail!r}:
    time.sleep(0.05)
    sys.stderr.write("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\\n")
    sys.exit(9)
interval = int(argv[argv.index("-lms") + 1]) / 1000
n = 0
while True:
    memory = 70000 if n == 5 else 20000 + n
    print(f"0, NVIDIA H200, {{memory}}, 250.00, 1980, 87", flush=True)
    print(f"1, NVIDIA H200, 1024, [N/A], 345, 0", flush=True)
    n += 1
    time.sleep(interval)
"""


def _fake_smi(directory: Path, *, fail: bool = False) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    script = directory / "nvidia-smi"
    argv_file = directory / "argv.json"
    script.write_text(_FAKE_SMI.format(python=sys.executable, argv_file=str(argv_file), fail=fail))
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return argv_file


def test_the_nvidia_smi_fallback_reads_the_planted_lines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    argv_file = _fake_smi(tmp_path / "bin")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{Path(sys.executable).parent}:/usr/bin:/bin")
    telemetry = GpuTelemetry(interval_s=0.05, nvml=None)
    _run(telemetry, 1.5)
    doc = telemetry.write(tmp_path)
    assert json.loads(argv_file.read_text()) == [
        f"--query-gpu={SMI_QUERY}",
        "--format=csv,noheader,nounits",
        "-lms",
        "50",
    ]
    assert (doc.state, doc.source) == ("ok", "nvidia-smi")
    first, second = doc.gpus
    assert doc.window_s is not None
    # constant 250 W, its first and last line held to the edges: exactly 250 W x the window
    assert first.energy_j == pytest.approx(250.0 * doc.window_s, rel=1e-9)
    assert first.peak_memory_mib == 70_000.0  # the one planted line at the peak
    assert first.mean_utilization_pct == pytest.approx(87.0) and first.mean_sm_clock_mhz == pytest.approx(
        1980.0
    )
    assert first.energy_counter_j is None  # nvidia-smi has no energy counter in this query
    assert second.energy_j is None and second.max_power_w is None  # [N/A]: not reported, not 0
    assert second.peak_memory_mib == 1024.0 and first.name == second.name == "NVIDIA H200"
    assert (
        first.samples >= 5
        and pl.read_parquet(tmp_path / layout.GPU_SAMPLES).height == first.samples + second.samples
    )


def test_an_nvidia_smi_without_a_driver_is_absent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_smi(tmp_path / "bin", fail=True)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:/usr/bin:/bin")
    telemetry = GpuTelemetry(interval_s=0.05, nvml=None)
    _run(telemetry, 0.6)
    doc = telemetry.document()
    assert doc.state == "absent" and doc.gpus == []
    assert doc.status == (
        "absent: nvidia-smi exited during the window (NVIDIA-SMI has failed because it couldn't communicate "
        "with the NVIDIA driver.; no sample)"
    )


def test_smi_lines_parse_names_with_commas_and_missing_values() -> None:
    reading, name = parse_smi_line("3, NVIDIA H100 80GB HBM3, rev 1, 81000, [Not Supported], 1755, 100")
    assert name == "NVIDIA H100 80GB HBM3, rev 1"
    assert (reading.gpu_index, reading.memory_used_mib, reading.power_w) == (3, 81000.0, None)
    with pytest.raises(ValueError, match="expected 6 fields"):
        parse_smi_line("0, H200, 1")


# ------------------------------------------------------------------------------------------------- absent


def test_this_machine_records_absent_never_zero(tmp_path: Path) -> None:
    """The defaults (import pynvml, nvidia-smi on PATH) on this GPU-less machine: absent, and why."""
    if shutil.which("nvidia-smi"):
        pytest.skip("this machine has nvidia-smi: the GPU path is tested above and by the H200 script")
    telemetry = GpuTelemetry()
    _run(telemetry, 0.05)
    doc = telemetry.write(tmp_path)
    assert doc.state == "absent" and doc.status.startswith("absent: no NVML (")
    assert doc.status.endswith("and no nvidia-smi on PATH") and doc.gpus == []
    assert doc.samples_file is None and not (tmp_path / layout.GPU_SAMPLES).exists()


def test_a_remote_engine_is_not_sampled_here() -> None:
    nvml = FakeNvml([PlantedGpu("NVIDIA H200", _ramp, _memory_peak)])
    telemetry = GpuTelemetry.for_launcher("slurm", nvml=nvml)
    _run(telemetry, 0.05)
    doc = telemetry.document()
    assert nvml.inits == 0 and doc.state == "absent" and doc.gpus == []
    assert doc.status.startswith("absent: the engine was not launched on this host (launcher slurm)")
    never = GpuTelemetry.for_launcher("local", nvml=nvml).document()  # a window that never opened
    assert never.status == "absent: the measured window never opened" and nvml.inits == 0


def test_a_bad_interval_is_refused() -> None:
    with pytest.raises(ValueError, match="interval_s must be > 0"):
        GpuTelemetry(interval_s=0)


# ------------------------------------------------------------------------------------------------ warehouse


def test_the_warehouse_holds_per_gpu_rows_and_absent_cells(tmp_path: Path) -> None:
    from analysis.data import load_campaign
    from analysis.report_sections import gpu_telemetry_section
    from warehouse.db import reader
    from warehouse.ingest import ingest_raw

    builder = RawBuilder(tmp_path / "raw", spec=make_spec(repeats=1, concurrencies=(1,)))
    builder.write_all(captures=False)
    cells = sorted(p for p in layout.cells_dir(builder.campaign_dir).iterdir())
    measured, absent, older = cells[0], cells[1], cells[2]
    nvml = FakeNvml([PlantedGpu("NVIDIA H200", _ramp, _memory_peak, energy_j=_ramp_energy)] * 2)
    telemetry = GpuTelemetry(interval_s=0.05, nvml=nvml, nvidia_smi=None)
    _run(telemetry, 0.3)
    doc = telemetry.write(measured)
    GpuTelemetry(nvml=None, nvidia_smi=None).write(absent)  # never opened: absent
    db = tmp_path / "w.duckdb"
    report = ingest_raw(builder.raw_dir, db)
    assert report.ok, report.quarantined
    with reader(db) as con:
        view = con.sql("FROM v_gpu_telemetry ORDER BY cell_key, gpu_index").pl()
        windows = con.sql("FROM gpu_telemetry_cells ORDER BY cell_key").pl()
    assert windows.height == 2  # the cell without gpu_telemetry.json is not this kind's artifact
    rows = {
        name: view.filter(pl.col("cell_key").str.ends_with(name)) for name in (measured.name, absent.name)
    }
    gpus = rows[measured.name]
    assert gpus["gpu_index"].to_list() == [0, 1] and (gpus["telemetry_state"] == "ok").all()
    tokens = gpus["completion_tokens"][0]
    assert tokens > 0
    assert gpus["energy_j"].to_list() == pytest.approx([g.energy_j for g in doc.gpus])
    assert gpus["energy_per_output_token_j"].to_list() == pytest.approx(
        [g.energy_j / tokens for g in doc.gpus]
    )  # type: ignore[operator]
    assert gpus["cell_energy_j"][0] == pytest.approx(sum(g.energy_j for g in doc.gpus))  # type: ignore[misc]
    assert gpus["peak_memory_mib"].to_list() == pytest.approx([g.peak_memory_mib for g in doc.gpus])
    none = rows[absent.name]
    assert none.height == 1 and none["gpu_index"][0] is None and none["energy_j"][0] is None
    assert none["telemetry_status"][0] == "absent: the measured window never opened"
    assert none["cell_energy_j"][0] is None  # absent, not 0
    unrecorded = view.filter(pl.col("cell_key").str.ends_with(older.name))
    assert unrecorded["telemetry_state"].to_list() == ["not recorded"]
    # the report's section: a row per measured GPU, "absent (why)" for the others, no zero anywhere
    with reader(db) as con:
        data = load_campaign(con, builder.campaign_id)
    body = gpu_telemetry_section(data.gpu_telemetry).body
    assert body.count("0: NVIDIA H200") == 1 and body.count("1: NVIDIA H200") == 1
    assert "1 cell: absent (the measured window never opened)" in body
    others = len(cells) - 2
    plural = "s" if others != 1 else ""
    assert f"{others} cell{plural}: not recorded (the cell was written before GPU telemetry)" in body


def test_an_absent_document_that_lists_gpus_is_quarantined(tmp_path: Path) -> None:
    from warehouse.ingest import ingest_raw

    builder = RawBuilder(tmp_path / "raw", spec=make_spec(repeats=1, concurrencies=(1,)))
    builder.write_all(captures=False)
    cell = sorted(layout.cells_dir(builder.campaign_dir).iterdir())[0]
    bad = {
        "state": "absent",
        "status": "absent: no GPU",
        "interval_s": 0.1,
        "gpus": [{"gpu_index": 0, "samples": 0}],
    }
    (cell / layout.GPU_TELEMETRY).write_text(json.dumps(bad))
    report = ingest_raw(builder.raw_dir, tmp_path / "w.duckdb")
    (quarantined,) = report.quarantined
    assert quarantined.kind == "gpu_telemetry" and "an absent window lists GPUs" in quarantined.message


# ------------------------------------------------------------------------------------------------- a cell


def _emulated_cell(emulator, tmp_path: Path, launcher: str) -> Path:
    """One cell through run_cell against the emulator, its deployment said to be `launcher`'s."""
    from emulator_cells import emulator_cell

    from experiments.spec import LoadSpec

    emulator.configure(ttft_ms=20, step_ms=10)
    outcome = emulator_cell(
        emulator,
        tmp_path,
        LoadSpec(concurrencies=(2,), requests=24, warmup=2),
        deployment_id=f"gpu.{launcher}.l1",
        campaign_id="gpu-telemetry",
        prompt_count=4,
        tokens=16,
        launcher=launcher,
    )
    assert outcome.status == "ok", outcome.summary.error
    return outcome.path


def test_a_cell_samples_its_measured_window(
    emulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """run_cell's hook (tasks/cell.py `_Window`): the local launcher's cell starts the sampler as its window
    opens and stops it as it closes; here pynvml finds no library, so the fake nvidia-smi on PATH answers."""
    _fake_smi(tmp_path / "bin")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{Path(sys.executable).parent}:/usr/bin:/bin")
    cell = _emulated_cell(emulator, tmp_path, "local")
    doc = GpuTelemetryDocument.model_validate_json((cell / layout.GPU_TELEMETRY).read_text())
    summary = json.loads((cell / layout.SUMMARY).read_text())
    before, after = summary["measured_window_s"]
    assert (doc.state, doc.source) == ("ok", "nvidia-smi") and doc.window_s is not None
    # the sampler's window holds the measured requests' (it opens in before_measured, closes in after_measured)
    assert 0 < doc.window_s - (after - before) < 0.5
    assert doc.gpus[0].energy_j == pytest.approx(250.0 * doc.window_s, rel=1e-9)
    assert pl.read_parquet(cell / layout.GPU_SAMPLES)["t_s"].max() <= doc.window_s + 0.2  # type: ignore[operator]
    remote = _emulated_cell(emulator, tmp_path / "remote", "slurm")
    remote_doc = GpuTelemetryDocument.model_validate_json((remote / layout.GPU_TELEMETRY).read_text())
    assert remote_doc.state == "absent" and "not launched on this host (launcher slurm)" in remote_doc.status


# ---------------------------------------------------------------------------------------------- the engine


@pytest.mark.engine
def test_the_real_engine_cells_record_telemetry_as_absent(demo_campaign: dict) -> None:
    """The session's campaign on the embedded engine (vLLM on this GPU-less machine): every cell attempt has
    gpu_telemetry.json saying absent and why, and v_gpu_telemetry shows it with null figures."""
    from warehouse.db import reader

    cells = sorted(layout.cells_dir(Path(demo_campaign["directory"])).iterdir())
    assert cells
    for cell in cells:
        doc = GpuTelemetryDocument.model_validate_json((cell / layout.GPU_TELEMETRY).read_text())
        assert doc.state == "absent" and doc.gpus == [] and doc.status.startswith("absent: no NVML (")
    with reader() as con:
        view = con.sql(
            "FROM v_gpu_telemetry WHERE campaign_id = $c", params={"c": demo_campaign["campaign_id"]}
        ).pl()
    assert view.height > 0 and (view["telemetry_state"] == "absent").all()
    assert view["energy_j"].is_null().all() and view["cell_energy_j"].is_null().all()
