"""One cell's load from worker processes on a Dask cluster, across hosts (issue 32; docs/scale-out.md).

The cell is split as on one host (`tasks/load/workers.py`: `split_plan`, one `WorkerShare` per process,
`run_share` with its own `StreamingClient`); here each share is a Dask task pinned to one worker process
(`workers=[address]`, never moved elsewhere), one share per Dask worker, the workers dealt round robin over
the hosts. What the parent and the tasks share goes through the scheduler's coordination primitives, under
names unique to the cell:

- **Records** reach the parent as they end: each task sends what ended every `FLUSH_S` (and before it reports
  warm-up done) as one batch on a distributed `Queue`; the parent moves each record onto its own clock and
  passes it to `on_record` at once, as one process does. A task's control messages (ready, warmed, done,
  error) go through the same queue, so they arrive after the records sent before them.
- **Clock offsets**: hosts stamp with their own clocks. Each task measures its host's wall clock against the
  scheduler's, NTP-style: 8 request/response exchanges (`client.run_on_scheduler(time.time)`), keeping the
  one with the least round trip: offset = scheduler's time minus the midpoint of the exchange, uncertainty =
  half its round trip (about 0.2-1 ms on one machine). distributed's own `worker.scheduler_delay` is not used:
  it comes from a single heartbeat exchange, whichever its round trip was, and says nothing of its error.
  The parent measures its own offset the same way. A host whose |offset| exceeds `max_clock_offset_ms`, or
  whose uncertainty exceeds `max_clock_uncertainty_ms`, fails the cell (`ClockOffsetExceeded`, naming it).
- **Barrier start**: once every task is ready (client open, offset measured), the parent picks one start
  instant on the scheduler's clock, `START_LEAD_S` ahead, and publishes it (a `Variable`); each task turns it
  into its own clock (instant - its offset) and starts its share there: that is the share's t0. Every share's
  t0 is then the same instant, which is on the parent's perf_counter at `start_perf`; the records are moved
  by start_perf - t0 (`move_record`). TTFT, TPOT and chunk gaps are differences of one host's stamps: no sync.
- **The measured window**: each task reports warm-up done and waits on an `Event`; when all have, the parent
  runs `before_measured` (its /metrics scrape on an idle server) and sets it; `after_measured` runs once every
  share has ended.
- **Failures**: the parent watches the tasks' futures and the scheduler's worker list. A task that fails, a
  Dask worker that leaves the cluster (killed, crashed, its job ended) fails the cell with `WorkerFailed`
  naming the share, the worker's address, host and pid; the other tasks are told to stop (an `Event`), and
  every record any of them had sent is kept (passed to `on_record`, then the exception is raised).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time
import traceback
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import orjson
from distributed import Client, Event, Future, Queue, Variable, get_client, get_worker

from experiments.spec import Sampling
from tasks.load.records import RequestRecord
from tasks.load.runner import LoadPlan, LoadResult
from tasks.load.workers import (
    Endpoint,
    Hook,
    WorkerFailed,
    WorkerOutcome,
    WorkerShare,
    merge_records,
    move_record,
    run_share,
    split_plan,
)
from workloads.schema import Prompt

EXCHANGES = 8  # clock exchanges per host; the one with the least round trip is kept
FLUSH_S = 0.1  # how often a task sends the records that ended (what a killed worker can lose at most)
POLL_S = 0.05  # how often the parent reads the queue
HEALTH_S = 0.25  # how often the parent asks the scheduler which workers are alive
START_LEAD_S = 1.0  # the start instant this far ahead: every task reads it (within its 0.2 s poll) before
STOP_GRACE_S = 10.0  # how long stopped tasks get to send their last records
DEFAULT_MAX_OFFSET_MS = 100.0
DEFAULT_MAX_UNCERTAINTY_MS = 10.0


class ClockOffsetExceeded(WorkerFailed):
    """A host's clock is too far from the scheduler's, or its offset could not be measured closely enough."""


class _Stopped(Exception):
    """The parent told this task to stop (another share failed, or the cell was cancelled)."""


@dataclass(frozen=True)
class ClockSample:
    offset_s: float  # the scheduler's wall clock minus this host's, at the exchange
    uncertainty_s: float  # half the exchange's round trip: the offset is within +- this


def measure_offset(scheduler_now: Callable[[], float], exchanges: int = EXCHANGES) -> ClockSample:
    """This host's clock against `scheduler_now` (the scheduler's time.time), NTP-style: the exchange with
    the least round trip, its offset taken at the exchange's midpoint."""
    best: ClockSample | None = None
    for _ in range(exchanges):
        sent = time.time()
        theirs = scheduler_now()
        back = time.time()
        sample = ClockSample(theirs - (sent + back) / 2, (back - sent) / 2)
        if best is None or sample.uncertainty_s < best.uncertainty_s:
            best = sample
    assert best is not None
    return best


