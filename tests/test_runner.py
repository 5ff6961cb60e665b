"""Closed- and open-loop cells against the emulator: counts, phases, concurrency, schedules, time cap."""

from __future__ import annotations

import gc
import itertools
import statistics

import pytest
import uvloop

from experiments.spec import LoadSpec, Sampling
from tasks.load.client import StreamingClient
from tasks.load.runner import LoadPlan, LoadResult, arrival_schedule, run_load
from workloads.schema import Prompt

pytestmark = pytest.mark.timing  # millisecond assertions: see tests/conftest.py

MODEL = "emulated"
PROMPTS = [
    Prompt(
        id=f"p{i}", workload="code", messages=[{"role": "user", "content": f"def f{i}(): pass"}], max_tokens=8
    )
    for i in range(5)
]


def run(
    url: str,
    plan: LoadPlan,
    prompts=PROMPTS,
    *,
    hooks: dict | None = None,
    on_record=None,
    max_connections: int | None = None,
    timeout_s: float = 10,
) -> LoadResult:
    async def main() -> LoadResult:
        async with StreamingClient(
            url, MODEL, timeout_s=timeout_s, max_connections=max_connections or plan.connections()
        ) as client:
            return await run_load(client, prompts, plan, Sampling(), on_record=on_record, **(hooks or {}))

    return uvloop.run(main())


def max_overlap(records) -> int:
    """Most requests in flight at once, from the records' own send/end times."""
    events = sorted(
        [(r.sent_s, 1) for r in records] + [(r.ended_s, -1) for r in records], key=lambda e: (e[0], e[1])
    )
    level = peak = 0
    for _, step in events:
        level += step
        peak = max(peak, level)
    return peak


def test_closed_loop_issues_exactly_w_plus_n_and_never_exceeds_concurrency(emulator):
    emulator.configure(ttft_ms=15, step_ms=3)
    seen = []
    result = run(
        emulator.url, LoadPlan("closed", concurrency=4, requests=22, warmup=5), on_record=seen.append
    )
    records = result.records
    assert len(records) == 27 and len(seen) == 27 and all(r.ok for r in records)
    assert [r.index for r in records] == list(range(27))
    assert [r.phase for r in records] == ["warmup"] * 5 + ["measured"] * 22
    assert emulator.stats()["completions"] == 27
    assert emulator.stats()["max_active"] == 4  # the server never saw more than C at once
    assert max_overlap(records) <= 4
    # round robin in file order; the measured window restarts at the first prompt
    assert [r.prompt_id for r in records[:5]] == ["p0", "p1", "p2", "p3", "p4"]
    assert [r.prompt_id for r in records[5:12]] == ["p0", "p1", "p2", "p3", "p4", "p0", "p1"]
    # warm-up ended before the window opened; measured requests lie inside it
    warm_end = max(r.ended_s for r in records[:5])
    assert warm_end <= result.measured_start_s
    assert min(r.sent_s for r in records[5:]) >= result.measured_start_s
    assert max(r.ended_s for r in records[5:]) <= result.measured_end_s
    assert not result.capped and result.t0_utc.endswith("+00:00")


def test_closed_loop_keeps_c_requests_in_flight(emulator):
    emulator.configure(ttft_ms=30, step_ms=5)
    run(emulator.url, LoadPlan("closed", concurrency=3, requests=12, warmup=0))
    assert emulator.stats()["max_active"] == 3


def test_hooks_run_around_the_measured_window_on_an_idle_server(emulator):
    emulator.configure(ttft_ms=20, step_ms=3)
    calls = []

    async def before() -> None:
        calls.append(("before", emulator_stats_now(emulator), len(seen)))

    async def after() -> None:
        calls.append(("after", emulator_stats_now(emulator), len(seen)))

    seen = []
    run(
        emulator.url,
        LoadPlan("closed", concurrency=2, requests=6, warmup=3),
        hooks={"before_measured": before, "after_measured": after},
        on_record=seen.append,
    )
    assert [c[0] for c in calls] == ["before", "after"]
    assert calls[0][1]["active"] == 0 and calls[0][2] == 3  # all warm-up done, none measured yet
    assert calls[1][1]["active"] == 0 and calls[1][2] == 9


