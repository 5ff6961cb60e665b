"""One cell end to end: scrape /metrics, run the load, scrape again, summarise, write the immutable artifact.

A cell that fails (engine died, every request failed, /metrics unreachable) is still written, with
`status: "failed"` and the reason, and with every request record that was made: nothing is lost.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import polars as pl

from artifacts import layout
from artifacts.documents import GAUGE_SCHEMA, CellMeta, CellSummary, HostLoad
from artifacts.store import atomic_dir, write_json
from experiments.plan import CellPlan
from experiments.spec import SLO, LoadSpec, Sampling
from specgauge.errors import CounterReset, MetricsError
from specgauge.provenance import host_facts, tool_facts, utc_now
from tasks.drafters.swap import current_drafter
from tasks.launch.base import Deployment
from tasks.load.client import StreamingClient
from tasks.load.dask_clusters import shared_client
from tasks.load.dask_load import CellHooks, ServerAccess, run_load_dask
from tasks.load.records import RequestRecord, records_frame
from tasks.load.runner import LoadPlan, LoadResult, run_load
from tasks.load.workers import resolve_workers, run_load_workers
from tasks.metrics import host_load
from tasks.metrics.gauges import GaugeSampler
from tasks.metrics.gpu_telemetry import GpuTelemetry
from tasks.metrics.prometheus import (
    SpecDelta,
    ascrape,
    counter_delta,
    has_spec_decode,
    spec_decode_delta,
)
from tasks.metrics.summary import summarize_cell
from workloads.schema import Corpus, Prompt

log = logging.getLogger("specgauge.cell")


@dataclass(frozen=True)
class CellOutcome:
    cell_id: str
    path: Path
    status: str  # "ok" or "failed"
    summary: CellSummary  # what summary.json holds


def load_plan(cell: CellPlan, load: LoadSpec, seed: int) -> LoadPlan:
    return LoadPlan(
        mode=cell.mode,  # type: ignore[arg-type]
        concurrency=cell.concurrency,
        rate=cell.rate,
        arrival=load.arrival,
        requests=load.requests_at(cell.concurrency),
        warmup=load.warmup_at(cell.concurrency),
        time_cap_s=load.time_cap_s,
        seed=seed,
        window_s=load.window_s if cell.mode == "closed" else None,
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
        self.gpu = GpuTelemetry.for_launcher(deployment.launcher)  # GPUs over the window (docs/telemetry.md)

    async def _scrape(self) -> str | None:
        try:
            return await ascrape(self.deployment.metrics_url, headers=self.deployment.headers(), timeout_s=10)
        except MetricsError as exc:
            self.problems.append(str(exc))
            return None

    async def open(self) -> None:
        self.before = await self._scrape()
        self.before_at = time.perf_counter()
        self.gpu.start()

    async def close(self) -> None:
        self.gpu.stop()
        self.after_at = time.perf_counter()
        self.after = await self._scrape()


def _gauge_sampler(deployment: Deployment, load: LoadSpec, t0: float) -> GaugeSampler:
    """The server's gauges sampled through the cell, on the records' clock (t0)."""
    return GaugeSampler(
        deployment.metrics_url,
        deployment.served_model_name,
        t0=t0,
        interval_s=load.gauge_interval_s,
        headers=deployment.headers(),
    )


async def _measure(
    deployment: Deployment,
    prompts: Sequence[Prompt],
    plan: LoadPlan,
    sampling: Sampling,
    load: LoadSpec,
    records: list[RequestRecord],
    on_record: Callable[[RequestRecord], None] | None,
    workers: int = 1,
    cluster_facts: dict[str, Any] | None = None,
) -> tuple[Any, _Window, pl.DataFrame, int]:
    window = _Window(deployment)
    t0 = time.perf_counter()
    cluster_facts = {} if cluster_facts is None else cluster_facts

    def keep(record: RequestRecord) -> None:
        records.append(record)
        if on_record is not None:
            on_record(record)

    url, model = deployment.base_url, deployment.served_model_name
    authorization = deployment.authorization()  # Bearer api key, or Basic from the URL's userinfo
    measure: Callable[[], Awaitable[LoadResult]]
    if load.cluster is not None:  # a share per worker of a Dask cluster, across hosts (tasks/load/dask_load)
        client = await asyncio.to_thread(shared_client, load.cluster)  # opened once, kept for the next cells
        measure = partial(
            run_load_dask,
            client,
            ServerAccess(url, model, authorization=authorization, timeout_s=load.request_timeout_s),
            prompts,
            plan,
            sampling,
            CellHooks(before_measured=window.open, after_measured=window.close, on_record=keep, t0=t0),
            max_clock_offset_ms=load.cluster.max_clock_offset_ms,
            max_clock_uncertainty_ms=load.cluster.max_clock_uncertainty_ms,
            start_timeout_s=load.cluster.start_timeout_s,
            facts=cluster_facts,  # filled as soon as known: a failed cell records its hosts too
        )
    else:  # the streams split over worker processes, each its own client (tasks/load/workers), or this one
        here = (
            partial(run_load_workers, url, model, prompts, plan, sampling, workers)
            if workers > 1
            else partial(_run_load_here, url, model, prompts, plan, sampling)
        )
        measure = partial(
            here,
            authorization=authorization,
            timeout_s=load.request_timeout_s,
            before_measured=window.open,
            after_measured=window.close,
            on_record=keep,
            t0=t0,  # one clock for records, gauges and the window's scrape times
        )
    async with _gauge_sampler(deployment, load, t0) as sampler:
        result = await measure()
        return result, window, sampler.frame(), sampler.failures


async def _run_load_here(
    base_url: str,
    model: str,
    prompts: Sequence[Prompt],
    plan: LoadPlan,
    sampling: Sampling,
    *,
    authorization: str | None,
    timeout_s: float,
    **hooks: Any,
) -> LoadResult:
    """`run_load` from this process, through one client (the keywords of `run_load_workers`)."""
    streaming = StreamingClient(
        base_url, model, authorization=authorization, timeout_s=timeout_s, max_connections=plan.connections()
    )
    async with streaming as client:
        return await run_load(client, prompts, plan, sampling, **hooks)


@dataclass(frozen=True)
class EngineWarmup:
    """What warm_engine sent: per concurrency, its requests and how many of them ended ok."""

    loads: tuple[tuple[int, int, int], ...]  # (C, requests, ok)
    seconds: float

    def describe(self) -> str:
        return ", ".join(f"C={c}: {ok}/{n} ok" for c, n, ok in self.loads) + f" in {self.seconds:.1f} s"


def warm_engine(
    deployment: Deployment,
    concurrencies: Sequence[int],
    prompts: Sequence[Prompt],
    sampling: Sampling,
    *,
    timeout_s: float = 300.0,
    time_cap_s: float = 600.0,
) -> EngineWarmup:
    """An unmeasured closed-loop burst of C requests at each concurrency C, in turn, through the cells' own
    client: the engine's first batches at a size (CPU kernels, allocator, graphs) are then behind it. Its
    records are dropped. Never raises for a failed request; one that fails is counted, not ok."""

    async def bursts() -> EngineWarmup:
        started = time.perf_counter()
        loads = []
        streaming = StreamingClient(
            deployment.base_url,
            deployment.served_model_name,
            authorization=deployment.authorization(),
            timeout_s=timeout_s,
            max_connections=max(concurrencies, default=1),
        )
        async with streaming as client:
            for c in concurrencies:
                plan = LoadPlan("closed", concurrency=c, requests=c, warmup=0, time_cap_s=time_cap_s)
                result = await run_load(client, prompts, plan, sampling)
                loads.append((c, len(result.records), sum(r.ok for r in result.records)))
        return EngineWarmup(tuple(loads), time.perf_counter() - started)

    return asyncio.run(bursts())


def prompt_fit_problems(
    deployment: Deployment, prompts: Sequence[Prompt], sampling: Sampling, *, timeout_s: float = 30.0
) -> tuple[list[str], str | None]:
    """Prompts that cannot be served as asked: prompt tokens plus max_tokens above the server's
    max_model_len. vLLM refuses a prompt longer than its context (HTTP 400) and silently shortens
    max_tokens when only the answer does not fit, which would change what is measured. Tokens are counted
    by the server's own `/tokenize` (chat template included), so no tokenizer is needed here.

    Returns (one problem per prompt, naming its id; why the check was skipped, or None). Servers without a
    vLLM-style `/tokenize` (gateways, the emulator) skip the check; their requests still fail one by one,
    classified, if a prompt does not fit.
    """
    problems: list[str] = []
    url = f"{deployment.base_url}/tokenize"
    with httpx.Client(timeout=timeout_s, headers=deployment.headers()) as client:
        for prompt in prompts:
            body = {
                "model": deployment.served_model_name,
                "messages": prompt.chat_messages(),
                "add_generation_prompt": True,
            }
            try:
                response = client.post(url, json=body)
            except httpx.HTTPError as exc:
                return [], f"{url} unreachable ({type(exc).__name__}: {exc})"
            if response.status_code != 200:
                return [], f"{url} answered HTTP {response.status_code}"
            try:
                answer = response.json()
                count = int(answer["count"])
                limit = int(answer.get("max_model_len") or deployment.max_model_len or 0)
            except (ValueError, KeyError, TypeError):
                return [], f"{url} did not answer vLLM's {{count, max_model_len}}"
            if limit <= 0:
                return [], "the server's max_model_len is unknown"
            max_tokens = sampling.max_tokens or prompt.max_tokens
            if count > limit:
                problems.append(
                    f"prompt {prompt.id!r}: {count} prompt tokens exceed max_model_len {limit} "
                    "(the server refuses it)"
                )
            elif count + max_tokens > limit:
                problems.append(
                    f"prompt {prompt.id!r}: {count} prompt tokens + max_tokens {max_tokens} exceed "
                    f"max_model_len {limit} (the server would cut its answer to {limit - count} tokens)"
                )
    return problems, None


@dataclass
class _Measured:
    """What a cell's load left behind, whatever stopped it: every request record made, the window's
    scrapes, the gauges, and why it failed or was interrupted."""

    records: list[RequestRecord]
    window: _Window
    gauges: pl.DataFrame
    gauge_failures: int = 0
    result: Any = None  # the load run's result; None when it did not finish
    cluster: dict[str, Any] = field(default_factory=dict)  # where a load.cluster's load ran (dask_load)
    cpu: host_load.HostShares | None = None
    error: str | None = None
    interrupted: BaseException | None = None


def _workers(
    cell: CellPlan, load: LoadSpec, plan: LoadPlan, prompts: Sequence[Prompt], sampling: Sampling
) -> int:
    try:
        return resolve_workers(load.workers, plan, prompts, sampling)
    except (RuntimeError, OSError) as exc:  # `auto` could not measure the client: one process, as before
        log.warning("cell %s: workers auto could not be resolved (%s); using one process", cell.cell_id, exc)
        return 1


def _workers_used(measured: _Measured, workers: int) -> int:
    """The cell's client processes: the Dask shares of a cluster's load, else the resolved `load.workers`."""
    return int(measured.cluster["workers"]) if "workers" in measured.cluster else workers


def _cluster_facts(load: LoadSpec, measured: _Measured) -> dict[str, Any]:
    """Where a cluster's load ran, for the meta: the kind, the scheduler, each host's workers and clock offset
    against the scheduler (tasks/load/dask_load.py), as far as the cell got; nothing for this host's load."""
    if load.cluster is None:
        return {}
    return {"cluster": {"kind": load.cluster.kind, **measured.cluster}}