@dataclass(frozen=True)
class _Names:
    """The cell's queue, variable and events on the scheduler."""

    prefix: str

    @property
    def out(self) -> str:
        return f"{self.prefix}-out"

    @property
    def start(self) -> str:
        return f"{self.prefix}-start"

    @property
    def go(self) -> str:
        return f"{self.prefix}-go"

    @property
    def window(self) -> str:
        return f"{self.prefix}-window"

    @property
    def abort(self) -> str:
        return f"{self.prefix}-abort"


@dataclass(frozen=True)
class DaskShareJob:
    """What one Dask task runs: its share, and where and how it reports."""

    share: WorkerShare
    sampling: Sampling
    client_settings: dict[str, Any] = field(repr=False)  # StreamingClient's arguments: may hold a key
    prefix: str = ""
    start_timeout_s: float = 300.0
    clock_skew_s: float = 0.0  # tests only: added to the measured offset, as if this host's clock were off


# -- the task, on a Dask worker ------------------------------------------------------------------------------
class _ShareTask:
    """A share on a Dask worker: its reports to the parent and the waits on the parent's signals."""

    def __init__(self, job: DaskShareJob) -> None:
        self.job = job
        self.client = get_client()
        self.worker = get_worker()
        names = _Names(job.prefix)
        self.out = Queue(names.out, client=self.client)
        self.start_at = Variable(names.start, client=self.client)
        self.go = Event(names.go, client=self.client)  # set once start_at holds the decision
        self.window = Event(names.window, client=self.client)
        self.abort = Event(names.abort, client=self.client)
        self.pending: list[bytes] = []

    async def put(self, kind: str, payload: Any) -> None:
        await asyncio.to_thread(self.out.put, [kind, self.job.share.worker, payload])

    def keep(self, record: RequestRecord) -> None:
        self.pending.append(orjson.dumps(record.as_row()))

    async def flush(self) -> None:
        if self.pending:
            batch, self.pending = self.pending, []
            await self.put("records", batch)

    async def flusher(self) -> None:
        while True:
            await asyncio.sleep(FLUSH_S)
            await self.flush()

    async def stop_watch(self, load: asyncio.Task[Any]) -> None:
        """Cancel the share when the parent sets the abort event (the client records what was in flight)."""
        while not await asyncio.to_thread(self.abort.wait, 0.2):
            pass
        load.cancel()

    async def start(self) -> float:
        """Measure the clock, report ready, wait for the start instant; return it on this host's
        perf_counter."""
        sample = await asyncio.to_thread(measure_offset, lambda: self.client.run_on_scheduler(time.time))
        offset = sample.offset_s + self.job.clock_skew_s
        ready = {
            "address": self.worker.address,
            "hostname": socket.gethostname(),
            "pid": os.getpid(),
            "offset_s": offset,
            "uncertainty_s": sample.uncertainty_s,
        }
        await self.put("ready", ready)
        # wait on an event, not on the variable: a Variable.get that times out is logged as an error by the
        # scheduler, every poll
        deadline = time.monotonic() + self.job.start_timeout_s
        while not await asyncio.to_thread(self.go.wait, 0.2):
            if time.monotonic() > deadline:
                raise TimeoutError(f"no start instant within {self.job.start_timeout_s:g} s")
        decided = await asyncio.to_thread(self.start_at.get)
        if decided.get("abort"):
            raise _Stopped("stopped before the start")
        # the instant on this host's wall clock, then on its perf_counter (what the records count from)
        target = time.perf_counter() + (decided["instant"] - offset - time.time())
        delay = target - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        return target

    async def warmed_up(self) -> None:
        await self.flush()  # the warm-up records reach the parent before it opens the window
        await self.put("warmed", None)
        deadline = time.monotonic() + self.job.share.plan.time_cap_s
        while not await asyncio.to_thread(self.window.wait, 0.2):
            if time.monotonic() > deadline:
                raise TimeoutError("the measured window did not open within the cell's time cap")

    async def run(self) -> dict[str, Any]:
        job = self.job
        flusher = asyncio.create_task(self.flusher())
        load = asyncio.create_task(
            run_share(
                job.share,
                job.sampling,
                job.client_settings,
                start=self.start,
                warmed_up=self.warmed_up,
                keep=self.keep,
                cpu_clock=time.thread_time,  # the task's thread: the worker's own threads are not ours
            )
        )
        watch = asyncio.create_task(self.stop_watch(load))
        try:
            result, cpu_s = await load
        finally:
            flusher.cancel()
            watch.cancel()
            await self.flush()
        return {
            "measured_start_s": result.measured_start_s,
            "measured_end_s": result.measured_end_s,
            "capped": result.capped,
            "notes": result.notes,
            "cpu_s": cpu_s,
        }


