"""Does a cell's load on Dask keep its rate from 1 to 8 worker processes, and how does its error grow flat out?

Table 1, per N (1, 2, 4, 8): a LocalCluster of N Dask worker processes (processes standing in for hosts, one
thread each, as `tasks/load/dask_clusters.py` starts them) runs one closed-loop cell through
`tasks.load.dask_load.run_load_dask`, worker i driving its own emulator process i (so that no emulator serves
more than at N = 1). Side by side in the same run, the same total load (N x `--streams` streams, N x
`--requests` measured requests) goes through one process (`run_load`, in this one, against emulator 0,
which then serves all of it) and through issue 21's worker processes (`run_load_workers`, W = N, worker i
against emulator i). The per-process offered rate is kept small (about 1,000 chunks/s with the defaults) so
that 8 load processes and 8 emulators fit in 2 cores: each row prints the CPU-seconds per second of the load's
processes, of the parent (for Dask: the scheduler, which LocalCluster runs in this process, and the records'
merge), of the emulators and of the whole machine, and the 1-minute load average at its end. What this shows
on 2 cores is that the Dask path's orchestration (barrier, record queue, merge) loses no rate up to 8
processes, not one client's capacity scaling (that needs >= 16 cores: docs/performance.md, "Multi-process load
generation").

Table 2, past saturation: one Dask worker, its emulator in another process, the offered rate raised step by
step (`--sat-streams`, 5 ms steps) until the worker's CPU is flat out: chunks/s, the worker's and the
emulator's CPU, and TTFT error (measured minus the injected 50 ms) at p50 / p99 with its two parts, the
emulator's lateness (its own trace) and the client's part (the rest), as benchmarks/load_workers.py splits it.

    .venv/bin/python benchmarks/dask_scaling.py [--levels 1,2,4,8] [--streams 12] [--requests 256]
        [--sat-streams 64,256,512,768,1024] [--json rows.json]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
from distributed import Client
from load_workers import MODEL, TTFT_MS, pct, prompts, ttft_error_parts

from emulator import EmulatorConfig, EmulatorProcess
from experiments.spec import LoadSpec, Sampling
from tasks.load.client import StreamingClient
from tasks.load.dask_clusters import open_cluster
from tasks.load.dask_load import ServerAccess, run_load_dask
from tasks.load.runner import LoadPlan, LoadResult, run_load
from tasks.load.workers import run_load_workers

SIDES = ("one process", "workers", "dask")


@dataclass(frozen=True)
class Load:
    """Per load process: closed-loop streams, measured requests, tokens a request, the emulator's step."""

    streams: int
    requests: int
    tokens: int = 32
    step_ms: float = 10.0

    def offered_chunks_per_s(self) -> float:
        """What `streams` closed-loop streams ask of one emulator: a chunk per token, after the TTFT."""
        return self.streams * self.tokens / ((TTFT_MS + self.tokens * self.step_ms) / 1000)

    def plan(self, n: int) -> LoadPlan:
        return LoadPlan(
            "closed",
            concurrency=self.streams * n,
            requests=self.requests * n,
            warmup=self.streams * n,
            time_cap_s=300.0,
        )

    def sampling(self) -> Sampling:
        return Sampling(temperature=0.0, max_tokens=self.tokens, ignore_eos=True)


def machine_busy_s() -> float:
    """CPU-seconds every process of the machine has used so far (/proc/stat: all but idle and iowait)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def process_cpu_s(pids: list[int]) -> float:
    """User + system CPU-seconds of these processes so far."""
    return sum(sum(psutil.Process(pid).cpu_times()[:2]) for pid in pids)


@contextlib.contextmanager
def emulators(n: int, step_ms: float) -> Iterator[list[EmulatorProcess]]:
    """`n` emulator processes, each tracing its requests (arrival, first write) for the error's split."""
    config = EmulatorConfig(port=0, model=MODEL, ttft_ms=TTFT_MS, step_ms=step_ms, trace=True)
    started = [EmulatorProcess(config) for _ in range(n)]
    try:
        for emulator in started:
            emulator.start()
        yield started
    finally:
        for emulator in started:
            emulator.stop()


