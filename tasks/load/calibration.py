"""The client's own error, measured at the start of every campaign on the machine that runs its load.

The in-repo emulator (emulator/) serves in its own process with a known time to first token and step time;
the campaign's client (tasks.load: the same StreamingClient and run_load the cells use) drives it at the
campaign's highest concurrency. Per successful measured request:

- TTFT error = measured TTFT - injected TTFT; TPOT error = measured TPOT - injected step time;
- send lag = the emulator's arrival stamp - the client's send stamp (both CLOCK_MONOTONIC, so they compare
  across processes; requests are paired in send order with arrivals in order);
- emulator lateness = its first write - arrival - injected TTFT: inside the TTFT error, not the client's fault.

The errors are what the client adds to every latency it reports at that load on this machine; the analysis
(analysis.validity) compares them with the smallest latency differences the campaign reports. Peers
(vLLM's `bench serve`, GuideLLM, AIPerf) report no error bar on their own timing.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from artifacts import layout
from artifacts.documents import ClientCalibrationDocument
from artifacts.store import read_document, write_json_atomic
from emulator import EmulatorConfig, EmulatorProcess
from experiments.spec import ExperimentSpec, Sampling
from specgauge.provenance import host_facts, tool_facts
from tasks.load.runner import LoadPlan, LoadResult, run_load_sync
from workloads.schema import Prompt

MODEL = "emulated"
TTFT_MS = 50.0
TOKENS = 32
# The emulator polls for the last 1.5 ms before each write so that its own lateness stays in the tens of
# microseconds (benchmarks/client_accuracy.py measured it); it costs a busy core for the calibration's seconds.
SPIN_MS = 1.5


def step_ms(concurrency: int) -> float:
    """A step that grows with the batch as an engine's does: 10 ms up to C=250, then 0.04 ms a request."""
    return max(10.0, concurrency * 0.04)


@dataclass(frozen=True)
class CalibrationLoad:
    mode: str  # closed | open
    concurrency: int  # closed: workers; open: the mean in flight (Little's law)
    rate: float | None
    requests: int


def calibration_load(spec: ExperimentSpec) -> CalibrationLoad:
    """The campaign's heaviest load: its highest concurrency (closed loop), else its highest rate (open)."""
    requests = spec.validity.calibration_requests
    if spec.load.concurrencies:
        c = max(spec.load.concurrencies)
        return CalibrationLoad("closed", c, None, max(requests, c))
    rates = list(spec.load.rates) or [spec.capacity.max_rps if spec.capacity else 1.0]
    rate = max(rates)
    duration_s = (TTFT_MS + (TOKENS - 1) * step_ms(1)) / 1000
    concurrency = max(1, round(rate * duration_s))
    return CalibrationLoad("open", concurrency, rate, max(requests, concurrency))


def _prompts(n: int = 16) -> list[Prompt]:
    return [
        Prompt(
            id=f"calibration-{i}",
            workload="calibration",
            max_tokens=TOKENS,
            messages=[{"role": "user", "content": f"calibration request {i}"}],
        )
        for i in range(n)
    ]


def _quantiles(values: list[float]) -> tuple[float | None, float | None]:
    if not values:
        return None, None
    return float(np.percentile(values, 50)), float(np.percentile(values, 99))


def summarize(
    result: LoadResult, trace: list[dict[str, Any]], ttft_s: float, step_s: float
) -> dict[str, Any]:
    """The error figures of one calibration run (pure: the client's records and the emulator's trace)."""
    ok = [r for r in result.measured if r.ok and r.ttft_s is not None]
    ttft_errors = [r.ttft_s - ttft_s for r in ok]
    tpot_errors = [r.tpot_s - step_s for r in ok if r.tpot_s is not None]
    sent = sorted(result.t0_perf + r.sent_s for r in ok)
    first_send = min(sent, default=0.0)
    arrivals = sorted(
        (t for t in trace if t.get("received") is not None and t["received"] >= first_send - 1e-4),
        key=lambda t: t["received"],
    )
    lags = [t["received"] - s for s, t in zip(sent, arrivals, strict=False)]
    late = [t["first"] - t["received"] - ttft_s for t in arrivals if t.get("first") is not None]
    out: dict[str, Any] = {"requests_ok": len(ok), "requests_failed": len(result.measured) - len(ok)}
    for name, values in (
        ("ttft_error", ttft_errors),
        ("tpot_error", tpot_errors),
        ("send_lag", lags),
        ("emulator_late", late),
    ):
        p50, p99 = _quantiles(values)
        out[f"{name}_p50_s"], out[f"{name}_p99_s"] = p50, p99
    return out


def calibrate_client(spec: ExperimentSpec, campaign_id: str) -> dict[str, Any]:
    """Run the calibration against a fresh emulator process; the ClientCalibrationDocument's fields."""
    load = calibration_load(spec)
    step = step_ms(load.concurrency)
    config = EmulatorConfig(port=0, model=MODEL, ttft_ms=TTFT_MS, step_ms=step, spin_ms=SPIN_MS, trace=True)
    plan = (
        LoadPlan("closed", concurrency=load.concurrency, requests=load.requests, warmup=load.concurrency)
        if load.mode == "closed"
        else LoadPlan("open", rate=load.rate, requests=load.requests, warmup=load.concurrency, seed=1)
    )
    sampling = Sampling(temperature=0.0, max_tokens=TOKENS, ignore_eos=True)
    started = datetime.now(UTC).isoformat(timespec="seconds")
    with EmulatorProcess(config) as emulator:
        result = run_load_sync(emulator.url, MODEL, _prompts(), plan, sampling, timeout_s=120.0)
        trace = emulator.trace()
    figures = summarize(result, trace, TTFT_MS / 1000, step / 1000)
    return {
        "calibration_id": f"client-{datetime.now(UTC):%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:6]}",
        "campaign_id": campaign_id,
        "started_utc": started,
        "ended_utc": datetime.now(UTC).isoformat(timespec="seconds"),
        "mode": load.mode,
        "concurrency": load.concurrency,
        "rate": load.rate,
        "requests": load.requests,
        "injected_ttft_s": TTFT_MS / 1000,
        "injected_step_s": step / 1000,
        **figures,
    }


def calibrated(directory: Path) -> dict[str, Any] | None:
    """The campaign's stored calibration (the latest), or None: a re-run measures only once."""
    files = layout.calibration_files(directory)
    if not files:
        return None
    return read_document(files[-1], ClientCalibrationDocument).as_written()


def write_calibration(directory: Path, record: dict[str, Any]) -> dict[str, Any]:
    """Write the calibration once (atomically) as calibration/<calibration_id>.json; returns the record."""
    document = ClientCalibrationDocument.model_validate(
        {**record, "tool": tool_facts(), "host": host_facts()}
    )
    write_json_atomic(layout.calibration_file(directory, record["calibration_id"]), document)
    return document.as_written()


def fmt_ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.2f} ms"


def fmt_pair(record: dict[str, Any], name: str) -> str:
    return f"{fmt_ms(record.get(f'{name}_p50_s'))} / {fmt_ms(record.get(f'{name}_p99_s'))}"