def run_dask_share(job: DaskShareJob) -> str:
    """The Dask task of one share: runs it and reports everything through the cell's queue (never raises,
    so that the parent learns why from the queue; a killed worker the parent sees leave the cluster)."""
    task = _ShareTask(job)
    try:
        import uvloop

        done = uvloop.run(task.run())
    except BaseException as exc:  # reported, then the task ends: the parent decides what the cell is
        stopped = isinstance(exc, _Stopped | asyncio.CancelledError)
        error = (
            "stopped: another share failed or the cell was stopped"
            if stopped
            else f"{type(exc).__name__}: {exc}"
        )
        task.out.put(
            [
                "error",
                job.share.worker,
                {"error": error, "consequence": stopped, "traceback": traceback.format_exc(limit=8)},
            ]
        )
        return "failed"
    task.out.put(["done", job.share.worker, done])
    return "done"


# -- the parent ----------------------------------------------------------------------------------------------
@dataclass
class DaskLoadResult(LoadResult):
    """The load's result, with where it ran: `cluster` goes into the cell's meta (`load.cluster`)."""

    cluster: dict[str, Any] = field(default_factory=dict)


def placement(client: Client) -> list[tuple[str, str]]:
    """(address, host) of every Dask worker, dealt round robin over the hosts (share i goes to entry i)."""
    workers = client.scheduler_info()["workers"]
    by_host: dict[str, list[str]] = {}
    for address, info in sorted(workers.items()):
        by_host.setdefault(str(info.get("host") or address), []).append(address)
    dealt = []
    while any(by_host.values()):
        for host, addresses in by_host.items():
            if addresses:
                dealt.append((addresses.pop(0), host))
    return dealt


