"""A cell's load from W client processes (tasks/load/workers.py): the split, the superposition, the barrier,
the merge, a failing worker, and a W = 2 cell on the real engine."""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import statistics
import time
from pathlib import Path

import polars as pl
import pytest
from emulator_cells import MODEL, emulator_cell, prompts

from experiments.plan import CellPlan
from experiments.spec import LoadSpec, Sampling, load_spec
from tasks.cell import run_cell
from tasks.load.records import RequestRecord
from tasks.load.runner import LoadPlan, arrival_schedule
from tasks.load.workers import (
    WorkerFailed,
    auto_workers,
    expected_chunk_rate,
    merge_records,
    resolve_workers,
    run_load_workers,
    split_plan,
    worker_seed,
)
from workloads.schema import load_corpus

REPO = Path(__file__).resolve().parent.parent


def worker_of(index: int, warmup: int, workers: int) -> int:
    """Which worker sent the cell's record `index` (the deal: request j goes to worker j mod W)."""
    return index % workers if index < warmup else (index - warmup) % workers


def max_overlap(records: list[RequestRecord]) -> int:
    events = sorted([(r.sent_s, 1) for r in records] + [(r.ended_s, -1) for r in records])
    level = peak = 0
    for _, step in events:
        level += step
        peak = max(peak, level)
    return peak


def run(url: str, plan: LoadPlan, workers: int, **kwargs) -> object:
    return asyncio.run(run_load_workers(url, MODEL, prompts(), plan, Sampling(), workers, **kwargs))


# -- the split, without processes ---------------------------------------------------------------------------------
def test_closed_loop_split_deals_c_requests_and_prompts_like_one_process() -> None:
    plan = LoadPlan("closed", concurrency=5, requests=11, warmup=5)
    corpus = prompts(4)
    shares = split_plan(plan, corpus, 2)
    assert [s.plan.concurrency for s in shares] == [3, 2]  # C split, summing to C
    assert [s.plan.requests for s in shares] == [6, 5] and [s.plan.warmup for s in shares] == [3, 2]
    # every cell index exactly once, each with the prompt one process would have sent (j mod P)
    seen = {}
    for share in shares:
        for local in range(share.plan.warmup + share.plan.requests):
            phase = "warmup" if local < share.plan.warmup else "measured"
            index = share.cell_index(phase, local)
            own_j = local if phase == "warmup" else local - share.plan.warmup
            seen[index] = share.prompts[own_j % len(share.prompts)].id
    assert sorted(seen) == list(range(plan.warmup + plan.requests))
    for index, prompt_id in seen.items():
        j = index if index < plan.warmup else index - plan.warmup
        assert prompt_id == corpus[j % len(corpus)].id
    # never more workers than streams or measured requests
    assert len(split_plan(LoadPlan("closed", concurrency=2, requests=8), corpus, 8)) == 2
    assert len(split_plan(LoadPlan("open", rate=5.0, requests=3), corpus, 8)) == 3


def test_open_loop_superposes_independent_seeded_poisson_streams_of_the_cells_rate() -> None:
    plan = LoadPlan("open", rate=40.0, requests=8000, warmup=0, seed=7)
    shares = split_plan(plan, prompts(), 4)
    assert sum(s.plan.rate for s in shares) == pytest.approx(40.0)
    seeds = [s.plan.seed for s in shares]
    assert len(set(seeds)) == 4 and seeds == [s.plan.seed for s in split_plan(plan, prompts(), 4)]
    assert worker_seed(7, 0, 1) == 7  # one worker: the cell's own schedule, as before
    streams = [arrival_schedule(s.plan.requests, s.plan.rate, "poisson", s.plan.seed) for s in shares]
    assert len({tuple(s[:5]) for s in streams}) == 4  # independent draws, not one schedule repeated
    merged = sorted(t for stream in streams for t in stream)
    horizon = min(stream[-1] for stream in streams)  # every stream still running up to here
    inside = [t for t in merged if t <= horizon]
    assert len(inside) / horizon == pytest.approx(40.0, rel=0.05)  # the superposition has the cell's rate
    gaps = [b - a for a, b in itertools.pairwise(inside[3:])]  # from the last of the W arrivals at 0
    assert statistics.pstdev(gaps) / statistics.fmean(gaps) == pytest.approx(1.0, abs=0.05)  # exponential


