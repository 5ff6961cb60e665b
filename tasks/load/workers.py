"""One cell's load from W client processes: the existing client and runner in each, started together.

One Python process reads about 40k chunks per CPU-second (docs/performance.md "Client accuracy"), less than
a large deployment streams at high concurrency; past that the client, not the server, sets the pace. Here a
cell's streams are split over W worker processes on this host, each running `run_load` with its own
`StreamingClient` on its share:

- **Closed loop** splits C: worker i runs C // W streams, plus one for i < C mod W.
- **Open loop** superposes W independent seeded Poisson streams of rate R / W: their sum is a Poisson
  stream of rate R. Worker i's seed is derived from the cell's seed, W and i (`worker_seed`), so a cell is
  reproducible and its workers' arrivals are independent. Each worker's first arrival is at its window's
  start, as in one process (W arrivals then, not one). An optional in-flight cap is split like C.
- **Requests and prompts** interleave: worker i sends the cell's warm-up and measured requests j with
  j mod W = i, each with the prompt a single process would have given it (j mod P), and its records get
  the cell's indices back, so the merged records are those of one process: W + N, ids unique.
- **Barrier start**: every worker spawns, imports and opens its client, then waits on a barrier with the
  parent; each takes its own t0 when released. A second barrier holds them after warm-up until the parent
  has run `before_measured` (the cell's /metrics scrape on an idle server); the parent runs
  `after_measured` once every worker has finished.
- **No clock sharing**: every figure of a request (TTFT, TPOT, chunk gaps) is a difference of two stamps
  taken by the one process that sent it. On one host the workers' perf_counter (CLOCK_MONOTONIC) is the
  parent's too, so the merged records are moved onto the parent's t0 (for the gauges and the window); the
  start barrier is all the workers need from each other.
- **Records**: each worker appends its records to its own JSON-lines file as they end (one line each,
  flushed), and a small result file when it is done; the parent merges them. A worker that fails (an
  exception, a signal) fails the cell with `WorkerFailed`, naming it and why; the others are stopped, and
  every record any of them wrote is kept.

`workers: auto` (`resolve_workers`) picks W from the cell's expected chunk rate and the client's chunks
per CPU-second measured on this machine (`measure_chunk_capacity`), capped by the cores.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import hashlib
import math
import multiprocessing
import multiprocessing.synchronize
import os
import shutil
import signal
import tempfile
import threading
import time
import traceback
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import orjson

from experiments.spec import Sampling
from tasks.load.client import StreamingClient
from tasks.load.records import RequestRecord
from tasks.load.runner import LoadPlan, LoadResult, run_load
from workloads.schema import Prompt

Hook = Callable[[], Awaitable[None]]
Endpoint = Literal["chat", "completions"]

# The record fields that are times on the cell's clock (moved onto the parent's t0 when merged); the rest
# are durations or offsets from the request's own send.
_CLOCK_FIELDS = ("queued_s", "scheduled_s", "sent_s", "first_token_s", "last_token_s", "ended_s")
START_TIMEOUT_S = 120.0  # spawning W interpreters on a busy 2-core machine takes seconds, not minutes


class WorkerFailed(RuntimeError):
    """A load worker process failed; the cell fails with this message (its records are kept)."""


# -- the split ---------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class WorkerShare:
    """What worker `worker` of `workers` runs: its own plan and prompts, and how its records map back."""

    worker: int
    workers: int
    plan: LoadPlan
    prompts: tuple[Prompt, ...]
    cell_warmup: int  # the cell's warm-up count (measured indices start after it)

    def cell_index(self, phase: str, local_index: int) -> int:
        """The cell's index of this worker's record `local_index` (its own issue order, warm-up first)."""
        if phase == "warmup":
            return self.worker + self.workers * local_index
        return self.cell_warmup + self.worker + self.workers * (local_index - self.plan.warmup)


def _part(total: int, worker: int, workers: int) -> int:
    """Worker's share of `total` things dealt round robin: total // W, plus one for the first total mod W."""
    return total // workers + (1 if worker < total % workers else 0)


