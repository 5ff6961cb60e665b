"""Load generation for one cell: closed loop (C workers) or open loop (arrivals at a rate), with warm-up,
hooks around the measured window, and a time cap that loses no record.

Decisions (the contract leaves them to us; docs/design.md's cell artifact relies on them):

- **Warm-up** runs first with the same load shape (C workers, or the same arrival rate), and *finishes*
  before the measured window opens: the `before_measured` hook (the cell scrapes /metrics there) runs on an
  idle server, so server-side counter deltas contain measured requests only. Warm-up records are kept,
  `phase="warmup"`.
- **Prompts** go round robin in file order; warm-up request w uses prompt w mod P and measured request j
  uses prompt j mod P, so the measured prompts do not depend on the warm-up count. Record `index` is the
  issue order within the cell, warm-up first (W + j for measured request j).
- **Closed loop**: each of min(C, N) workers sends its next request when its previous one ended;
  `queued_s` is when the worker asked for the request, so `client_queue_s` shows any wait for a
  connection slot.
- **Open loop**: arrival offsets come from `arrival_schedule` (Poisson: seeded exponential gaps; or
  constant gaps), the first arrival at the window's start. `scheduled_s` = `queued_s` = the planned
  arrival; `client_queue_s` = sent - planned (dispatch lag plus any wait for a slot). An optional
  `concurrency` caps requests in flight (what vLLM's `--max-concurrency` does with a rate).
- **Time cap** (whole cell, from t0): at the cap every request in flight is cancelled and every request not
  yet sent is recorded too, all with `error_class="cancelled"`; a cell always has W + N records. If the
  cap falls during the measured window, `after_measured` still runs.
"""

from __future__ import annotations

import asyncio
import gc
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Literal

from artifacts import ids
from experiments.spec import LoadSpec, Sampling
from tasks.load.client import StreamingClient
from tasks.load.records import Phase, RequestRecord
from workloads.schema import Prompt

Hook = Callable[[], Awaitable[None]]
_perf_counter = time.perf_counter


@dataclass(frozen=True)
class LoadPlan:
    mode: Literal["closed", "open"]
    concurrency: int | None = None  # closed: workers; open: optional cap on requests in flight
    rate: float | None = None  # open loop: requests per second
    arrival: Literal["poisson", "constant"] = "poisson"
    requests: int = 16  # measured
    warmup: int = 2
    time_cap_s: float = 600.0
    seed: int = 0
    # closed loop: measure for this many seconds (then let the requests in flight finish); `requests` caps it
    window_s: float | None = None

    def __post_init__(self) -> None:
        if self.mode == "closed" and (self.concurrency is None or self.concurrency <= 0):
            raise ValueError(f"closed loop needs concurrency > 0, got {self.concurrency}")
        if self.mode == "open" and (self.rate is None or self.rate <= 0):
            raise ValueError(f"open loop needs rate > 0, got {self.rate}")
        if self.mode not in ("closed", "open"):
            raise ValueError(f"mode must be 'closed' or 'open', got {self.mode!r}")
        if self.arrival not in ("poisson", "constant"):
            raise ValueError(f"arrival must be 'poisson' or 'constant', got {self.arrival!r}")
        if self.requests <= 0 or self.warmup < 0 or self.time_cap_s <= 0:
            raise ValueError("requests must be > 0, warmup >= 0 and time_cap_s > 0")
        if self.window_s is not None and (self.mode != "closed" or self.window_s <= 0):
            raise ValueError(f"a time window ({self.window_s} s) is for closed-loop cells, and > 0")

    @classmethod
    def from_spec(
        cls, load: LoadSpec, *, concurrency: int | None = None, rate: float | None = None, seed: int = 0
    ) -> LoadPlan:
        """The plan of one cell of `load`: give `concurrency` (closed loop) or `rate` (open loop)."""
        if (concurrency is None) == (rate is None):
            raise ValueError("give exactly one of concurrency (closed loop) or rate (open loop)")
        return cls(
            mode="closed" if concurrency is not None else "open",
            concurrency=concurrency,
            rate=rate,
            arrival=load.arrival,
            requests=load.requests_at(concurrency),
            warmup=load.warmup_at(concurrency),
            time_cap_s=load.time_cap_s,
            seed=seed,
            window_s=load.window_s if concurrency is not None else None,
        )

    @property
    def label(self) -> str:
        """The load part of a cell id: c<C> or rate<R>."""
        return ids.load_label(self.mode, self.concurrency, self.rate)

    def connections(self) -> int:
        """Connections a client needs so that its own pool never queues this plan's requests."""
        if self.concurrency is not None:
            return self.concurrency
        return max(self.requests, self.warmup, 1)


@dataclass
class LoadResult:
    records: list[RequestRecord]
    t0_utc: str  # wall-clock time of t0 (records' times are seconds from it)
    measured_start_s: float | None  # the measured window opened (after before_measured)
    measured_end_s: float | None  # the last measured request ended (before after_measured)
    capped: bool  # the time cap cancelled requests
    t0_perf: float = 0.0  # t0 on time.perf_counter() (CLOCK_MONOTONIC: comparable across processes)
    notes: list[str] = field(default_factory=list)

    @property
    def measured(self) -> list[RequestRecord]:
        return [r for r in self.records if r.phase == "measured"]