def emulator_stats_now(emulator) -> dict:
    return emulator.stats()  # blocking call inside the hook: fine for a test, the loop is idle then


def test_open_loop_follows_the_seeded_schedule(emulator):
    emulator.configure(ttft_ms=10, step_ms=2)
    plan = LoadPlan("open", rate=40, requests=30, warmup=3, seed=11)
    result = run(emulator.url, plan)
    measured = result.measured
    assert len(result.records) == 33 and all(r.ok for r in result.records)
    expected = arrival_schedule(30, 40, "poisson", 11)
    start = measured[0].scheduled_s
    assert start >= result.measured_start_s
    offsets = [r.scheduled_s - start for r in measured]
    assert offsets == pytest.approx(expected, abs=1e-9)
    for r in measured:
        assert r.queued_s == r.scheduled_s
        assert 0 <= r.sent_s - r.scheduled_s < 0.05  # dispatched on time, never early
        assert r.client_queue_s == pytest.approx(r.sent_s - r.scheduled_s)


def test_open_loop_concurrency_cap_queues_at_the_client(emulator):
    emulator.configure(ttft_ms=100, step_ms=5)
    result = run(
        emulator.url, LoadPlan("open", rate=200, arrival="constant", concurrency=2, requests=8, warmup=0)
    )
    assert all(r.ok for r in result.records)
    assert emulator.stats()["max_active"] == 2
    longest = max(result.records, key=lambda r: r.client_queue_s)
    assert longest.client_queue_s > 0.25  # waited for one of 2 slots behind earlier requests...
    assert 0.1 <= longest.ttft_s < longest.client_queue_s  # ...and that wait is not inside its TTFT


def test_arrival_schedule_is_seeded_and_has_the_rate():
    assert arrival_schedule(5, 10, "constant", 0) == pytest.approx([0, 0.1, 0.2, 0.3, 0.4])
    a, b, c = (arrival_schedule(20_000, 5.0, "poisson", s) for s in (1, 1, 2))
    assert a == b and a != c and a[0] == 0.0
    gaps = [y - x for x, y in itertools.pairwise(a)]
    assert statistics.mean(gaps) == pytest.approx(0.2, rel=0.03)
    assert statistics.stdev(gaps) == pytest.approx(0.2, rel=0.05)  # exponential: sd = mean


def test_time_cap_cancels_and_records_everything(emulator):
    emulator.configure(ttft_ms=50, step_ms=50)  # 8 tokens: 0.4 s a request
    plan = LoadPlan("closed", concurrency=3, requests=10, warmup=1, time_cap_s=0.7)
    result = run(emulator.url, plan)
    records = result.records
    assert result.capped and result.notes
    assert len(records) == 11 and [r.index for r in records] == list(range(11))
    cancelled = [r for r in records if r.error_class == "cancelled"]
    in_flight = [r for r in cancelled if r.sent_s is not None]
    never_sent = [r for r in cancelled if r.sent_s is None]
    assert len(in_flight) == 3 and never_sent
    assert all(not r.ok for r in cancelled) and sum(r.ok for r in records) + len(cancelled) == 11
    assert result.measured_end_s is not None and result.measured_end_s <= 0.7 + 0.1


def test_time_cap_during_warmup_skips_the_window_but_keeps_records(emulator):
    emulator.configure(ttft_ms=300, step_ms=50)
    calls = []

    async def before() -> None:
        calls.append("before")

    result = run(
        emulator.url,
        LoadPlan("closed", concurrency=2, requests=4, warmup=2, time_cap_s=0.2),
        hooks={"before_measured": before},
    )
    assert result.capped and result.measured_start_s is None and calls == []
    assert len(result.records) == 6 and all(r.error_class == "cancelled" for r in result.records)


