"""The GPU telemetry sampler (tasks/metrics/gpu_telemetry.py) against a workload of known duration on a real
GPU: idle, then a PyTorch matmul loop for exactly `--seconds` (timed by CUDA events and the host clock), then
idle again, with the sampler running throughout. Prints, per source (NVML, nvidia-smi), what the sampler saw
against what is known: how long utilization stayed high against the loop's measured duration, when it rose
and fell against the loop's start and end, the energy integrated from power against NVML's own energy
counter, and peak memory used against what PyTorch reserved on top of the idle reading.

Needs a CUDA GPU, a Python with torch (CUDA build) and nvidia-ml-py, and this repository on PYTHONPATH. The
analysis needs polars and the project's packages too; where the GPU host's Python lacks them (the device
machine's did: its polars wheel would not fit what a run may carry), `--record FILE` runs the windows there
with the sampler alone (tasks/metrics/gpu_sampler.py: standard library only) and writes what it saw and what
is known, and `--analyze FILE` prints the table from that file on any machine with the project's venv.
Results: docs/telemetry.md, "Validation on a real GPU".

    python benchmarks/gpu_telemetry_check.py [--seconds 10] [--size 8192] [--idle 3] [--interval 0.1]
                                             [--source both|nvml|nvidia-smi] [--device 0] [--record FILE]
    .venv/bin/python benchmarks/gpu_telemetry_check.py --analyze FILE
    .venv/bin/python benchmarks/gpu_telemetry_check.py --absent-cost 200   # any machine: the absent path's cost
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tasks.metrics.gpu_sampler import GpuSampler

_MIB = 1024 * 1024
BUSY_UTILIZATION_PCT = 50.0  # a sample at or above this counts as "high utilization"


@dataclass(frozen=True)
class Known:
    """What the workload did, on the sampler's clock (seconds since its window opened)."""

    loop_start_s: float
    loop_end_s: float
    cuda_s: float  # the loop's duration by CUDA events (start to end, synchronised)
    iterations: int
    tflops: float
    reserved_mib: float  # torch.cuda.max_memory_reserved during the loop


def _matmul_loop(torch: Any, device: int, size: int, seconds: float, telemetry: GpuSampler) -> Known:
    assert telemetry.started_at is not None
    dev = torch.device("cuda", device)
    a = torch.randn(size, size, device=dev, dtype=torch.bfloat16)
    b = torch.randn(size, size, device=dev, dtype=torch.bfloat16)
    out = torch.empty(size, size, device=dev, dtype=torch.bfloat16)
    torch.matmul(a, b, out=out)  # cuBLAS warmed up before the timed loop
    torch.cuda.synchronize(dev)
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    iterations = 0
    loop_start = time.perf_counter()
    begin.record()
    while time.perf_counter() - loop_start < seconds:
        for _ in range(8):  # a batch of launches between host-clock checks keeps the GPU fed
            torch.matmul(a, b, out=out)
        iterations += 8
        torch.cuda.synchronize(dev)
    end.record()
    torch.cuda.synchronize(dev)
    loop_end = time.perf_counter()
    cuda_s = begin.elapsed_time(end) / 1000
    reserved = torch.cuda.max_memory_reserved(dev) / _MIB
    del a, b, out
    torch.cuda.empty_cache()
    return Known(
        loop_start_s=loop_start - telemetry.started_at,
        loop_end_s=loop_end - telemetry.started_at,
        cuda_s=cuda_s,
        iterations=iterations,
        tflops=2 * size**3 * iterations / cuda_s / 1e12,
        reserved_mib=reserved,
    )


def record_one(torch: Any, source: str, args: argparse.Namespace) -> dict[str, Any]:
    """One window on `source`: idle, the loop, idle. What the sampler saw and what is known, as plain data."""
    nvml: Any = None
    if source == "nvml":
        import pynvml

        nvml = pynvml
    sampler = GpuSampler(
        interval_s=args.interval, nvml=nvml, nvidia_smi="nvidia-smi" if source == "nvidia-smi" else None
    )
    sampler.start()
    if sampler.state != "ok":
        raise SystemExit(f"{source}: {sampler.status}")
    time.sleep(args.idle)
    known = _matmul_loop(torch, args.device, args.size, args.seconds, sampler)
    time.sleep(args.idle)
    sampler.stop()
    return {
        "source": source,
        "device": args.device,
        "interval_s": args.interval,
        "state": sampler.state,
        "status": sampler.status,
        "window_s": sampler.window_s,
        "names": sampler.names,
        "errors": sampler.errors,
        "read_failures": sampler.read_failures,
        "rows": sampler.rows(),
        "known": asdict(known),
    }