def arrival_schedule(
    n: int, rate: float, arrival: Literal["poisson", "constant"], seed: int | str
) -> list[float]:
    """Offsets (seconds) of n arrivals from the window's start: 0 first, then exponential or equal gaps."""
    if n <= 0:
        return []
    if arrival == "constant":
        return [i / rate for i in range(n)]
    rng = random.Random(seed)
    offsets = [0.0]
    for _ in range(n - 1):
        offsets.append(offsets[-1] + rng.expovariate(rate))
    return offsets


class _Cell:
    def __init__(
        self,
        client: StreamingClient,
        prompts: Sequence[Prompt],
        plan: LoadPlan,
        sampling: Sampling,
        on_record: Callable[[RequestRecord], None] | None,
        t0: float | None,
    ) -> None:
        if not prompts:
            raise ValueError("run_load needs at least one prompt")
        self.client, self.prompts, self.plan, self.sampling = client, list(prompts), plan, sampling
        self.on_record = on_record
        self.t0 = _perf_counter() if t0 is None else t0
        self.deadline = self.t0 + plan.time_cap_s
        self.records: dict[int, RequestRecord] = {}
        self.capped = False

    def now(self) -> float:
        return _perf_counter() - self.t0

    def keep(self, record: RequestRecord) -> None:
        self.records[record.index] = record
        if self.on_record is not None:
            self.on_record(record)

    def index(self, phase: Phase, j: int) -> int:
        return j if phase == "warmup" else self.plan.warmup + j

    def unsent(self, phase: Phase, j: int, scheduled_s: float | None = None) -> RequestRecord:
        prompt = self.prompts[j % len(self.prompts)]
        now = self.now()
        return RequestRecord(
            index=self.index(phase, j),
            prompt_id=prompt.id,
            workload=prompt.workload,
            phase=phase,
            endpoint=self.client.endpoint,
            queued_s=scheduled_s if scheduled_s is not None else now,
            scheduled_s=scheduled_s,
            ended_s=now,
            ok=False,
            error_class="cancelled",
            error="the cell's time cap was reached before this request was sent",
        )

    async def send(self, phase: Phase, j: int, queued_s: float, scheduled_s: float | None = None) -> None:
        prompt = self.prompts[j % len(self.prompts)]
        record = await self.client.send(
            prompt,
            self.sampling,
            index=self.index(phase, j),
            phase=phase,
            t0=self.t0,
            queued_s=queued_s,
            scheduled_s=scheduled_s,
        )
        self.keep(record)

    async def until_deadline(self, tasks: list[asyncio.Task[None]]) -> None:
        """Wait for tasks; at the time cap cancel the rest (each then records itself as cancelled)."""
        if not tasks:
            return
        _, pending = await asyncio.wait(tasks, timeout=max(0.0, self.deadline - _perf_counter()))
        if pending:
            self.capped = True
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)

    # -- closed loop ------------------------------------------------------------------------------------------
    async def closed_phase(self, phase: Phase, count: int) -> None:
        next_j = 0
        workers = min(self.plan.concurrency or 1, count)
        # a time-window cell stops sending at the window's end: `count` is then a cap, not a plan
        window = self.plan.window_s if phase == "measured" else None
        stop_at = _perf_counter() + window if window is not None else float("inf")

        async def worker() -> None:
            nonlocal next_j
            current = asyncio.current_task()
            while next_j < count and not self.capped and _perf_counter() < min(self.deadline, stop_at):
                j, next_j = next_j, next_j + 1
                await self.send(phase, j, self.now())
                if current is not None and current.cancelling():
                    # Cancelled from outside (Ctrl-C, SIGTERM, a cancelled flow run): the client turned the
                    # cancellation into a record; send nothing more through a client that is closing.
                    return

        await self.until_deadline([asyncio.create_task(worker()) for _ in range(workers)])
        planned = (
            next_j if window is not None and not self.capped else count
        )  # a window's end sends nothing more
        for j in range(planned):  # never sent because of the cap
            if self.index(phase, j) not in self.records:
                self.keep(self.unsent(phase, j))

    # -- open loop --------------------------------------------------------------------------------------------
    async def open_phase(self, phase: Phase, count: int) -> None:
        plan = self.plan
        assert plan.rate is not None
        seed: int | str = plan.seed if phase == "measured" else f"{plan.seed}-warmup"
        offsets = arrival_schedule(count, plan.rate, plan.arrival, seed)
        start = self.now()
        cap = asyncio.Semaphore(plan.concurrency) if plan.concurrency else None
        tasks: list[asyncio.Task[None]] = []

        async def one(j: int, due: float) -> None:
            if cap is None:
                await self.send(phase, j, due, due)
                return
            try:
                await cap.acquire()
            except asyncio.CancelledError:
                self.keep(self.unsent(phase, j, due))
                return
            try:
                await self.send(phase, j, due, due)
            finally:
                cap.release()

        async def dispatch() -> None:
            for j, offset in enumerate(offsets):
                due = start + offset
                delay = due - self.now()
                if delay > 0:
                    # uvloop's timers round to 1 ms and may fire early: aim half a millisecond late, and
                    # yield (rarely) until due; never send before the planned arrival
                    await asyncio.sleep(delay + 0.0005)
                while self.now() < due:
                    await asyncio.sleep(0)
                tasks.append(asyncio.create_task(one(j, due)))

        dispatcher = asyncio.create_task(dispatch())
        await self.until_deadline([dispatcher])
        await self.until_deadline(tasks)
        for j, offset in enumerate(offsets):
            if self.index(phase, j) not in self.records:
                self.keep(self.unsent(phase, j, start + offset))

    async def phase(self, phase: Phase, count: int) -> None:
        if count <= 0:
            return
        if self.capped or _perf_counter() >= self.deadline:
            self.capped = True
            for j in range(count):
                self.keep(self.unsent(phase, j))
            return
        if self.plan.mode == "closed":
            await self.closed_phase(phase, count)
        else:
            await self.open_phase(phase, count)