def test_faulty_requests_inside_a_cell_are_recorded_not_lost(emulator):
    emulator.configure(step_ms=2, fail_first=2)
    prompts = [
        *PROMPTS[:2],
        Prompt(
            id="cut", workload="code", max_tokens=8, messages=[{"role": "user", "content": "x [[fault:cut]]"}]
        ),
    ]
    result = run(emulator.url, LoadPlan("closed", concurrency=2, requests=9, warmup=0), prompts)
    records = result.records
    assert len(records) == 9
    errors = [r.error_class for r in records]
    assert errors.count("http_status") == 2  # the first two requests of the burst
    assert errors.count("stream_cut") == sum(r.prompt_id == "cut" for r in records) == 3
    assert sum(r.ok for r in records) == 4


def test_plan_from_spec_and_validation():
    load = LoadSpec(
        concurrencies=(1, 4), rates=(2.5,), requests=9, warmup=1, allow_short_cells=True, time_cap_s=60
    )
    closed = LoadPlan.from_spec(load, concurrency=4, seed=3)
    assert (closed.mode, closed.concurrency, closed.requests, closed.warmup, closed.label) == (
        "closed",
        4,
        9,
        1,
        "c4",
    )
    opened = LoadPlan.from_spec(load, rate=2.5)
    assert opened.mode == "open" and opened.label == "rate2.5" and opened.arrival == "poisson"
    with pytest.raises(ValueError):
        LoadPlan.from_spec(load)
    with pytest.raises(ValueError):
        LoadPlan("closed", requests=3)
    with pytest.raises(ValueError):
        LoadPlan("open", rate=0)


def test_no_full_garbage_collection_during_a_cell(emulator):
    """A full collection stalls the loop for tens of ms; a cell makes none, however much it allocates, and
    the process's collection thresholds are back afterwards."""
    emulator.configure(ttft_ms=5, step_ms=1)
    kept: list[list[int]] = []
    generations: list[int] = []

    def allocate(record) -> None:
        kept.extend([i] for i in range(20_000))  # survivors: enough for several full collections

    def seen(phase: str, info: dict) -> None:
        if phase == "start":
            generations.append(info["generation"])

    before = gc.get_threshold()
    gc.callbacks.append(seen)
    try:
        run(emulator.url, LoadPlan("closed", concurrency=2, requests=10, warmup=0), on_record=allocate)
    finally:
        gc.callbacks.remove(seen)
    assert generations.count(1) >= 10  # it allocated enough for full collections to be due
    assert 2 not in generations, generations
    assert gc.get_threshold() == before
    kept.clear()


def test_a_time_window_cell_measures_steady_state_for_its_seconds(emulator):
    """window_s: the closed loop keeps C in flight until the window ends, then lets the requests in flight
    finish; nothing unsent is recorded (the count was a cap, not a plan)."""
    emulator.configure(ttft_ms=10, step_ms=5)  # 8 tokens: about 50 ms a request
    plan = LoadPlan("closed", concurrency=3, requests=10_000, warmup=3, window_s=0.6)
    result = run(emulator.url, plan)
    measured = [r for r in result.records if r.phase == "measured"]
    assert not result.capped and all(r.ok for r in measured)
    assert 15 <= len(measured) < 200  # about 3 x 0.6 / 0.05 = 36, far below the cap
    last_send = max(r.sent_s for r in measured)
    assert last_send - result.measured_start_s <= 0.6 + 0.05  # nothing sent after the window
    assert emulator.stats()["max_active"] == 3 and max_overlap(measured) == 3
    assert len(result.records) == 3 + len(measured)  # no cancelled placeholders for the cap


def test_a_time_window_is_closed_loop_only_and_one_process():
    with pytest.raises(ValueError, match="closed-loop"):
        LoadPlan("open", rate=1.0, window_s=5)
    with pytest.raises(ValueError, match="one load process"):
        LoadSpec(concurrencies=(4,), window_s=30, workers=2)
    load = LoadSpec(concurrencies=(4,), rates=(2.0,), window_s=30)
    assert LoadPlan.from_spec(load, concurrency=4).window_s == 30
    assert LoadPlan.from_spec(load, rate=2.0).window_s is None
    assert load.requests_at(4) == 100_000 and load.requests_at(None) == 32