class _DaskCell:
    """The parent's side of one cell: the tasks, their messages and the cluster's health."""

    def __init__(
        self,
        client: Client,
        shares: list[WorkerShare],
        where: list[tuple[str, str]],
        on_record: Callable[[RequestRecord], None] | None,
        t0: float,
    ) -> None:
        self.client, self.shares, self.where, self.on_record, self.t0 = client, shares, where, on_record, t0
        self.names = _Names(f"specgauge-load-{uuid.uuid4().hex}")
        self.out = Queue(self.names.out, client=client)
        self.start_at = Variable(self.names.start, client=client)
        self.go = Event(self.names.go, client=client)  # set once start_at holds the decision
        self.window = Event(self.names.window, client=client)
        self.abort = Event(self.names.abort, client=client)
        self.futures: list[Future] = []
        self.ready: dict[int, dict[str, Any]] = {}
        self.warmed: set[int] = set()
        self.done: dict[int, dict[str, Any]] = {}
        self.errors: dict[int, dict[str, Any]] = {}
        self.raw: dict[int, list[RequestRecord]] = {s.worker: [] for s in shares}
        self.start_perf: float | None = None  # the common start instant on the parent's perf_counter
        self.last_health = 0.0

    def submit(self, jobs: list[DaskShareJob]) -> None:
        for job, (address, _) in zip(jobs, self.where, strict=False):
            self.futures.append(
                self.client.submit(
                    run_dask_share,
                    job,
                    key=f"{self.names.prefix}-share-{job.share.worker}",
                    workers=[address],
                    allow_other_workers=False,  # a share never reruns elsewhere: its records would repeat
                    retries=0,
                    pure=False,
                )
            )

    def ended(self) -> bool:
        return len(self.done) + len(self.errors) == len(self.shares)

    def _records(self, worker: int, batch: list[bytes]) -> None:
        share = self.shares[worker]
        shift = (self.start_perf - self.t0) if self.start_perf is not None else 0.0
        for line in batch:
            record = RequestRecord(**orjson.loads(line))
            self.raw[worker].append(record)
            if self.on_record is not None:
                self.on_record(move_record(share, record, shift))

    def pump(self) -> None:
        """Every message waiting in the queue, and (every HEALTH_S) the workers that left the cluster."""
        for kind, worker, payload in self.out.get(batch=True):
            if kind == "records":
                self._records(worker, payload)
            elif kind == "ready":
                self.ready[worker] = payload
            elif kind == "warmed":
                self.warmed.add(worker)
            elif kind == "done":
                self.done[worker] = payload
            elif kind == "error" and worker not in self.errors:
                self.errors[worker] = payload
        if time.monotonic() - self.last_health < HEALTH_S:
            return
        self.last_health = time.monotonic()
        alive = set(self.client.scheduler_info()["workers"])
        for share, future, (address, host) in zip(self.shares, self.futures, self.where, strict=False):
            w = share.worker
            if w in self.done or w in self.errors:
                continue
            pid = self.ready.get(w, {}).get("pid")
            if address not in alive:
                self.errors[w] = {
                    "error": f"Dask worker {address} on host {host} (pid {pid}) left the cluster "
                    "(killed, crashed or its job ended)"
                }
            elif future.status == "error":
                self.errors[w] = {"error": f"its task failed on {address} ({host}): {future.exception()!r}"}

    async def wait(self, until: Callable[[], bool], timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while not until():
            if self.errors and what != "stop":
                return
            if time.monotonic() > deadline:
                if what != "stop":
                    raise WorkerFailed(
                        f"load on the Dask cluster: {what} did not happen within {timeout_s:g} s"
                    )
                return
            await asyncio.to_thread(self.pump)
            await asyncio.sleep(POLL_S)

    async def stop(self) -> None:
        """Tell every task to stop, take the records they still send, then cancel what is left."""
        with contextlib.suppress(Exception):
            await asyncio.to_thread(self.abort.set)
            if self.start_perf is None:
                await asyncio.to_thread(self.start_at.set, {"abort": True})
                await asyncio.to_thread(self.go.set)
        with contextlib.suppress(Exception):
            await self.wait(self.ended, STOP_GRACE_S, "stop")
        with contextlib.suppress(Exception):
            await asyncio.to_thread(self.client.cancel, self.futures, force=True)
        with contextlib.suppress(Exception):
            await asyncio.to_thread(self.start_at.delete)
        if (
            self.ended()
        ):  # the scheduler forgets the cell's events and queue (a task still running keeps abort)
            with contextlib.suppress(Exception):
                for event in (self.go, self.window, self.abort):
                    await asyncio.to_thread(event.clear)
                await asyncio.to_thread(self.out.close)

    def clocks(self, max_offset_ms: float, max_uncertainty_ms: float, facts: dict[str, Any]) -> None:
        """Per host into `facts["hosts"]`: its workers, its offset (from the exchange with the least
        uncertainty) and that uncertainty, in ms; raises ClockOffsetExceeded for the first worker beyond a
        bound (after recording it)."""
        hosts: dict[str, dict[str, Any]] = {}
        for share, (address, host) in zip(self.shares, self.where, strict=False):
            ready = self.ready[share.worker]
            offset_ms, uncertainty_ms = ready["offset_s"] * 1e3, ready["uncertainty_s"] * 1e3
            entry = hosts.setdefault(
                host, {"host": host, "hostname": ready["hostname"], "workers": [], "worker_offsets_ms": {}}
            )
            entry["workers"].append(address)
            entry["worker_offsets_ms"][address] = offset_ms
            if "uncertainty_ms" not in entry or uncertainty_ms < entry["uncertainty_ms"]:
                entry.update(offset_ms=offset_ms, uncertainty_ms=uncertainty_ms)
            facts["hosts"] = list(hosts.values())
            name = f"host {host} ({ready['hostname']}, Dask worker {address})"
            if abs(offset_ms) > max_offset_ms:
                raise ClockOffsetExceeded(
                    f"{name}: its clock is {offset_ms:+.1f} ms (+- {uncertainty_ms:.2f} ms) off the "
                    "scheduler's, "
                    f"beyond load.cluster.max_clock_offset_ms = {max_offset_ms:g}"
                )
            if uncertainty_ms > max_uncertainty_ms:
                raise ClockOffsetExceeded(
                    f"{name}: its clock offset ({offset_ms:+.1f} ms) is known to +- {uncertainty_ms:.2f} "
                    "ms only, "
                    f"beyond load.cluster.max_clock_uncertainty_ms = {max_uncertainty_ms:g}"
                )

    def failure(self, total: int) -> WorkerFailed:
        """The cause first: a share that failed by itself, before those stopped because of it."""
        first_w, first = sorted(self.errors.items(), key=lambda item: bool(item[1].get("consequence")))[0]
        address, host = self.where[first_w]
        others = f" ({len(self.errors) - 1} more failed after it)" if len(self.errors) > 1 else ""
        written = sum(len(r) for r in self.raw.values())
        return WorkerFailed(
            f"load share {first_w} of {len(self.shares)} on Dask worker {address} (host {host}) failed: "
            f"{first['error']}{others}; {written} of {total} records were written"
        )


@dataclass(frozen=True)
class ServerAccess:
    """The server the shares load and how their clients reach it (`StreamingClient`'s settings)."""

    base_url: str | Sequence[str]  # several: share i uses the (i mod len)-th (benchmarks: one emulator each)
    model: str
    api_key: str | None = field(default=None, repr=False)
    authorization: str | None = field(default=None, repr=False)  # a whole Authorization value
    timeout_s: float = 300.0
    endpoint: Endpoint = "chat"

    def client_settings(self, share: int) -> dict[str, Any]:
        """StreamingClient's keyword arguments for share `share` (what a `DaskShareJob` carries)."""
        urls = [self.base_url] if isinstance(self.base_url, str) else list(self.base_url)
        return {
            "base_url": urls[share % len(urls)],
            "model": self.model,
            "api_key": self.api_key,
            "authorization": self.authorization,
            "timeout_s": self.timeout_s,
            "endpoint": self.endpoint,
        }


@dataclass(frozen=True)
class CellHooks:
    """The cell's side of its load: what runs around the measured window, and where the records go."""

    before_measured: Hook | None = None  # once every warm-up ended, before the window opens
    after_measured: Hook | None = None  # once every share ended
    on_record: Callable[[RequestRecord], None] | None = None  # each record as it arrives
    t0: float | None = None  # the records' origin on the parent's perf_counter (None: now)


async def run_load_dask(
    client: Client,
    server: ServerAccess,
    prompts: Sequence[Prompt],
    plan: LoadPlan,
    sampling: Sampling,
    hooks: CellHooks | None = None,
    *,
    max_clock_offset_ms: float = DEFAULT_MAX_OFFSET_MS,
    max_clock_uncertainty_ms: float = DEFAULT_MAX_UNCERTAINTY_MS,
    start_timeout_s: float = 300.0,
    clock_skew: dict[int, float] | None = None,
    facts: dict[str, Any] | None = None,
) -> DaskLoadResult:
    """Run one cell's load as one share per worker of the Dask cluster `client` reaches (see the module's
    docstring); W + N records with the cell's indices, on the parent's clock (`hooks.t0`, a perf_counter
    value, default now), each passed to `hooks.on_record` as it arrives.

    W is the number of Dask workers (at most the plan's streams and measured requests). The result's
    `cluster` holds the scheduler, each host's workers and clock offset, and the start's lead. Raises
    `ClockOffsetExceeded` when a host's clock is beyond the bounds, `WorkerFailed` when a share fails or its
    worker leaves the cluster, after passing every record sent so far to `on_record`. `facts`, if given, is
    filled with the result's `cluster` as soon as each part is known, so that a failed cell records its hosts
    and offsets too. `clock_skew` (share index: seconds) makes a share's clock look off, for tests.
    """
    hooks = CellHooks() if hooks is None else hooks
    t0 = time.perf_counter() if hooks.t0 is None else hooks.t0
    where = await asyncio.to_thread(placement, client)
    if not where:
        raise WorkerFailed("load on the Dask cluster: the cluster has no workers")
    shares = split_plan(plan, prompts, len(where))
    cell = _DaskCell(client, shares, where[: len(shares)], hooks.on_record, t0)
    jobs = [
        DaskShareJob(
            share,
            sampling,
            server.client_settings(share.worker),
            cell.names.prefix,
            start_timeout_s,
            (clock_skew or {}).get(share.worker, 0.0),
        )
        for share in shares
    ]
    t0_utc = datetime.fromtimestamp(time.time() - (time.perf_counter() - t0), UTC).isoformat()
    start_s: float | None = None
    facts = {} if facts is None else facts
    facts.update(scheduler=client.scheduler.address, workers=len(shares), start_lead_s=START_LEAD_S)
    try:
        await asyncio.to_thread(cell.submit, jobs)
        await cell.wait(lambda: len(cell.ready) == len(shares), start_timeout_s, "every share's start")
        if not cell.errors:
            cell.clocks(max_clock_offset_ms, max_clock_uncertainty_ms, facts)
            parent = await asyncio.to_thread(measure_offset, lambda: client.run_on_scheduler(time.time))
            facts.update(
                parent_offset_ms=parent.offset_s * 1e3, parent_uncertainty_ms=parent.uncertainty_s * 1e3
            )
            instant = time.time() + parent.offset_s + START_LEAD_S  # on the scheduler's clock
            cell.start_perf = time.perf_counter() + (instant - parent.offset_s - time.time())
            await asyncio.to_thread(cell.start_at.set, {"instant": instant})
            await asyncio.to_thread(cell.go.set)
            await cell.wait(lambda: len(cell.warmed) == len(shares), plan.time_cap_s + 60, "every warm-up")
        if not cell.errors and cell.start_perf is not None:
            if hooks.before_measured is not None:
                await hooks.before_measured()
            start_s = time.perf_counter() - t0
            await asyncio.to_thread(cell.window.set)
            await cell.wait(cell.ended, plan.time_cap_s + 60, "the end of every share")
    except BaseException:  # a bound exceeded, a timeout, a cancelled cell: stop, keep what was sent, re-raise
        await cell.stop()
        raise
    if cell.errors:
        await cell.stop()
        raise cell.failure(plan.warmup + plan.requests)
    await cell.stop()  # nothing left to stop: removes the start variable
    assert cell.start_perf is not None
    outcomes = [WorkerOutcome(s.worker, cell.raw[s.worker], t0_perf=cell.start_perf) for s in shares]
    records = merge_records(shares, outcomes, t0)
    shift = cell.start_perf - t0
    ends = [d["measured_end_s"] + shift for d in cell.done.values() if d.get("measured_end_s") is not None]
    measured_end = max(ends) if ends else None
    if hooks.after_measured is not None:
        await hooks.after_measured()
    notes = sorted({note for d in cell.done.values() for note in d.get("notes") or []})
    notes.append(f"load from {len(shares)} Dask workers on {len(facts['hosts'])} hosts")
    capped = any(d.get("capped") for d in cell.done.values())
    return DaskLoadResult(records, t0_utc, start_s, measured_end, capped, t0, notes, dict(facts))
