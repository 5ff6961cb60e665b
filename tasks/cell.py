"""One cell end to end: scrape /metrics, run the load, scrape again, summarise, write the immutable artifact.

A cell that fails (engine died, every request failed, /metrics unreachable) is still written, with
`status: "failed"` and the reason, and with every request record that was made: nothing is lost.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from experiments.plan import CellPlan
from experiments.spec import SLO, LoadSpec, Sampling
from specgauge.errors import CounterReset, MetricsError
from specgauge.provenance import host_facts, tool_facts, utc_now
from tasks.artifacts import atomic_dir, next_cell_dir, write_json
from tasks.launch.base import Deployment
from tasks.load.client import StreamingClient
from tasks.load.records import RequestRecord, records_frame
from tasks.load.runner import LoadPlan, run_load
from tasks.metrics.gauges import GAUGE_SCHEMA, GaugeSampler
from tasks.metrics.prometheus import ascrape, counter_delta, has_spec_decode, spec_decode_delta
from tasks.metrics.summary import summarize_cell
from workloads.schema import Corpus, Prompt

log = logging.getLogger("specgauge.cell")


@dataclass(frozen=True)
class CellOutcome:
    cell_id: str
    path: Path
    status: str  # "ok" or "failed"
    summary: dict[str, Any]


def load_plan(cell: CellPlan, load: LoadSpec, seed: int) -> LoadPlan:
    return LoadPlan(
        mode=cell.mode,  # type: ignore[arg-type]
        concurrency=cell.concurrency,
        rate=cell.rate,
        arrival=load.arrival,
        requests=load.requests,
        warmup=load.warmup,
        time_cap_s=load.time_cap_s,
        seed=seed,
    )


class _Window:
    """The /metrics texts at the edges of the measured window."""

    def __init__(self, deployment: Deployment) -> None:
        self.deployment = deployment
        self.before: str | None = None
        self.after: str | None = None
        self.before_at: float | None = None  # perf_counter when each scrape answered
        self.after_at: float | None = None
        self.problems: list[str] = []

    async def _scrape(self) -> str | None:
        try:
            return await ascrape(self.deployment.metrics_url, headers=self.deployment.headers(), timeout_s=10)
        except MetricsError as exc:
            self.problems.append(str(exc))
            return None

    async def open(self) -> None:
        self.before = await self._scrape()
        self.before_at = time.perf_counter()

    async def close(self) -> None:
        self.after_at = time.perf_counter()
        self.after = await self._scrape()


async def _measure(
    deployment: Deployment,
    prompts: Sequence[Prompt],
    plan: LoadPlan,
    sampling: Sampling,
    load: LoadSpec,
    records: list[RequestRecord],
    on_record: Callable[[RequestRecord], None] | None,
) -> tuple[Any, _Window, pl.DataFrame, int]:
    window = _Window(deployment)
    t0 = time.perf_counter()

    def keep(record: RequestRecord) -> None:
        records.append(record)
        if on_record is not None:
            on_record(record)

    max_connections = max(plan.concurrency or 0, 64)
    api_key = deployment.api_key.get_secret_value() if deployment.api_key else None
    async with (
        StreamingClient(
            deployment.base_url,
            deployment.served_model_name,
            api_key=api_key,
            timeout_s=load.request_timeout_s,
            max_connections=max_connections,
        ) as client,
        GaugeSampler(
            deployment.metrics_url,
            deployment.served_model_name,
            t0=t0,
            interval_s=load.gauge_interval_s,
            headers=deployment.headers(),
        ) as sampler,
    ):
        result = await run_load(
            client,
            prompts,
            plan,
            sampling,
            before_measured=window.open,
            after_measured=window.close,
            on_record=keep,
        )
        gauges = sampler.frame()
        failures = sampler.failures
    # The sampler's clock started a moment before the runner's: put gauges on the records' clock.
    gauges = gauges.with_columns(pl.col("t_s") + (t0 - result.t0_perf))
    return result, window, gauges, failures


def run_cell(
    deployment: Deployment,
    cell: CellPlan,
    *,
    campaign_id: str,
    repeat: int,
    corpus: Corpus,
    sampling: Sampling,
    load: LoadSpec,
    slo: SLO,
    cells_dir: Path,
    seed: int = 0,
    on_record: Callable[[RequestRecord], None] | None = None,
) -> CellOutcome:
    """Run one cell against a ready deployment and write its artifact (ok or failed). Never raises for a
    measurement problem; raises only if the artifact itself cannot be written."""
    prompts = corpus.stratum(cell.workload)
    plan = load_plan(cell, load, seed)
    records: list[RequestRecord] = []
    started = utc_now()
    error: str | None = None
    result = None
    window = _Window(deployment)
    gauges = pl.DataFrame(schema=GAUGE_SCHEMA)
    gauge_failures = 0
    try:
        result, window, gauges, gauge_failures = asyncio.run(
            _measure(deployment, prompts, plan, sampling, load, records, on_record)
        )
        records = result.records
    except Exception as exc:  # the cell is recorded as failed with everything measured so far
        error = f"{type(exc).__name__}: {exc}"
        log.exception("cell %s failed", cell.cell_id)
    frame = records_frame(records)

    spec = None
    generation_delta = None
    server_problems = list(window.problems)
    if window.before is not None and window.after is not None:
        try:
            if deployment.variant.speculative and has_spec_decode(window.after, deployment.served_model_name):
                spec = spec_decode_delta(window.before, window.after, deployment.served_model_name)
            generation_delta = counter_delta(
                window.before, window.after, "vllm:generation_tokens", deployment.served_model_name
            )
        except CounterReset as exc:
            server_problems.append(f"counter reset (server restarted): {exc}")
        except MetricsError as exc:
            server_problems.append(str(exc))
    measured = None
    if result is not None and result.measured_start_s is not None and result.measured_end_s is not None:
        measured = (result.measured_start_s, result.measured_end_s)
    summary = summarize_cell(
        frame,
        spec=spec,
        generation_tokens_delta=generation_delta,
        gauges=gauges,
        slo=slo,
        measured_window=measured,
    )
    n_measured = summary["requests"]["total"]
    if error is None and n_measured and summary["requests"]["ok"] == 0:
        error = "every measured request failed: " + ", ".join(
            f"{k}={v}" for k, v in summary["requests"]["errors"].items()
        )
    if error is None and server_problems:
        summary["server_valid"] = False
        summary["server_problem"] = "; ".join(server_problems)
        if any("counter reset" in p for p in server_problems):
            error = "the server restarted during the cell (a counter went down): " + server_problems[0]
    summary["status"] = "failed" if error else "ok"
    summary["error"] = error
    summary["gauge_scrape_failures"] = gauge_failures

    meta = {
        "cell_id": cell.cell_id,
        "campaign_id": campaign_id,
        "deployment_id": deployment.id,
        "variant": deployment.variant.model_dump(mode="json"),
        "repeat": repeat,
        "workload": {
            "file": corpus.path,
            "sha256": corpus.sha256,
            "stratum": cell.workload,
            "prompt_ids": [p.id for p in prompts],
        },
        "load": {
            "mode": cell.mode,
            "concurrency": cell.concurrency,
            "rate": cell.rate,
            "arrival": load.arrival,
            "requests": load.requests,
            "warmup": load.warmup,
            "time_cap_s": load.time_cap_s,
            "request_timeout_s": load.request_timeout_s,
            "seed": seed,
        },
        "sampling": sampling.model_dump(mode="json"),
        "endpoint": "chat",
        "deployment": deployment.to_json(),
        "tool": tool_facts(),
        "host": host_facts(),
        "t0_utc": result.t0_utc if result is not None else started,
        "started_utc": started,
        "ended_utc": utc_now(),
        "capped": bool(result.capped) if result is not None else None,
    }
    final = next_cell_dir(cells_dir, cell.cell_id)
    meta["attempt"] = int(final.name.rsplit(".a", 1)[1])
    with atomic_dir(final) as tmp:
        write_json(tmp / "meta.json", meta)
        write_json(tmp / "summary.json", summary)
        frame.write_parquet(tmp / "requests.parquet")
        gauges.write_parquet(tmp / "gauges.parquet")
        (tmp / "metrics_before.txt").write_text(window.before or "")
        (tmp / "metrics_after.txt").write_text(window.after or "")
    return CellOutcome(cell_id=cell.cell_id, path=final, status=summary["status"], summary=summary)