def _measure_cell(
    deployment: Deployment,
    cell: CellPlan,
    prompts: Sequence[Prompt],
    plan: LoadPlan,
    sampling: Sampling,
    load: LoadSpec,
    on_record: Callable[[RequestRecord], None] | None,
    workers: int,
) -> _Measured:
    """Run the cell's load unless its prompts cannot be served as asked. Never raises: a failure or an
    interruption is noted in what it returns, with the records made until then."""
    measured = _Measured(records=[], window=_Window(deployment), gauges=pl.DataFrame(schema=GAUGE_SCHEMA))
    misfits, skipped = prompt_fit_problems(deployment, prompts, sampling)
    if skipped:
        log.info("cell %s: prompt lengths not checked: %s", cell.cell_id, skipped)
    if misfits:  # refused before any request: a cell whose prompts cannot run as asked measures nothing
        measured.error = (
            f"{len(misfits)} of {len(prompts)} prompts do not fit the model's context: " + "; ".join(misfits)
        )
        log.error("cell %s refused: %s", cell.cell_id, measured.error)
        return measured
    cpu_before = host_load.snapshot()
    try:
        measured.result, measured.window, measured.gauges, measured.gauge_failures = asyncio.run(
            _measure(
                deployment,
                prompts,
                plan,
                sampling,
                load,
                measured.records,
                on_record,
                workers,
                measured.cluster,
            )
        )
        measured.records = measured.result.records
        measured.cpu = host_load.shares(cpu_before, host_load.snapshot())
    except Exception as exc:  # the cell is recorded as failed with everything measured so far
        measured.error = f"{type(exc).__name__}: {exc}"
        log.exception("cell %s failed", cell.cell_id)
    except BaseException as exc:
        # Ctrl-C, SIGTERM, a cancelled flow run: write what was measured, then stop.
        measured.interrupted = exc
        measured.error = (
            f"interrupted ({type(exc).__name__}): stopped before it finished; the requests that ended "
            "are kept"
        )
        log.warning("cell %s interrupted; writing what it measured", cell.cell_id)
    return measured