def worker_seed(seed: int, worker: int, workers: int) -> int:
    """Worker i's arrival seed: the cell's own with one worker, else derived (independent, reproducible)."""
    if workers == 1:
        return seed
    digest = hashlib.sha256(f"specgauge-load-worker/{seed}/{workers}/{worker}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


def effective_workers(plan: LoadPlan, workers: int) -> int:
    """W that gives every worker at least one stream and one measured request."""
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    limit = plan.requests
    if plan.concurrency is not None:
        limit = min(limit, plan.concurrency)
    return max(1, min(workers, limit))


def split_plan(plan: LoadPlan, prompts: Sequence[Prompt], workers: int) -> list[WorkerShare]:
    """The cell's plan and prompts dealt to `workers` processes (see the module's docstring)."""
    if not prompts:
        raise ValueError("a cell needs at least one prompt")
    w = effective_workers(plan, workers)
    period = len(prompts) // math.gcd(w, len(prompts))
    shares = []
    for i in range(w):
        own = dataclasses.replace(
            plan,
            concurrency=_part(plan.concurrency, i, w) if plan.concurrency is not None else None,
            rate=plan.rate / w if plan.rate is not None else None,
            requests=_part(plan.requests, i, w),
            warmup=_part(plan.warmup, i, w),
            seed=worker_seed(plan.seed, i, w),
        )
        # worker-local request j is the cell's i + W*j, whose prompt is (i + W*j) mod P: a cycle of `period`
        mine = tuple(prompts[(i + w * j) % len(prompts)] for j in range(period))
        shares.append(WorkerShare(i, w, own, mine, plan.warmup))
    return shares


# -- the merge ---------------------------------------------------------------------------------------------------
@dataclass
class WorkerOutcome:
    """One worker's result file, and the records of its records file."""

    worker: int
    records: list[RequestRecord]
    t0_perf: float | None = None
    measured_start_s: float | None = None
    measured_end_s: float | None = None
    capped: bool = False
    notes: list[str] = field(default_factory=list)
    error: str | None = None  # None: it finished
    consequence: bool = False  # it failed because another worker had (a broken barrier)
    cpu_s: float | None = None  # the worker's CPU-seconds from the start barrier to its end


def move_record(share: WorkerShare, record: RequestRecord, shift: float) -> RequestRecord:
    """A worker's record as the cell's: its cell index, its clock fields moved by `shift` seconds (the
    worker's t0 on the parent's clock minus the parent's t0)."""
    changes: dict[str, Any] = {"index": share.cell_index(record.phase, record.index)}
    for name in _CLOCK_FIELDS:
        value = getattr(record, name)
        if value is not None:
            changes[name] = value + shift
    return dataclasses.replace(record, **changes)


def merge_records(
    shares: Sequence[WorkerShare], outcomes: Sequence[WorkerOutcome], t0: float
) -> list[RequestRecord]:
    """Every worker's records with the cell's indices, their times moved onto `t0`; sorted by index."""
    merged: dict[int, RequestRecord] = {}
    for share, outcome in zip(shares, outcomes, strict=True):
        shift = (outcome.t0_perf - t0) if outcome.t0_perf is not None else 0.0
        for record in outcome.records:
            moved = move_record(share, record, shift)
            index = moved.index
            if index in merged:
                raise WorkerFailed(f"load worker {share.worker}: record index {index} given twice")
            merged[index] = moved
    return [merged[i] for i in sorted(merged)]


# -- one worker process -------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class WorkerJob:
    share: WorkerShare
    base_url: str
    model: str
    sampling: Sampling
    records_path: str
    result_path: str
    api_key: str | None = None
    authorization: str | None = None  # a whole Authorization value (StreamingClient)
    timeout_s: float = 300.0
    endpoint: Endpoint = "chat"
    cpus: tuple[int, ...] | None = None  # pin the worker to these CPUs (benchmarks)
    fail: str | None = None  # tests only: "start" raises before the barrier, "warmup" after warm-up


def _wait(barrier: multiprocessing.synchronize.Barrier, timeout_s: float) -> None:
    barrier.wait(timeout=timeout_s)


async def run_share(
    share: WorkerShare,
    sampling: Sampling,
    client_settings: dict[str, Any],
    *,
    start: Callable[[], Awaitable[float | None]],
    warmed_up: Hook,
    keep: Callable[[RequestRecord], None],
    cpu_clock: Callable[[], float] = time.process_time,
) -> tuple[LoadResult, float]:
    """One share of a cell through its own `StreamingClient` (what a worker process and a Dask task both run):
    the client opens, `start()` waits for the cell's start and returns the share's t0 (perf_counter; None:
    now), `run_load` runs the share with `warmed_up` between warm-up and the measured window, `keep` takes
    each record as it ends. Returns the result and the CPU-seconds `cpu_clock` counted from the start on.
    `client_settings` are StreamingClient's keyword arguments (base_url, model, api_key, ...)."""
    async with StreamingClient(**client_settings, max_connections=share.plan.connections()) as client:
        t0 = await start()
        cpu = cpu_clock()
        result = await run_load(
            client, share.prompts, share.plan, sampling, before_measured=warmed_up, on_record=keep, t0=t0
        )
        return result, cpu_clock() - cpu


async def _worker_load(job: WorkerJob, barriers: tuple[Any, Any], out: Any) -> tuple[LoadResult, float]:
    """The worker's share through its own client; also the CPU-seconds it spent from the start barrier on."""
    start_barrier, window_barrier = barriers
    plan = job.share.plan

    def keep(record: RequestRecord) -> None:
        out.write(orjson.dumps(record.as_row()) + b"\n")
        out.flush()

    async def start() -> None:
        if job.fail == "start":
            raise RuntimeError("injected failure before the start barrier (tests)")
        await asyncio.to_thread(_wait, start_barrier, START_TIMEOUT_S)

    async def warmed_up() -> None:
        if job.fail == "warmup":
            raise RuntimeError("injected failure after warm-up (tests)")
        # all workers have warmed up; the parent scrapes /metrics; then all open the measured window. A broken
        # barrier (another worker ended first) stops this one too: no measured window could be aligned
        await asyncio.to_thread(_wait, window_barrier, plan.time_cap_s)
        await asyncio.to_thread(_wait, window_barrier, plan.time_cap_s)

    settings = {
        "base_url": job.base_url,
        "model": job.model,
        "api_key": job.api_key,
        "authorization": job.authorization,
        "timeout_s": job.timeout_s,
        "endpoint": job.endpoint,
    }
    return await run_share(job.share, job.sampling, settings, start=start, warmed_up=warmed_up, keep=keep)


def _worker_main(job: WorkerJob, start_barrier: Any, window_barrier: Any) -> None:
    """A worker process: run the share, write the records file as they end and the result file at the end."""
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # stopped by the parent: end like Ctrl-C
    if job.cpus:
        with contextlib.suppress(OSError):
            os.sched_setaffinity(0, set(job.cpus))
    result: dict[str, Any] = {"worker": job.share.worker}
    code = 0
    with open(job.records_path, "wb") as out:
        try:
            try:
                import uvloop

                loaded, cpu_s = uvloop.run(_worker_load(job, (start_barrier, window_barrier), out))
            except ImportError:  # pragma: no cover - uvloop is a dependency
                loaded, cpu_s = asyncio.run(_worker_load(job, (start_barrier, window_barrier), out))
            result.update(
                t0_perf=loaded.t0_perf,
                measured_start_s=loaded.measured_start_s,
                measured_end_s=loaded.measured_end_s,
                capped=loaded.capped,
                notes=loaded.notes,
                cpu_s=cpu_s,
            )
        except BaseException as exc:  # every failure is reported to the parent, then the worker exits 1
            if isinstance(exc, threading.BrokenBarrierError):
                result["error"] = "stopped: another worker ended first (the barrier was broken)"
                result["consequence"] = True
            else:
                result["error"] = f"{type(exc).__name__}: {exc}"
            result["traceback"] = traceback.format_exc(limit=8)
            code = 1
            for barrier in (start_barrier, window_barrier):
                with contextlib.suppress(Exception):
                    barrier.abort()  # the others stop waiting for this one
    Path(job.result_path).write_bytes(orjson.dumps(result))
    os._exit(code)  # no interpreter teardown: the records are written and flushed


def read_outcome(worker: int, records_path: Path, result_path: Path, exitcode: int | None) -> WorkerOutcome:
    """A worker's records (every complete line) and its result; a worker without a result failed."""
    records = []
    if records_path.exists():
        for line in records_path.read_bytes().splitlines():
            with contextlib.suppress(orjson.JSONDecodeError):  # a line cut by a kill
                records.append(RequestRecord(**orjson.loads(line)))
    outcome = WorkerOutcome(worker, records)
    if result_path.exists():
        result = orjson.loads(result_path.read_bytes())
        outcome.t0_perf = result.get("t0_perf")
        outcome.measured_start_s = result.get("measured_start_s")
        outcome.measured_end_s = result.get("measured_end_s")
        outcome.capped = bool(result.get("capped"))
        outcome.notes = list(result.get("notes") or [])
        outcome.error = result.get("error")
        outcome.consequence = bool(result.get("consequence"))
        outcome.cpu_s = result.get("cpu_s")
    elif exitcode is None:
        outcome.error = "did not end"
    elif exitcode < 0:
        outcome.error = f"killed by signal {-exitcode} ({signal.Signals(-exitcode).name})"
    else:
        outcome.error = f"exited with code {exitcode} without a result"
    if outcome.error is None and exitcode not in (0, None):
        outcome.error = f"exited with code {exitcode}"
    return outcome


# -- the pool ----------------------------------------------------------------------------------------------------
class _Pool:
    """W spawned worker processes, their barriers and their files."""

    def __init__(self, jobs: list[WorkerJob]) -> None:
        self.context = multiprocessing.get_context("spawn")  # never fork a process with threads and loops
        parties = len(jobs) + 1  # the workers and the parent
        self.start_barrier = self.context.Barrier(parties)
        self.window_barrier = self.context.Barrier(parties)
        self.jobs = jobs
        self.processes = [
            self.context.Process(
                target=_worker_main,
                args=(job, self.start_barrier, self.window_barrier),
                name=f"specgauge-load-worker-{job.share.worker}",
                daemon=True,
            )
            for job in jobs
        ]
        self.stop_watching = threading.Event()
        self.stopped: set[int] = set()  # workers the parent stopped (their errors are not the cause)

    def start(self) -> None:
        for process in self.processes:
            process.start()

    def first_failure(self) -> tuple[int, int | None] | None:
        """(worker, exit code) of a worker that ended before its barrier could be passed, or None."""
        for i, process in enumerate(self.processes):
            if not process.is_alive() and process.exitcode != 0:
                return i, process.exitcode
        return None

    def barrier_wait(self, barrier: Any, timeout_s: float) -> bool:
        """Wait with the workers; False if a worker failed (or ended) first or the barrier was broken."""

        def watch() -> None:
            while not self.stop_watching.wait(0.05):
                if any(not p.is_alive() for p in self.processes):
                    with contextlib.suppress(Exception):
                        barrier.abort()
                    return

        self.stop_watching.clear()
        watcher = threading.Thread(target=watch, name="load-worker-watch", daemon=True)
        watcher.start()
        try:
            barrier.wait(timeout=timeout_s)
            return True
        except threading.BrokenBarrierError:
            return False
        finally:
            self.stop_watching.set()
            watcher.join()

    def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM the workers still running, then SIGKILL those that do not end within `grace_s`."""
        started = [p for p in self.processes if p.pid is not None]
        for i, process in enumerate(self.processes):
            if process.pid is not None and process.is_alive():
                self.stopped.add(i)
                with contextlib.suppress(OSError):
                    os.kill(process.pid, signal.SIGTERM)  # type: ignore[arg-type]
        deadline = time.monotonic() + grace_s
        for process in started:
            process.join(max(0.0, deadline - time.monotonic()))
            if process.is_alive():
                process.kill()
                process.join(5)

    def join(self, timeout_s: float) -> None:
        """Wait for every worker to end, but not past the first that fails (the caller stops the rest)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and any(p.is_alive() for p in self.processes):
            if self.first_failure() is not None:
                return
            time.sleep(0.05)


async def run_load_workers(
    base_url: str | Sequence[str],
    model: str,
    prompts: Sequence[Prompt],
    plan: LoadPlan,
    sampling: Sampling,
    workers: int,
    *,
    api_key: str | None = None,
    authorization: str | None = None,
    timeout_s: float = 300.0,
    endpoint: Endpoint = "chat",
    before_measured: Hook | None = None,
    after_measured: Hook | None = None,
    on_record: Callable[[RequestRecord], None] | None = None,
    t0: float | None = None,
    records_dir: Path | None = None,
    cpus: Sequence[Sequence[int]] | None = None,
    fail: dict[int, str] | None = None,
) -> LoadResult:
    """Run one cell's load from `workers` processes (see the module's docstring); W + N records.

    `base_url` may list several servers: worker i uses the (i mod len)-th (benchmarks run an emulator per
    worker). `t0` (perf_counter, default now) is the merged records' origin, as in `run_load`. Records
    files go to `records_dir` (default: a temporary directory, removed after the merge). `cpus[i]` pins
    worker i. `fail` injects a failure into a worker ("start" or "warmup"), for tests. Raises
    `WorkerFailed` after merging (and passing to `on_record`) every record the workers wrote.
    """
    t0 = time.perf_counter() if t0 is None else t0
    urls = [base_url] if isinstance(base_url, str) else list(base_url)
    shares = split_plan(plan, prompts, workers)
    own_dir = records_dir is None
    directory = Path(tempfile.mkdtemp(prefix="specgauge-load-")) if records_dir is None else records_dir
    directory.mkdir(parents=True, exist_ok=True)
    jobs = [
        WorkerJob(
            share=share,
            base_url=urls[share.worker % len(urls)],
            model=model,
            sampling=sampling,
            records_path=str(directory / f"worker-{share.worker}.records.jsonl"),
            result_path=str(directory / f"worker-{share.worker}.result.json"),
            api_key=api_key,
            authorization=authorization,
            timeout_s=timeout_s,
            endpoint=endpoint,
            cpus=tuple(cpus[share.worker % len(cpus)]) if cpus else None,
            fail=(fail or {}).get(share.worker),
        )
        for share in shares
    ]
    pool = _Pool(jobs)
    t0_utc = datetime.fromtimestamp(time.time() - (time.perf_counter() - t0), UTC).isoformat()
    window_open = False
    start_s: float | None = None
    interrupted: BaseException | None = None
    try:
        pool.start()
        started = await asyncio.to_thread(pool.barrier_wait, pool.start_barrier, START_TIMEOUT_S)
        if started:
            warmed = await asyncio.to_thread(pool.barrier_wait, pool.window_barrier, plan.time_cap_s)
            if warmed:
                if before_measured is not None:
                    await before_measured()
                start_s = time.perf_counter() - t0
                window_open = await asyncio.to_thread(pool.barrier_wait, pool.window_barrier, 60.0)
        if window_open or pool.first_failure() is None:
            await asyncio.to_thread(pool.join, plan.time_cap_s + 60.0)
    except BaseException as exc:  # Ctrl-C, SIGTERM, a cancelled flow: stop, keep what was written, re-raise
        interrupted = exc
    finally:
        pool.stop()
    outcomes = [
        read_outcome(
            job.share.worker, Path(job.records_path), Path(job.result_path), pool.processes[i].exitcode
        )
        for i, job in enumerate(jobs)
    ]
    records = merge_records(shares, outcomes, t0)
    if on_record is not None:
        for record in records:
            on_record(record)
    if own_dir:
        shutil.rmtree(directory, ignore_errors=True)
    if interrupted is not None:
        raise interrupted
    # the cause first: a worker that failed by itself, before those the parent stopped because of it
    failed = sorted(
        (o for o in outcomes if o.error is not None), key=lambda o: o.consequence or o.worker in pool.stopped
    )
    if failed:
        first = failed[0]
        others = f" ({len(failed) - 1} more failed after it)" if len(failed) > 1 else ""
        raise WorkerFailed(
            f"load worker {first.worker} of {len(shares)} failed: {first.error}{others}; "
            f"{len(records)} of {plan.warmup + plan.requests} records were written"
        )
    ends = [
        o.measured_end_s + (o.t0_perf - t0)
        for o in outcomes
        if o.measured_end_s is not None and o.t0_perf is not None
    ]
    measured_end = max(ends) if window_open and ends else None
    if window_open and after_measured is not None:
        await after_measured()
    notes = sorted({note for o in outcomes for note in o.notes})
    notes.append(f"load from {len(shares)} worker processes")
    capped = any(o.capped for o in outcomes)
    if not window_open:
        start_s = None
    return LoadResult(records, t0_utc, start_s, measured_end, capped, t0, notes)


# -- workers: auto -----------------------------------------------------------------------------------------------
# A planning figure, not a measurement: the fastest decode step a stream is expected to see (10 ms: 100 chunks
# a second per stream). A closed loop of C streams then delivers at most C / FASTEST_STEP_S chunks a second.
FASTEST_STEP_S = 0.010
# A worker is planned at half the chunks its core can read, so that a burst finds it idle enough to send on
# time (the client's error grows as its loop saturates: docs/performance.md).
HEADROOM = 0.5


def expected_chunk_rate(plan: LoadPlan, prompts: Sequence[Prompt], sampling: Sampling) -> float:
    """Chunks a second the cell is expected to stream, at most: C streams at one chunk per FASTEST_STEP_S in
    closed loop; in open loop the rate times the requested tokens per request (a chunk carries >= 1 token),
    and no more than the in-flight cap's streams could deliver."""
    if plan.mode == "closed":
        assert plan.concurrency is not None
        return plan.concurrency / FASTEST_STEP_S
    assert plan.rate is not None
    tokens = [sampling.max_tokens or p.max_tokens for p in prompts] or [1]
    rate = plan.rate * sum(tokens) / len(tokens)
    if plan.concurrency is not None:
        rate = min(rate, plan.concurrency / FASTEST_STEP_S)
    return rate


def usable_cores() -> int:
    """Cores this process may run on, less one for the parent (its gauges, the merge)."""
    return max(1, len(os.sched_getaffinity(0)) - 1)


def auto_workers(expected_chunks_per_s: float, chunks_per_cpu_s: float, cores: int) -> int:
    """W that keeps each worker at HEADROOM of its core's measured capacity, within `cores`."""
    if chunks_per_cpu_s <= 0:
        raise ValueError(f"chunks_per_cpu_s must be > 0, got {chunks_per_cpu_s}")
    return max(1, min(cores, math.ceil(expected_chunks_per_s / (chunks_per_cpu_s * HEADROOM))))


@functools.cache
def measure_chunk_capacity() -> float:
    """Chunks per CPU-second of this machine's client at a high load: the client and runner against an
    emulator process (closed loop C = 128, 16 tokens a request, 10 ms steps: 4,352 chunks, under a second),
    timed with the thread's CPU clock. Measured once per process."""
    from emulator import EmulatorConfig, EmulatorProcess
    from tasks.load.runner import run_load_sync

    tokens = 16
    config = EmulatorConfig(port=0, model="capacity", ttft_ms=20.0, step_ms=10.0)
    plan = LoadPlan("closed", concurrency=128, requests=256, warmup=16)
    sampling = Sampling(temperature=0.0, max_tokens=tokens, ignore_eos=True)
    prompts = [
        Prompt(
            id=f"capacity-{i}",
            workload="capacity",
            max_tokens=tokens,
            messages=[{"role": "user", "content": "x"}],
        )
        for i in range(8)
    ]
    with EmulatorProcess(config) as emulator:
        cpu = time.thread_time()
        result = run_load_sync(emulator.url, "capacity", prompts, plan, sampling, timeout_s=60.0)
        cpu = time.thread_time() - cpu
    chunks = sum(r.chunks for r in result.records)
    if chunks == 0 or cpu <= 0:
        raise RuntimeError("the client's capacity could not be measured: no chunk arrived from the emulator")
    return chunks / cpu


def resolve_workers(
    setting: int | Literal["auto"],
    plan: LoadPlan,
    prompts: Sequence[Prompt],
    sampling: Sampling,
    *,
    chunks_per_cpu_s: float | None = None,
    cores: int | None = None,
) -> int:
    """The cell's W: the spec's number, or for `auto` the expected chunk rate over the measured capacity;
    never more than the plan can use (a stream and a measured request each)."""
    if setting == "auto":
        capacity = chunks_per_cpu_s if chunks_per_cpu_s is not None else measure_chunk_capacity()
        wanted = auto_workers(expected_chunk_rate(plan, prompts, sampling), capacity, cores or usable_cores())
    else:
        wanted = setting
    return effective_workers(plan, wanted)