def measure(
    side: str,
    n: int,
    load: Load,
    servers: list[EmulatorProcess],
    run: Callable[[LoadPlan], LoadResult],
    load_cpu_s: Callable[[], float],
) -> dict[str, Any]:
    """Run one cell (`run(plan)`) against `servers` (server i serves load process i) and measure it: its
    rate, the CPU of the load's processes (`load_cpu_s`, read before and after), of this process (None when
    this process is the load's), of the emulators and of the whole machine, and the TTFT error's parts."""
    plan = load.plan(n)
    for server in servers:
        server.trace()  # drop what earlier cells traced
    before = (load_cpu_s(), time.process_time(), [s.cpu_seconds() for s in servers], machine_busy_s())
    wall = time.perf_counter()
    result = run(plan)
    wall = time.perf_counter() - wall
    after = (load_cpu_s(), time.process_time(), [s.cpu_seconds() for s in servers], machine_busy_s())
    traces = [server.trace() for server in servers]
    measured = [r for r in result.records if r.phase == "measured"]
    ok = [r for r in measured if r.ok and r.ttft_s is not None]
    window = (result.measured_end_s or 0.0) - (result.measured_start_s or 0.0)
    sent = [r.sent_s for r in result.records if r.sent_s is not None]
    ended = [r.ended_s for r in result.records if r.ended_s is not None]
    span = max(ended) - min(sent) if sent and ended else float("nan")  # first send to last end
    ttft_err, late, client = ttft_error_parts(ok, traces, plan.warmup, result.t0_perf)
    emulator_cpu = [a - b for a, b in zip(after[2], before[2], strict=True)]
    return {
        "side": side,
        "n": n,
        "streams": plan.concurrency,
        "records": len(result.records),
        "expected_records": plan.warmup + plan.requests,
        "indices": sorted(r.index for r in result.records),
        "requests_ok": len(ok),
        "requests": len(measured),
        "chunks_per_s": sum(r.chunks for r in ok) / window if window > 0 else float("nan"),
        "window_s": window,
        "span_s": span,
        "wall_s": wall,
        "load_cpu_per_s": (after[0] - before[0]) / span,
        "parent_cpu_per_s": None if side == "one process" else (after[1] - before[1]) / span,
        "emulators_cpu_per_s": sum(emulator_cpu) / span,
        "emulator_cpu_per_s_max": max(emulator_cpu) / span,
        "machine_cpu_per_s": (after[3] - before[3]) / wall,
        "load_average_end": os.getloadavg()[0],
        "ttft_err_p50_ms": pct(ttft_err, 50) * 1e3,
        "ttft_err_p99_ms": pct(ttft_err, 99) * 1e3,
        "emulator_late_p99_ms": pct(late, 99) * 1e3,
        "client_part_p50_ms": pct(client, 50) * 1e3,
        "client_part_p99_ms": pct(client, 99) * 1e3,
    }


def one_process(n: int, load: Load, servers: list[EmulatorProcess]) -> dict[str, Any]:
    """The whole load from this process's one client, against the first emulator."""

    async def cell(plan: LoadPlan) -> LoadResult:
        connections = plan.connections()
        async with StreamingClient(servers[0].url, MODEL, timeout_s=120.0, max_connections=connections) as c:
            return await run_load(c, prompts(load.tokens), plan, load.sampling())

    def run(plan: LoadPlan) -> LoadResult:
        return asyncio.run(cell(plan))

    # this process is the load's: its CPU is the load's, and there is no other parent
    return measure("one process", n, load, servers[:1], run, time.process_time)