def test_workers_auto_follows_the_expected_chunk_rate_and_the_cores() -> None:
    sampling = Sampling()
    big = LoadPlan("closed", concurrency=1024, requests=4096)
    assert expected_chunk_rate(big, prompts(), sampling) == pytest.approx(102_400)
    assert auto_workers(102_400, 40_000, cores=15) == 6  # each worker at half of 40k chunks per CPU-second
    assert auto_workers(102_400, 40_000, cores=2) == 2
    assert resolve_workers("auto", big, prompts(), sampling, chunks_per_cpu_s=40_000, cores=15) == 6
    small = LoadPlan("closed", concurrency=4, requests=16)
    assert resolve_workers("auto", small, prompts(), sampling, chunks_per_cpu_s=40_000, cores=15) == 1
    opened = LoadPlan("open", rate=100.0, requests=32)
    assert expected_chunk_rate(opened, prompts(tokens=64), sampling) == pytest.approx(6_400)
    assert resolve_workers(3, small, prompts(), sampling) == 3
    assert resolve_workers(8, small, prompts(), sampling) == 4  # never more than C


def test_workers_auto_measures_the_clients_capacity_on_this_machine_once() -> None:
    from tasks.load.workers import measure_chunk_capacity

    capacity = measure_chunk_capacity()  # the client against an emulator process: chunks per CPU-second
    assert 1_000 < capacity < 10_000_000
    assert measure_chunk_capacity() == capacity  # once per process
    plan = LoadPlan("closed", concurrency=2048, requests=4096)
    expected = min(3, math.ceil(204_800 / (capacity * 0.5)))  # C / 10 ms over half the capacity, <= cores
    assert resolve_workers("auto", plan, prompts(), Sampling(), cores=3) == expected


def test_merge_moves_times_onto_the_parents_clock_and_refuses_a_repeated_index() -> None:
    from tasks.load.workers import WorkerOutcome

    plan = LoadPlan("closed", concurrency=2, requests=2, warmup=0)
    shares = split_plan(plan, prompts(), 2)

    def record(index: int, sent: float) -> RequestRecord:
        return RequestRecord(
            index, "p0", "w", "measured", "chat", queued_s=sent, sent_s=sent, ended_s=sent + 1
        )

    outcomes = [
        WorkerOutcome(0, [record(0, 0.5)], t0_perf=10.0),
        WorkerOutcome(1, [record(0, 0.5)], t0_perf=12.0),
    ]
    merged = merge_records(shares, outcomes, t0=9.0)
    assert [(r.index, r.sent_s, r.ended_s) for r in merged] == [(0, 1.5, 2.5), (1, 3.5, 4.5)]
    with pytest.raises(WorkerFailed, match="given twice"):
        merge_records(shares, [WorkerOutcome(0, [record(0, 0), record(0, 1)]), WorkerOutcome(1, [])], t0=0)


# -- worker processes against the emulator ---------------------------------------------------------------------------
def test_closed_loop_w2_splits_c_and_merges_every_record(emulator, tmp_path: Path) -> None:
    emulator.configure(ttft_ms=20, step_ms=5)
    plan = LoadPlan("closed", concurrency=4, requests=16, warmup=4)
    marks: dict[str, float] = {}
    t0 = time.perf_counter()

    async def before() -> None:
        marks["before"] = time.perf_counter() - t0

    async def after() -> None:
        marks["after"] = time.perf_counter() - t0

    result = run(
        emulator.url, plan, 2, t0=t0, before_measured=before, after_measured=after, records_dir=tmp_path
    )
    records = result.records
    assert [r.index for r in records] == list(range(20))  # W + N, ids unique, in the cell's order
    assert all(r.ok for r in records) and [r.phase for r in records] == ["warmup"] * 4 + ["measured"] * 16
    assert [r.prompt_id for r in records] == [f"p{j % 5}" for j in range(4)] + [
        f"p{j % 5}" for j in range(16)
    ]
    for w in (0, 1):  # each worker ran its own C = 2 and wrote its own records file
        mine = [r for r in records if worker_of(r.index, 4, 2) == w and r.phase == "measured"]
        assert len(mine) == 8 and max_overlap(mine) == 2
        lines = (tmp_path / f"worker-{w}.records.jsonl").read_text().splitlines()
        assert len(lines) == 10 and json.loads((tmp_path / f"worker-{w}.result.json").read_text())["t0_perf"]
    assert emulator.stats()["max_active"] == 4  # together: the cell's C
    # the window: after every warm-up request ended, before any measured one was sent; on the parent's clock
    warm, measured = records[:4], records[4:]
    assert max(r.ended_s for r in warm) <= marks["before"] <= result.measured_start_s
    assert result.measured_start_s <= min(r.sent_s for r in measured)
    assert max(r.ended_s for r in measured) <= result.measured_end_s + 1e-6 <= marks["after"] + 1e-6
    assert "load from 2 worker processes" in result.notes