def _server_figures(
    deployment: Deployment, window: _Window
) -> tuple[SpecDelta | None, int | None, list[str]]:
    """The speculation and generated-token deltas between the window's scrapes, and what kept them from
    being read (a scrape missing, a counter reset)."""
    spec = None
    generation_delta = None
    problems = list(window.problems)
    if window.before is not None and window.after is not None:
        try:
            if deployment.variant.speculative and has_spec_decode(window.after, deployment.served_model_name):
                spec = spec_decode_delta(window.before, window.after, deployment.served_model_name)
            generation_delta = counter_delta(
                window.before, window.after, "vllm:generation_tokens", deployment.served_model_name
            )
        except CounterReset as exc:
            problems.append(f"counter reset (server restarted): {exc}")
        except MetricsError as exc:
            problems.append(str(exc))
    return spec, generation_delta, problems


def _cell_summary(
    frame: pl.DataFrame,
    measured: _Measured,
    spec: SpecDelta | None,
    generation_delta: int | None,
    slo: SLO,
) -> CellSummary:
    result = measured.result
    window_s = None
    if result is not None and result.measured_start_s is not None and result.measured_end_s is not None:
        window_s = (result.measured_start_s, result.measured_end_s)
    summary = summarize_cell(
        frame,
        spec=spec,
        generation_tokens_delta=generation_delta,
        gauges=measured.gauges,
        slo=slo,
        measured_window=window_s,
        gauge_scrape_failures=measured.gauge_failures,
    )
    cpu = measured.cpu
    if cpu is not None:
        summary.host = HostLoad(
            cpus=cpu.cpus,
            busy_share=cpu.busy,
            ours_share=cpu.ours,
            other_share=cpu.other,
            steal_share=cpu.steal,
        )
    return summary