def worker_processes(n: int, load: Load, servers: list[EmulatorProcess]) -> dict[str, Any]:
    """Issue 21's workers: W = n processes, worker i against emulator i. Their CPU is each one's own
    process time from the start barrier on (from its result file: spawning and imports are not counted)."""
    records_dir = Path(tempfile.mkdtemp(prefix="dask-scaling-workers-"))
    urls = [s.url for s in servers]

    def cell(plan: LoadPlan) -> LoadResult:
        return asyncio.run(
            run_load_workers(
                urls, MODEL, prompts(load.tokens), plan, load.sampling(), n, timeout_s=120.0,
                records_dir=records_dir,
            )
        )  # fmt: skip

    def cpu_s() -> float:
        return sum(json.loads(f.read_text())["cpu_s"] for f in records_dir.glob("worker-*.result.json"))

    try:
        return measure("workers", n, load, servers, cell, cpu_s)
    finally:
        shutil.rmtree(records_dir, ignore_errors=True)


def dask_workers(client: Client, n: int, load: Load, servers: list[EmulatorProcess]) -> dict[str, Any]:
    """The Dask path: one share per Dask worker, share i against emulator i. The workers' CPU is their whole
    processes' (Dask's own threads included); the parent's includes the scheduler, which runs in it."""
    pids = list(client.run(os.getpid).values())
    urls = [s.url for s in servers]

    def cell(plan: LoadPlan) -> LoadResult:
        return asyncio.run(
            run_load_dask(
                client,
                ServerAccess(urls, MODEL, timeout_s=120.0),
                prompts(load.tokens),
                plan,
                load.sampling(),
            )
        )

    return measure("dask", n, load, servers, cell, lambda: process_cpu_s(pids))


def local_cluster(n: int) -> contextlib.AbstractContextManager[Client]:
    return open_cluster(LoadSpec(cluster={"kind": "local", "workers_per_host": n}).cluster)


def scaling_rows(levels: list[int], load: Load, sides: tuple[str, ...] = SIDES) -> list[dict[str, Any]]:
    """Table 1's rows: for each N, one cell per side in `sides`, side by side."""
    rows = []
    for n in levels:
        with emulators(n, load.step_ms) as servers:
            if "one process" in sides:
                rows.append(one_process(n, load, servers))
            if "workers" in sides:
                rows.append(worker_processes(n, load, servers))
            if "dask" in sides:
                started = time.monotonic()
                with local_cluster(n) as client:
                    up_s = time.monotonic() - started
                    rows.append(dask_workers(client, n, load, servers) | {"cluster_up_s": up_s})
        for row in rows[-len(sides) :]:
            print(
                f"  N={n} {row['side']}: {row['chunks_per_s']:,.0f} chunks/s in {row['window_s']:.2f} s, "
                f"{row['records']}/{row['expected_records']} records ({row['wall_s']:.1f} s wall)",
                flush=True,
            )
    return rows


def saturation_rows(steps: list[int], tokens: int, step_ms: float, window_s: float) -> list[dict[str, Any]]:
    """Table 2's rows: one Dask worker against one emulator process, `steps` closed-loop streams in turn,
    each with enough measured requests for about `window_s` seconds at the offered rate."""
    rows = []
    with emulators(1, step_ms) as servers, local_cluster(1) as client:
        for streams in steps:
            offered = Load(streams, 1, tokens, step_ms).offered_chunks_per_s()
            load = Load(streams, max(2 * streams, round(offered * window_s / tokens)), tokens, step_ms)
            rows.append(dask_workers(client, 1, load, servers) | {"offered_chunks_per_s": offered})
            row = rows[-1]
            print(
                f"  {streams} streams: offered {offered:,.0f}, {row['chunks_per_s']:,.0f} chunks/s, worker "
                f"{row['load_cpu_per_s']:.2f} CPU-s/s, TTFT err p99 {row['ttft_err_p99_ms']:.2f} ms",
                flush=True,
            )
    return rows


