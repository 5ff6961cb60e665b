"""A cell's load on a Dask cluster (tasks/load/dask_load.py): a LocalCluster of real worker processes driving
the emulator, the barrier start and the clock offsets, a worker killed mid-window, a host's clock beyond the
bound. The SSH and SLURM clusters are in tests/test_dask_clusters.py."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import polars as pl
import pytest
from distributed import Client
from emulator_cells import MODEL, emulator_cell, prompts

from experiments.spec import LoadSpec, Sampling
from tasks.load.dask_clusters import close_clusters, open_cluster, shared_client
from tasks.load.dask_load import CellHooks, ClockOffsetExceeded, ServerAccess, measure_offset, run_load_dask
from tasks.load.records import RequestRecord
from tasks.load.runner import LoadPlan, arrival_schedule
from tasks.load.workers import split_plan

LOCAL = {"kind": "local", "workers_per_host": 3}


@pytest.fixture(scope="module")
def cluster() -> Iterator[Client]:
    """Three Dask worker processes on this machine (one share each), for the module's tests."""
    with open_cluster(LoadSpec(cluster=LOCAL).cluster) as client:
        yield client


def worker_of(index: int, warmup: int, workers: int) -> int:
    return index % workers if index < warmup else (index - warmup) % workers


def test_offsets_are_measured_ntp_style_keeping_the_exchange_with_the_least_round_trip() -> None:
    """A scheduler clock 2.5 s ahead, answering after varying delays: the offset comes from the quickest."""
    delays = iter([0.02, 0.001, 0.03, 0.01])

    def scheduler_now() -> float:
        delay = next(delays)
        time.sleep(delay / 2)
        now = time.time() + 2.5
        time.sleep(delay / 2)
        return now

    sample = measure_offset(scheduler_now, exchanges=4)
    assert sample.offset_s == pytest.approx(2.5, abs=0.002)
    assert 0.0005 <= sample.uncertainty_s < 0.003  # half the quickest exchange's round trip


def test_open_loop_cell_on_three_dask_workers_starts_at_one_barrier(cluster: Client, emulator) -> None:
    emulator.configure(ttft_ms=10, step_ms=2)
    plan = LoadPlan("open", rate=60.0, requests=30, warmup=3, seed=5)
    marks: dict[str, float] = {}
    streamed: list[RequestRecord] = []
    t0 = time.perf_counter()

    async def before() -> None:
        marks["before"] = time.perf_counter() - t0
        marks["streamed_before"] = len(streamed)

    async def after() -> None:
        marks["after"] = time.perf_counter() - t0

    result = asyncio.run(
        run_load_dask(
            cluster,
            ServerAccess(emulator.url, MODEL),
            prompts(),
            plan,
            Sampling(),
            CellHooks(before_measured=before, after_measured=after, on_record=streamed.append, t0=t0),
        )
    )
    records = result.records
    assert [r.index for r in records] == list(range(33)) and all(r.ok for r in records)  # W + N, unique
    assert sorted(r.index for r in streamed) == list(range(33))  # each passed to on_record as it arrived
    assert marks["streamed_before"] == 3  # the warm-up records arrived before the window opened
    assert emulator.stats()["completions"] == 33  # what the server saw: every request exactly once
    # where it ran: three workers on one host, its clock offset (same machine: ~0) and its uncertainty
    cluster_facts = result.cluster
    assert cluster_facts["workers"] == 3 and len(cluster_facts["hosts"]) == 1
    host = cluster_facts["hosts"][0]
    assert len(host["workers"]) == 3 and abs(host["offset_ms"]) < 5 and 0 <= host["uncertainty_ms"] < 10
    assert "load from 3 Dask workers on 1 hosts" in result.notes
    # the barrier: the three processes sent their first request together (each stamped by its own clock,
    # moved onto the parent's), none before its planned arrival; each follows its seeded schedule from there
    shares = split_plan(plan, prompts(), 3)
    warm = [r for r in records if r.phase == "warmup"]
    firsts = [min(r.sent_s for r in warm if worker_of(r.index, 3, 3) == w) for w in range(3)]
    assert max(firsts) - min(firsts) < 0.1, firsts  # one start instant (a loaded 2-core machine: < 100 ms)
    assert all(r.sent_s >= r.scheduled_s - 1e-6 for r in records)
    for share in shares:
        mine = [r for r in records if r.phase == "measured" and worker_of(r.index, 3, 3) == share.worker]
        planned = arrival_schedule(share.plan.requests, share.plan.rate, "poisson", share.plan.seed)
        assert [r.scheduled_s - mine[0].scheduled_s for r in mine] == pytest.approx(planned, abs=1e-9)
    # the window on the parent's clock: after every warm-up ended, before any measured request was sent
    measured = [r for r in records if r.phase == "measured"]
    assert max(r.ended_s for r in warm) <= marks["before"] <= result.measured_start_s
    assert result.measured_start_s <= min(r.sent_s for r in measured) + 0.005
    assert max(r.ended_s for r in measured) <= result.measured_end_s + 1e-6 <= marks["after"] + 1e-6


