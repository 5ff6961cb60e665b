"""Reading this host's GPUs during a measured window: NVML through `nvidia-ml-py` (`import pynvml`), polled
every `interval_s` on a thread (plus NVML's own energy counter where the GPU has one); else `nvidia-smi
--query-gpu=... -lms N`, streaming CSV lines read on a thread; else nothing, recorded as absent with why.

The standard library only (pynvml is imported when a window opens), so that the sampler runs in any Python
that can see the GPUs: `benchmarks/gpu_telemetry_check.py --record` runs it on a GPU host whose Python has
no polars and analyses the samples elsewhere. Summaries and the cell's files: tasks/metrics/gpu_telemetry.py.
"""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
from dataclasses import dataclass
from typing import Any

DEFAULT_INTERVAL_S = 0.1
SMI_QUERY = "index,name,memory.used,power.draw,clocks.sm,utilization.gpu"
_MIB = 1024 * 1024
_KEPT_ERRORS = 5
_IMPORT_PYNVML = object()  # the default `nvml`: import pynvml when the window opens


@dataclass(frozen=True)
class Reading:
    """One GPU at one moment (units of GPU_SAMPLE_SCHEMA; None: not reported)."""

    gpu_index: int
    memory_used_mib: float | None
    power_w: float | None
    sm_clock_mhz: float | None
    utilization_pct: float | None
    energy_counter_j: float | None = None


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class NvmlSource:
    """Every GPU through NVML: `nvml` is the `pynvml` module, or anything with its function names (the tests
    pass a fake). A reading the GPU does not support (NVMLError) is None, and is not asked again."""

    name = "nvml"

    def __init__(self, nvml: Any) -> None:
        self.nvml = nvml
        self.error_type: type[BaseException] = getattr(nvml, "NVMLError", Exception)
        nvml.nvmlInit()
        try:
            count = int(nvml.nvmlDeviceGetCount())
            self.handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
            self.names = {i: _text(nvml.nvmlDeviceGetName(h)) for i, h in enumerate(self.handles)}
        except BaseException:
            nvml.nvmlShutdown()
            raise
        self.unsupported: set[tuple[int, str]] = set()

    def _get(self, index: int, what: str, read: Any) -> float | None:
        if (index, what) in self.unsupported:
            return None
        try:
            return float(read())
        except self.error_type:  # not supported on this GPU (power on some boards, the energy counter)
            self.unsupported.add((index, what))
            return None

    def read(self) -> list[Reading]:
        nvml = self.nvml
        out = []
        for i, h in enumerate(self.handles):
            memory = self._get(i, "memory", lambda h=h: nvml.nvmlDeviceGetMemoryInfo(h).used)
            power_mw = self._get(i, "power", lambda h=h: nvml.nvmlDeviceGetPowerUsage(h))
            clock = self._get(i, "clock", lambda h=h: nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_SM))
            util = self._get(i, "util", lambda h=h: nvml.nvmlDeviceGetUtilizationRates(h).gpu)
            energy_mj = self._get(i, "energy", lambda h=h: nvml.nvmlDeviceGetTotalEnergyConsumption(h))
            out.append(
                Reading(
                    gpu_index=i,
                    memory_used_mib=None if memory is None else memory / _MIB,
                    power_w=None if power_mw is None else power_mw / 1000,
                    sm_clock_mhz=clock,
                    utilization_pct=util,
                    energy_counter_j=None if energy_mj is None else energy_mj / 1000,
                )
            )
        return out

    def close(self) -> None:
        self.nvml.nvmlShutdown()


def _smi_number(field: str) -> float | None:
    """A value of nvidia-smi's CSV (nounits): '[N/A]', '[Not Supported]' and the like are None."""
    try:
        return float(field)
    except ValueError:
        return None