def _judge(
    summary: CellSummary,
    error: str | None,
    server_problems: list[str],
    drafter_before: dict[str, Any] | None,
    drafter_after: dict[str, Any] | None,
) -> None:
    """Set the summary's status and error: the measurement's own error first, else the first of every
    request failed, the server's /metrics unusable, the drafter swapped during the cell."""
    counts = summary.requests
    assert counts is not None  # summarize_cell always counts
    if error is None and counts.total and counts.ok == 0:
        error = "every measured request failed: " + ", ".join(
            f"{k}={v}" for k, v in (counts.errors or {}).items()
        )
    if server_problems:
        # Without both /metrics scrapes the cell's server-side figures (speculation, token cross-check) are
        # missing or wrong: the cell is failed (design.md), its request records are kept.
        summary.server_valid = False
        summary.server_problem = "; ".join(server_problems)
        restarted = [p for p in server_problems if "counter reset" in p]
        if error is None and restarted:
            error = "the server restarted during the cell (a counter went down): " + restarted[0]
        elif error is None:
            error = "the server's /metrics could not be used: " + "; ".join(server_problems)
    swapped = (drafter_before or {}).get("sha256") != (drafter_after or {}).get("sha256")
    if error is None and swapped:  # the window measured two heads: neither's figures
        error = (
            f"the drafter was swapped during the cell ({(drafter_before or {}).get('sha256')} -> "
            f"{(drafter_after or {}).get('sha256')})"
        )
    summary.status = "failed" if error else "ok"
    summary.error = error


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
    measurement problem; raises only if the artifact itself cannot be written, or, after writing what was
    measured (status failed), the interruption (KeyboardInterrupt, SIGTERM) that stopped it."""
    # Where its artifact goes, checked before a request is sent: a cell id that cannot be a folder under
    # cells_dir (a hostile stratum or variant name) fails now, not after the measurement it would lose.
    layout.next_cell_attempt(cells_dir, cell.cell_id)
    prompts = corpus.stratum(cell.workload)
    plan = load_plan(cell, load, seed)
    workers = _workers(cell, load, plan, prompts, sampling)
    started = utc_now()
    drafter = current_drafter(deployment)  # the head serving as the cell starts (a hot swap changes it)
    measured = _measure_cell(deployment, cell, prompts, plan, sampling, load, on_record, workers)
    frame = records_frame(measured.records)
    spec, generation_delta, server_problems = _server_figures(deployment, measured.window)
    summary = _cell_summary(frame, measured, spec, generation_delta, slo)
    drafter_after = current_drafter(deployment)
    _judge(summary, measured.error, server_problems, drafter, drafter_after)

    final, attempt = layout.next_cell_attempt(cells_dir, cell.cell_id)
    meta = CellMeta.model_validate(
        {
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
                "requests": load.requests_at(cell.concurrency),  # this cell's own counts
                "warmup": load.warmup_at(cell.concurrency),
                "time_cap_s": load.time_cap_s,
                "request_timeout_s": load.request_timeout_s,
                "seed": seed,
                "workers": _workers_used(measured, workers),
                **_cluster_facts(load, measured),
            },
            "sampling": sampling.model_dump(mode="json"),
            "endpoint": "chat",
            "deployment": {**deployment.to_json(), "drafter": drafter_after},  # the head it measured
            "tool": tool_facts(),
            "host": host_facts(),
            "t0_utc": measured.result.t0_utc if measured.result is not None else started,
            "started_utc": started,
            "ended_utc": utc_now(),
            "capped": bool(measured.result.capped) if measured.result is not None else None,
            "attempt": attempt,
        }
    )
    window = measured.window
    with atomic_dir(final) as tmp:
        write_json(tmp / layout.META, meta)
        write_json(tmp / layout.SUMMARY, summary)
        frame.write_parquet(tmp / layout.REQUESTS)
        measured.gauges.write_parquet(tmp / layout.GAUGES)
        window.gpu.write(tmp)  # gpu_telemetry.json: its figures, or absent and why
        (tmp / layout.METRICS_BEFORE).write_text(window.before or "")
        (tmp / layout.METRICS_AFTER).write_text(window.after or "")
    if measured.interrupted is not None:
        raise measured.interrupted
    return CellOutcome(cell_id=cell.cell_id, path=final, status=summary.status, summary=summary)