def test_a_host_whose_clock_looks_skewed_fails_the_cell_naming_it(cluster: Client, emulator) -> None:
    plan = LoadPlan("closed", concurrency=3, requests=6, warmup=0)
    with pytest.raises(ClockOffsetExceeded) as failure:
        asyncio.run(
            run_load_dask(
                cluster, ServerAccess(emulator.url, MODEL), prompts(), plan, Sampling(), clock_skew={1: 0.250}
            )
        )
    message = str(failure.value)
    assert message.startswith("host 127.0.0.1 (") and "Dask worker tcp://127.0.0.1:" in message
    assert "+25" in message and "ms" in message and "max_clock_offset_ms = 100" in message
    assert emulator.stats()["completions"] == 0  # refused before anything was sent
    # the cluster is still usable: the next cell runs
    result = asyncio.run(
        run_load_dask(cluster, ServerAccess(emulator.url, MODEL), prompts(), plan, Sampling())
    )
    assert len(result.records) == 6 and all(r.ok for r in result.records)


def test_a_killed_dask_worker_fails_the_cell_which_keeps_the_records_it_sent(
    emulator, tmp_path: Path
) -> None:
    """The whole cell (run_cell through load.cluster) on 3 Dask workers; one is SIGKILLed mid-window."""
    emulator.configure(ttft_ms=20, step_ms=10)
    load = LoadSpec(concurrencies=(6,), requests=120, warmup=6, gauge_interval_s=0.2, cluster=LOCAL)
    client = shared_client(load.cluster)  # what run_cell will use: the same cluster
    pids = client.run(os.getpid)
    victim = sorted(pids)[1]
    killed: list[int] = []

    def kill_once_measuring() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and emulator.stats()["finished"] < 30:  # 6 warm-up, 24 measured
            time.sleep(0.02)
        os.kill(pids[victim], signal.SIGKILL)
        killed.append(pids[victim])

    killer = threading.Thread(target=kill_once_measuring, daemon=True)
    killer.start()
    try:
        outcome = emulator_cell(
            emulator,
            tmp_path,
            load,
            deployment_id="dask-load.kill.l1",
            campaign_id="dask-load-kill",
            tokens=16,
        )
    finally:
        killer.join(5)
        close_clusters()
    assert killed, "the worker was never killed"
    error = outcome.summary.error or ""
    assert outcome.status == "failed"
    assert error.startswith("WorkerFailed: load share ") and f"on Dask worker {victim}" in error, error
    assert "left the cluster" in error and f"pid {killed[0]}" in error, error
    rows = pl.read_parquet(outcome.path / "requests.parquet")
    meta = json.loads((outcome.path / "meta.json").read_text())
    facts = meta["load"]["cluster"]  # where it ran, recorded although the cell failed
    assert meta["load"]["workers"] == 3 and facts["kind"] == "local" and facts["workers"] == 3
    assert len(facts["hosts"]) == 1 and len(facts["hosts"][0]["worker_offsets_ms"]) == 3
    assert rows.height < 126 and rows["index"].n_unique() == rows.height
    ok = rows.filter(pl.col("ok"))
    assert ok.height >= 24
    # the killed share's records sent before the kill are in the raw artifact
    victims_share = [a for a, _ in sorted(pids.items())].index(victim)
    assert ok.height > 0 and victims_share in {worker_of(i, 6, 3) for i in ok["index"]}