def parse_smi_line(line: str) -> tuple[Reading, str]:
    """One line of `--query-gpu=index,name,memory.used,power.draw,clocks.sm,utilization.gpu --format=csv,
    noheader,nounits` as (reading, GPU name). ValueError when it is not such a line. The name is whatever lies
    between the index and the last four fields (a name may hold a comma)."""
    fields = [f.strip() for f in line.split(",")]
    if len(fields) < 6:
        raise ValueError(f"expected 6 fields, got {len(fields)}: {line!r}")
    memory, power, clock, util = (_smi_number(f) for f in fields[-4:])
    return Reading(int(fields[0]), memory, power, clock, util), ", ".join(fields[1:-4])


class GpuSampler:
    """Samples every GPU of this host from `start()` to `stop()` (the measured window) on a thread.

    `nvml`: the pynvml module or a stand-in with its names (default: `import pynvml`; None: do not use
    NVML); `nvidia_smi`: the command to fall back on, looked up on PATH (None: do not). `absent_because`:
    record absent without looking (the engine is on another host). start and stop are quick and idempotent.
    """

    def __init__(
        self,
        *,
        interval_s: float = DEFAULT_INTERVAL_S,
        nvml: Any = _IMPORT_PYNVML,
        nvidia_smi: str | None = "nvidia-smi",
        absent_because: str | None = None,
    ) -> None:
        if interval_s <= 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s}")
        self.interval_s = interval_s
        self._nvml = nvml
        self._smi = nvidia_smi
        self.state = "absent"
        self.status = (
            f"absent: {absent_because}" if absent_because else "absent: the measured window never opened"
        )
        self.source: str | None = None
        self.names: dict[int, str] = {}
        self.errors: list[str] = []
        self.read_failures = 0
        self.started_at: float | None = None  # time.perf_counter() of start and stop: the window
        self.stopped_at: float | None = None
        self._absent_because = absent_because
        self._rows: list[dict[str, float | int | None]] = []
        self._lock = threading.Lock()
        self._halt = threading.Event()
        self._thread: threading.Thread | None = None
        self._nvml_source: NvmlSource | None = None
        self._process: subprocess.Popen[str] | None = None

    # ------------------------------------------------------------------------------------------ the window

    def start(self) -> None:
        if self.started_at is not None:
            return
        self.started_at = time.perf_counter()
        if self._absent_because:
            return
        reasons = [self._start_nvml()]
        if self.source is None:
            reasons.append(self._start_smi())
        if self.source is None:
            self.status = "absent: " + " and ".join(r for r in reasons if r)
        else:
            self.state, self.status = "ok", "ok"

    def stop(self) -> None:
        if self.started_at is None or self.stopped_at is not None:
            return
        self.stopped_at = time.perf_counter()
        self._halt.set()
        if self._process is not None:  # its reader ends when nvidia-smi does
            self._stop_smi()
        elif self._thread is not None:
            self._thread.join(timeout=max(5.0, 3 * self.interval_s))
        if self._nvml_source is not None:
            self._sample_nvml()  # the window's closing edge, measured rather than held
            self._nvml_source.close()

    @property
    def window_s(self) -> float | None:
        if self.started_at is None or self.stopped_at is None:
            return None
        return self.stopped_at - self.started_at

    # ---------------------------------------------------------------------------------------------- NVML

    def _start_nvml(self) -> str | None:
        """Start polling NVML; or why not (None: it started)."""
        nvml = self._nvml
        if nvml is None:
            return "no NVML (not asked for)"
        if nvml is _IMPORT_PYNVML:
            try:
                import pynvml as nvml
            except ImportError:
                return "no NVML (nvidia-ml-py not installed)"
        try:
            source = NvmlSource(nvml)
        except Exception as exc:  # no driver, no library, no permission: NVML cannot be used here
            return f"no NVML ({exc or type(exc).__name__})"
        if not source.handles:
            source.close()
            return "no NVML GPU (NVML lists none)"
        self._nvml_source, self.source, self.names = source, "nvml", dict(source.names)
        self._thread = threading.Thread(target=self._poll, name="gpu telemetry (nvml)", daemon=True)
        self._thread.start()
        return None

    def _poll(self) -> None:
        next_tick = time.perf_counter()
        while not self._halt.is_set():
            self._sample_nvml()
            next_tick += self.interval_s
            now = time.perf_counter()
            if now > next_tick:  # a slow reading: skip the ticks it covered rather than bunch them up
                next_tick += self.interval_s * ((now - next_tick) // self.interval_s + 1)
            self._halt.wait(next_tick - now)

    def _sample_nvml(self) -> None:
        assert self._nvml_source is not None and self.started_at is not None
        try:
            readings = self._nvml_source.read()
        except Exception as exc:  # never let a reading fail the cell: count it and go on
            self._failed(f"{type(exc).__name__}: {exc}")
            return
        self._keep(time.perf_counter() - self.started_at, readings)

    # ---------------------------------------------------------------------------------------- nvidia-smi

    def _start_smi(self) -> str | None:
        """Start nvidia-smi streaming CSV lines; or why not (None: it started)."""
        if self._smi is None:
            return "no nvidia-smi (not asked for)"
        executable = shutil.which(self._smi)
        if executable is None:
            return f"no {self._smi} on PATH"
        argv = [
            executable,
            f"--query-gpu={SMI_QUERY}",
            "--format=csv,noheader,nounits",
            "-lms",
            str(max(1, round(self.interval_s * 1000))),
        ]
        try:
            self._process = subprocess.Popen(
                argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1
            )
        except OSError as exc:
            return f"{self._smi} could not start ({exc})"
        self.source = "nvidia-smi"
        self._thread = threading.Thread(target=self._read_smi, name="gpu telemetry (smi)", daemon=True)
        self._thread.start()
        return None

    def _read_smi(self) -> None:
        assert self._process is not None and self._process.stdout is not None
        assert self.started_at is not None
        for line in self._process.stdout:  # ends when nvidia-smi exits or is stopped
            if not line.strip():
                continue
            at = time.perf_counter() - self.started_at  # the line's arrival: nvidia-smi prints as it reads
            try:
                reading, name = parse_smi_line(line)
            except ValueError as exc:
                self._failed(str(exc))
                continue
            self.names.setdefault(reading.gpu_index, name)
            self._keep(at, [reading])

    def _stop_smi(self) -> None:
        process = self._process
        assert process is not None
        exited_early = process.poll()
        if exited_early is None:
            process.terminate()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if self._thread is not None:  # the reader owns stdout: it ends at its end of file
            self._thread.join(timeout=5)
        stderr = process.stderr.read() if process.stderr is not None else ""
        for stream in (process.stdout, process.stderr):
            if stream is not None:
                stream.close()
        if exited_early is not None:  # it died inside the window: say so, keep what it gave
            why = (stderr or "").strip().splitlines()[:1] or [f"exit status {exited_early}"]
            had = "no sample" if not self._rows else f"{len(self._rows)} samples"
            what = "absent" if not self._rows else "failed"
            self.state = what
            self.status = f"{what}: nvidia-smi exited during the window ({why[0]}; {had})"
        elif not self._rows:
            self.state = "failed"
            self.status = f"failed: nvidia-smi gave no sample within the {self.window_s or 0:.3f} s window"

    # ------------------------------------------------------------------------------------------ the rows

    def _keep(self, t_s: float, readings: list[Reading]) -> None:
        with self._lock:
            for r in readings:
                self._rows.append(
                    {
                        "t_s": t_s,
                        "gpu_index": r.gpu_index,
                        "memory_used_mib": r.memory_used_mib,
                        "power_w": r.power_w,
                        "sm_clock_mhz": r.sm_clock_mhz,
                        "utilization_pct": r.utilization_pct,
                        "energy_counter_j": r.energy_counter_j,
                    }
                )

    def _failed(self, reason: str) -> None:
        with self._lock:
            self.read_failures += 1
            if len(self.errors) < _KEPT_ERRORS:
                self.errors.append(reason)

    def rows(self) -> list[dict[str, float | int | None]]:
        """The samples so far, one dict per GPU and sample, in gpu_samples.parquet's columns."""
        with self._lock:
            return list(self._rows)