_NO_FULL_COLLECTION = 2**31 - 1  # gen-1 collections before a full one: never, within a cell


async def run_load(
    client: StreamingClient,
    prompts: Sequence[Prompt],
    plan: LoadPlan,
    sampling: Sampling,
    *,
    before_measured: Hook | None = None,
    after_measured: Hook | None = None,
    on_record: Callable[[RequestRecord], None] | None = None,
    t0: float | None = None,
) -> LoadResult:
    """Run one cell's load through `client` (already entered); W + N records, sorted by index.

    `t0` (a `time.perf_counter()` value, default: now) is the origin of every time in the records; a cell
    that samples gauges passes its own so that both share one clock. The time cap counts from it.
    """
    # A full garbage collection pauses the loop for tens of ms (late sends; two chunks of a stream read
    # together share the newer one's kernel timestamp). Freeze what exists now, so that collections during
    # the cell only scan the cell's objects, and make none of them full: even one over the cell's own records
    # (3,072 at 1,024 streams) took 13-23 ms, and it stalled the loop while the first tokens of the measured
    # window came in (docs/performance.md). Young collections, which scan only recent objects, go on.
    gc.freeze()
    thresholds = gc.get_threshold()
    gc.set_threshold(thresholds[0], thresholds[1], _NO_FULL_COLLECTION)
    try:
        return await _run_cell(
            client, prompts, plan, sampling, before_measured, after_measured, on_record, t0
        )
    finally:
        gc.set_threshold(*thresholds)
        gc.unfreeze()


async def _run_cell(
    client: StreamingClient,
    prompts: Sequence[Prompt],
    plan: LoadPlan,
    sampling: Sampling,
    before_measured: Hook | None,
    after_measured: Hook | None,
    on_record: Callable[[RequestRecord], None] | None,
    t0: float | None,
) -> LoadResult:
    cell = _Cell(client, prompts, plan, sampling, on_record, t0)
    t0_utc = datetime.fromtimestamp(time.time() - (_perf_counter() - cell.t0), UTC).isoformat()
    await cell.phase("warmup", plan.warmup)
    start = end = None
    if not cell.capped:
        if before_measured is not None:
            await before_measured()
        start = cell.now()
        await cell.phase("measured", plan.requests)
        end = cell.now()
        if after_measured is not None:
            await after_measured()
    else:
        await cell.phase("measured", plan.requests)
    notes = []
    if cell.capped:
        notes.append(f"time cap of {plan.time_cap_s:g} s reached: unfinished requests recorded as cancelled")
    records = [cell.records[i] for i in sorted(cell.records)]
    return LoadResult(records, t0_utc, start, end, cell.capped, cell.t0, notes)


def run_load_sync(
    base_url: str,
    model: str,
    prompts: Sequence[Prompt],
    plan: LoadPlan,
    sampling: Sampling,
    *,
    api_key: str | None = None,
    authorization: str | None = None,
    timeout_s: float = 300.0,
    endpoint: Literal["chat", "completions"] = "chat",
    before_measured: Hook | None = None,
    after_measured: Hook | None = None,
    on_record: Callable[[RequestRecord], None] | None = None,
) -> LoadResult:
    """`run_load` on a fresh uvloop event loop (for callers without one, such as a Prefect task)."""

    async def main() -> LoadResult:
        async with StreamingClient(
            base_url,
            model,
            api_key=api_key,
            authorization=authorization,
            timeout_s=timeout_s,
            endpoint=endpoint,
            max_connections=plan.connections(),
        ) as client:
            return await run_load(
                client,
                prompts,
                plan,
                sampling,
                before_measured=before_measured,
                after_measured=after_measured,
                on_record=on_record,
            )

    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency
        return asyncio.run(main())
    return uvloop.run(main())