def test_open_loop_w2_is_reproducible_and_follows_each_workers_seeded_schedule(emulator) -> None:
    emulator.configure(ttft_ms=10, step_ms=2)
    plan = LoadPlan("open", rate=40.0, requests=12, warmup=0, seed=3)
    first = run(emulator.url, plan, 2)
    second = run(emulator.url, plan, 2)
    assert [r.index for r in first.records] == list(range(12)) and all(r.ok for r in first.records)
    for w, share in enumerate(split_plan(plan, prompts(), 2)):
        planned = arrival_schedule(share.plan.requests, share.plan.rate, "poisson", share.plan.seed)
        for result in (first, second):
            mine = [r.scheduled_s for r in result.records if worker_of(r.index, 0, 2) == w]
            assert [s - mine[0] for s in mine] == pytest.approx(planned, abs=1e-9)  # same seeded offsets
    assert [r.prompt_id for r in first.records] == [r.prompt_id for r in second.records]


def test_workers_start_on_a_barrier_so_none_sends_before_all_are_ready(emulator) -> None:
    emulator.configure(ttft_ms=5, step_ms=1)
    plan = LoadPlan("closed", concurrency=2, requests=4, warmup=0)
    sent: list[RequestRecord] = []
    with pytest.raises(
        WorkerFailed, match=r"load worker 1 of 2 failed: RuntimeError: injected failure before"
    ):
        run(emulator.url, plan, 2, fail={1: "start"}, on_record=sent.append)
    # worker 0 was ready, but waited for worker 1 at the barrier: nothing was sent
    assert sent == [] and emulator.stats()["completions"] == 0


def test_a_failed_worker_fails_the_cell_clearly_and_its_records_are_kept(emulator) -> None:
    emulator.configure(ttft_ms=5, step_ms=1)
    plan = LoadPlan("closed", concurrency=4, requests=8, warmup=4)
    kept: list[RequestRecord] = []
    with pytest.raises(WorkerFailed) as failure:
        run(emulator.url, plan, 2, fail={1: "warmup"}, on_record=kept.append)
    message = str(failure.value)
    assert message.startswith("load worker 1 of 2 failed: RuntimeError: injected failure after warm-up")
    assert "records were written" in message
    assert sorted(r.index for r in kept) == [0, 1, 2, 3]  # both workers' warm-up records
    assert all(r.phase == "warmup" for r in kept)


def test_a_cancelled_cell_stops_its_workers_and_keeps_their_records(emulator) -> None:
    import multiprocessing

    emulator.configure(ttft_ms=10, step_ms=10)
    plan = LoadPlan("closed", concurrency=4, requests=64, warmup=0)
    kept: list[RequestRecord] = []

    async def main() -> None:
        load = run_load_workers(
            emulator.url, MODEL, prompts(tokens=16), plan, Sampling(), 2, on_record=kept.append
        )
        task = asyncio.create_task(load)
        while (await asyncio.to_thread(emulator.stats))["finished"] < 8:
            await asyncio.sleep(0.02)
        task.cancel()  # what a cancelled flow run or Ctrl-C does to the cell
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert sum(r.ok for r in kept) >= 8 and len(kept) < 64
    assert not [c for c in multiprocessing.active_children() if c.name.startswith("specgauge-load-worker")]