def _fmt(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def analyze_one(window: dict[str, Any]) -> dict[str, str]:
    """The table's column for one recorded window, summarised by the cell's own code (summarize)."""
    import polars as pl  # here, not at the top: --record runs where polars is not installed

    from artifacts.documents.gpu_telemetry import GPU_SAMPLE_SCHEMA
    from tasks.metrics.gpu_telemetry import summarize

    known = Known(**window["known"])
    device, interval = window["device"], window["interval_s"]
    frame = pl.DataFrame(window["rows"], schema=GPU_SAMPLE_SCHEMA, orient="row")
    names = {int(k): v for k, v in window["names"].items()}
    gpu = next(g for g in summarize(frame, window["window_s"], names) if g.gpu_index == device)
    samples = frame.filter(pl.col("gpu_index") == device).sort("t_s")
    idle_memory = samples.filter(pl.col("t_s") < known.loop_start_s)["memory_used_mib"].min()
    busy = samples.filter(pl.col("utilization_pct") >= BUSY_UTILIZATION_PCT)["t_s"]
    rise, fall = (busy.min(), busy.max()) if busy.len() else (None, None)
    busy_s = None if rise is None or fall is None else fall - rise + interval  # type: ignore[operator]
    return {
        "source": window["source"],
        "GPU": f"{device}: {gpu.name}",
        "samples (read failures)": f"{gpu.samples} ({window['read_failures']})",
        "loop s (CUDA events)": _fmt(known.cuda_s),
        f"util >= {BUSY_UTILIZATION_PCT:.0f}% s": _fmt(busy_s),
        "rise - loop start s": _fmt(None if rise is None else rise - known.loop_start_s),  # type: ignore[operator]
        "fall - loop end s": _fmt(None if fall is None else fall - known.loop_end_s),  # type: ignore[operator]
        "energy J (power)": _fmt(gpu.energy_j, 1),
        "energy J (NVML counter)": _fmt(gpu.energy_counter_j, 1),
        "mean W / max W": f"{_fmt(gpu.mean_power_w, 1)} / {_fmt(gpu.max_power_w, 1)}",
        "peak memory MiB": _fmt(gpu.peak_memory_mib, 0),
        "idle memory + torch reserved MiB": _fmt(
            None if idle_memory is None else float(idle_memory) + known.reserved_mib,  # type: ignore[arg-type]
            0,
        ),
        "mean SM MHz": _fmt(gpu.mean_sm_clock_mhz, 0),
        "matmul TFLOP/s": _fmt(known.tflops, 1),
        "window s": _fmt(window["window_s"]),
    }


def print_table(record: dict[str, Any]) -> None:
    rows = [analyze_one(w) for w in record["windows"]]
    print(f"# recorded {record['recorded_utc']} UTC on {record['host']}: {record['command']}")
    for line in record.get("environment", []):
        print(f"# {line}")
    width = max(len(k) for k in rows[0])
    for key in rows[0]:
        print(f"{key:<{width}}  " + "  ".join(f"{r[key]:>28}" for r in rows))


def absent_cost(windows: int) -> None:
    """What telemetry adds to a cell where there is no GPU (every cell of the CPU engine): start, stop and
    writing gpu_telemetry.json, the defaults' probes (import pynvml, nvmlInit, PATH lookup) included."""
    import tempfile

    from tasks.metrics.gpu_telemetry import GpuTelemetry

    times = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(windows):
            directory = Path(tmp) / str(i)
            directory.mkdir()
            began = time.perf_counter()
            telemetry = GpuTelemetry()
            telemetry.start()
            telemetry.stop()
            doc = telemetry.write(directory)
            times.append(time.perf_counter() - began)
    ordered = sorted(times)
    print(f"# {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime())} UTC, {' '.join(sys.argv)}")
    print(f"status: {doc.status}")
    print(
        f"{windows} windows: median {ordered[len(ordered) // 2] * 1e3:.2f} ms, "
        f"max {ordered[-1] * 1e3:.2f} ms, first {times[0] * 1e3:.2f} ms (the import of pynvml)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="the matmul loop's duration")
    parser.add_argument("--size", type=int, default=8192, help="square bf16 matrices of this size")
    parser.add_argument("--idle", type=float, default=3.0, help="idle seconds before and after the loop")
    parser.add_argument("--interval", type=float, default=0.1, help="the sampler's interval (s)")
    parser.add_argument("--source", choices=["both", "nvml", "nvidia-smi"], default="both")
    parser.add_argument("--device", type=int, default=0)
    parser.add_argument(
        "--absent-cost", type=int, metavar="N", help="no GPU needed: time N windows of the absent path"
    )
    parser.add_argument(
        "--record", type=Path, metavar="FILE", help="write the windows to FILE, do not analyse"
    )
    parser.add_argument("--analyze", type=Path, metavar="FILE", help="print the table of a --record FILE")
    args = parser.parse_args()
    if args.absent_cost:
        absent_cost(args.absent_cost)
        return
    if args.analyze:
        print_table(json.loads(args.analyze.read_text()))
        return
    try:
        import torch
    except ImportError:
        raise SystemExit("needs torch with CUDA: pip install torch") from None
    if not torch.cuda.is_available():
        raise SystemExit("no CUDA GPU here: this check needs one (docs/telemetry.md)")
    sources = ["nvml", "nvidia-smi"] if args.source == "both" else [args.source]
    record = {
        "recorded_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
        "host": platform.node(),
        "command": " ".join(sys.argv),
        "environment": [
            f"torch {torch.__version__}, CUDA {torch.version.cuda}, {torch.cuda.get_device_name(args.device)}"
        ],
        "windows": [record_one(torch, source, args) for source in sources],
    }
    if args.record:
        args.record.write_text(json.dumps(record))
        print(f"recorded {len(record['windows'])} windows to {args.record}")
        return
    print_table(record)


if __name__ == "__main__":
    main()