def print_scaling(rows: list[dict[str, Any]]) -> None:
    base = {r["side"]: r["chunks_per_s"] / r["n"] for r in rows if r["n"] == min(x["n"] for x in rows)}
    print(
        "\n| N | side | streams | ok | chunks/s | x N = 1 | x / N | load CPU-s/s | parent CPU-s/s "
        "| emulators CPU-s/s | machine CPU-s/s | load avg | TTFT err p50 / p99 | emulator late p99 "
        "| client part p50 / p99 |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        ratio = r["chunks_per_s"] / base[r["side"]]
        parent = "-" if r["parent_cpu_per_s"] is None else f"{r['parent_cpu_per_s']:.2f}"
        print(
            f"| {r['n']} | {r['side']} | {r['streams']} | {r['requests_ok']}/{r['requests']} "
            f"| {r['chunks_per_s']:,.0f} | {ratio:.2f} | {ratio / r['n']:.2f} | {r['load_cpu_per_s']:.2f} "
            f"| {parent} | {r['emulators_cpu_per_s']:.2f} | {r['machine_cpu_per_s']:.2f} "
            f"| {r['load_average_end']:.1f} | {r['ttft_err_p50_ms']:.2f} / {r['ttft_err_p99_ms']:.2f} "
            f"| {r['emulator_late_p99_ms']:.2f} | {r['client_part_p50_ms']:.2f} / {r['client_part_p99_ms']:.2f} |"
        )


def print_saturation(rows: list[dict[str, Any]]) -> None:
    print(
        "\n| streams | offered chunks/s | chunks/s | worker CPU-s/s | emulator CPU-s/s | parent CPU-s/s "
        "| machine CPU-s/s | load avg | TTFT err p50 / p99 | emulator late p99 | client part p50 / p99 |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['streams']} | {r['offered_chunks_per_s']:,.0f} | {r['chunks_per_s']:,.0f} "
            f"| {r['load_cpu_per_s']:.2f} | {r['emulators_cpu_per_s']:.2f} | {r['parent_cpu_per_s']:.2f} "
            f"| {r['machine_cpu_per_s']:.2f} | {r['load_average_end']:.1f} "
            f"| {r['ttft_err_p50_ms']:.2f} / {r['ttft_err_p99_ms']:.2f} | {r['emulator_late_p99_ms']:.2f} "
            f"| {r['client_part_p50_ms']:.2f} / {r['client_part_p99_ms']:.2f} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--levels",
        default="1,2,4,8",
        help="table 1's N values (Dask worker processes), comma separated ('' skips it)",
    )
    parser.add_argument("--streams", type=int, default=12, help="closed-loop streams per load process")
    parser.add_argument("--requests", type=int, default=256, help="measured requests per load process")
    parser.add_argument("--tokens", type=int, default=32, help="tokens a request (one a chunk)")
    parser.add_argument("--step-ms", type=float, default=10.0, help="the emulator's step, table 1")
    parser.add_argument("--sat-streams", default="64,256,512,768,1024", help="table 2's steps ('' skips it)")
    parser.add_argument("--sat-step-ms", type=float, default=5.0, help="the emulator's step, table 2")
    parser.add_argument("--sat-window-s", type=float, default=5.0, help="measured seconds per step, table 2")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args()
    load = Load(args.streams, args.requests, args.tokens, args.step_ms)
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    print(
        f"{started}; {os.cpu_count()} CPUs; load average before {' '.join(f'{x:.2f}' for x in os.getloadavg())}; "
        f"per load process: {load.streams} streams, {load.requests} measured requests of {load.tokens} tokens, "
        f"{load.step_ms:g} ms steps (about {load.offered_chunks_per_s():,.0f} chunks/s offered)",
        flush=True,
    )
    scaling: list[dict[str, Any]] = []
    if args.levels:
        scaling = scaling_rows([int(x) for x in args.levels.split(",")], load)
        print_scaling(scaling)
    saturation: list[dict[str, Any]] = []
    if args.sat_streams:
        print(f"\npast saturation, load average before {os.getloadavg()[0]:.2f}", flush=True)
        steps = [int(x) for x in args.sat_streams.split(",")]
        saturation = saturation_rows(steps, args.tokens, args.sat_step_ms, args.sat_window_s)
        print_saturation(saturation)
    ended = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    print(f"\n{started} to {ended}; load average after {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if args.json:
        for row in scaling + saturation:
            row.pop("indices")
        args.json.write_text(json.dumps({"scaling": scaling, "saturation": saturation}, indent=1))


if __name__ == "__main__":
    main()