def test_a_killed_worker_fails_the_cell_which_keeps_what_was_measured(emulator, tmp_path: Path) -> None:
    """The whole cell (run_cell, its /metrics scrapes and gauges) with W = 2, one worker killed mid-window."""
    import multiprocessing
    import os
    import signal
    import threading

    emulator.configure(ttft_ms=20, step_ms=10)
    killed: list[int] = []

    def kill_worker_1_once_measuring() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and emulator.stats()["finished"] < 16:  # 4 warm-up, 12 measured
            time.sleep(0.02)
        for child in multiprocessing.active_children():
            if child.name == "specgauge-load-worker-1" and child.pid is not None:
                os.kill(child.pid, signal.SIGKILL)
                killed.append(child.pid)

    killer = threading.Thread(target=kill_worker_1_once_measuring, daemon=True)
    killer.start()
    outcome = emulator_cell(
        emulator,
        tmp_path,
        LoadSpec(concurrencies=(4,), requests=64, warmup=4, workers=2, gauge_interval_s=0.2),
        deployment_id="load-workers.kill.l1",
        campaign_id="load-workers-kill",
        tokens=16,
    )
    killer.join(5)
    assert killed, "worker 1 was never seen running"
    error = outcome.summary.error or ""
    assert outcome.status == "failed"
    assert error.startswith("WorkerFailed: load worker 1 of 2 failed: killed by signal 9 (SIGKILL)"), error
    rows = pl.read_parquet(outcome.path / "requests.parquet")
    meta = json.loads((outcome.path / "meta.json").read_text())
    assert meta["load"]["workers"] == 2
    assert rows.height < 68 and rows["ok"].sum() >= 8  # what both workers wrote before the kill is kept
    assert rows["index"].n_unique() == rows.height
    assert {worker_of(i, 4, 2) for i in rows.filter(pl.col("ok"))["index"]} == {0, 1}


# -- the real engine ---------------------------------------------------------------------------------------------------
@pytest.mark.engine
def test_a_w2_cell_on_the_real_engine(engines, campaign_spec: Path, tmp_path: Path) -> None:
    deployment = engines.get("plain")
    spec = load_spec(campaign_spec)
    corpus = load_corpus(REPO / "workloads" / "smoke.jsonl")
    load = LoadSpec(
        concurrencies=(2,), requests=4, warmup=2, allow_short_cells=True, workers=2, request_timeout_s=120
    )
    outcome = run_cell(
        deployment,
        CellPlan("plain.r0.code.c2", "code", "closed", 2, None, "smoke.jsonl"),
        campaign_id="load-workers",
        repeat=0,
        corpus=corpus,
        sampling=Sampling(temperature=0.0, max_tokens=16, ignore_eos=True),
        load=load,
        slo=spec.slo,
        cells_dir=tmp_path / "cells",
    )
    meta = json.loads((outcome.path / "meta.json").read_text())
    rows = pl.read_parquet(outcome.path / "requests.parquet")
    summary = outcome.summary
    assert outcome.status == "ok", summary.error
    assert meta["load"]["workers"] == 2
    assert rows.height == 6 and rows["index"].to_list() == list(range(6)) and rows["ok"].all()
    assert summary.requests.ok == 4 and summary.completion_tokens == 4 * 16
    assert 0 < summary.latency_s.ttft.p50 < 10 and 0 < summary.latency_s.tpot.p50 < 1
    # the scrapes bracket the measured requests of both workers: the server counted exactly their tokens
    check = summary.cross_checks.completion_tokens_vs_generation_tokens
    assert check.ok, check


def test_load_spec_workers_is_one_by_default_a_positive_number_or_auto() -> None:
    assert LoadSpec().workers == 1 and LoadSpec(workers="auto").workers == "auto"
    assert LoadSpec(workers=4).workers == 4
    for bad in (0, "many"):
        with pytest.raises(ValueError):
            LoadSpec(workers=bad)


def test_more_workers_is_another_campaign(campaign_spec: Path) -> None:
    from experiments.plan import spec_digest

    spec = load_spec(
        campaign_spec
    )  # workers 1 (the default) is left out of the digest: ids stay as they were
    two = spec.model_copy(update={"load": spec.load.model_copy(update={"workers": 2})})
    auto = spec.model_copy(update={"load": spec.load.model_copy(update={"workers": "auto"})})
    assert len({spec_digest(spec), spec_digest(two), spec_digest(auto)}) == 3
