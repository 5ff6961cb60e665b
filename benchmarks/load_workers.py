"""Does load generation scale with worker processes? Chunks per second and TTFT error at W = 1, 2, 4, 8.

Each W runs one closed-loop cell through `tasks.load.workers.run_load_workers`: W worker processes, each
with `--streams` streams (C = W x streams: every worker carries the same load as the one process at W = 1),
each against its own emulator process (emulator/, one per worker, so that no emulator serves more than the
one process at W = 1 did). Each stream asks for `--tokens` tokens, one a chunk, after an injected TTFT of 50
ms, at `--step-ms` per step: with the defaults a worker is offered 51,200 chunks a second, more than one
Python process reads, so each worker runs flat out and the figure is the client's capacity. Where there are
enough CPUs (2 x the largest W), worker i is pinned to CPU i and its emulator to CPU (max W + i).

Per W: measured chunks per second of the whole cell (chunks of measured requests over the measured window),
its ratio to W = 1 and that ratio over W (the target: >= 0.85 at W = 8), the workers' CPU-seconds per
wall-second (near W: the clients are the bottleneck) and the emulators' (below 1 each: they are not), and TTFT
error (measured minus injected) at p50 / p99, whole and split: the emulator's lateness (its first write
minus arrival minus 50 ms, from its trace) and the client's part (the rest: send to the emulator's read, and
its first write to the client's kernel stamp; requests paired with the emulator's trace in send order). The
target: p99 TTFT error under 1 ms at W = 8.

    .venv/bin/python benchmarks/load_workers.py [--workers 1,2,4,8] [--streams 256] [--requests 4096]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

from emulator import EmulatorConfig, EmulatorProcess
from experiments.spec import Sampling
from tasks.load.records import RequestRecord
from tasks.load.runner import LoadPlan
from tasks.load.workers import run_load_workers
from workloads.schema import Prompt

TTFT_MS = 50.0
MODEL = "emulated"


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def prompts(tokens: int) -> list[Prompt]:
    return [
        Prompt(
            id=f"p{i}", workload="bench", max_tokens=tokens, messages=[{"role": "user", "content": f"q {i}"}]
        )
        for i in range(16)
    ]


def children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def ttft_error_parts(
    ok: list[RequestRecord], traces: list[list[dict]], warmup: int, t0_perf: float
) -> tuple[list[float], list[float], list[float]]:
    """TTFT error (measured minus injected, s) of the measured requests `ok`, and its two parts where a
    request pairs with its emulator's trace: the emulator's lateness and the client's part (the rest).
    `traces[i]` is the trace of worker i's emulator (W = len(traces), requests dealt round robin after the
    `warmup`); requests pair with its arrivals in send order. Times on one host's monotonic clock."""
    ttft_err = [r.ttft_s - TTFT_MS / 1000 for r in ok if r.ttft_s is not None]
    late: list[float] = []
    client: list[float] = []
    w = len(traces)
    for i, trace in enumerate(traces):
        mine = [r for r in ok if (r.index - warmup) % w == i]  # worker i's requests (the deal)
        sent = sorted(mine, key=lambda r: r.sent_s)
        first_send = t0_perf + sent[0].sent_s if sent else 0.0
        arrivals = sorted(
            (t for t in trace if t.get("received") is not None and t["received"] >= first_send - 1e-4),
            key=lambda t: t["received"],
        )
        for r, t in zip(sent, arrivals, strict=False):
            if t.get("first") is None:
                continue
            late.append(t["first"] - t["received"] - TTFT_MS / 1000)
            client.append(r.ttft_s - (t["first"] - t["received"]))
    return ttft_err, late, client


def one_run(w: int, args: argparse.Namespace, pin: bool, max_w: int) -> dict:
    config = EmulatorConfig(
        port=0, model=MODEL, ttft_ms=TTFT_MS, step_ms=args.step_ms, spin_ms=args.spin_ms, trace=True
    )
    emulators = [EmulatorProcess(config, cpu=(max_w + i) if pin else None) for i in range(w)]
    for emulator in emulators:
        emulator.start()
    try:
        plan = LoadPlan(
            "closed",
            concurrency=args.streams * w,
            requests=args.requests * w,
            warmup=args.streams * w,
            time_cap_s=300.0,
        )
        sampling = Sampling(temperature=0.0, max_tokens=args.tokens, ignore_eos=True)
        emulator_cpu = [e.cpu_seconds() for e in emulators]
        for emulator in emulators:
            emulator.trace()  # drop anything traced so far
        records_dir = Path(tempfile.mkdtemp(prefix="load-workers-bench-"))
        cpu_before = children_cpu_s()
        wall = time.perf_counter()
        result = asyncio.run(
            run_load_workers(
                [e.url for e in emulators],
                MODEL,
                prompts(args.tokens),
                plan,
                sampling,
                w,
                timeout_s=120.0,
                cpus=[[i] for i in range(w)] if pin else None,
                records_dir=records_dir,
            )
        )
        wall = time.perf_counter() - wall
        workers_cpu = children_cpu_s() - cpu_before
        results = [json.loads(f.read_text()) for f in sorted(records_dir.glob("worker-*.result.json"))]
        load_cpu = [r["cpu_s"] for r in results]
        shutil.rmtree(records_dir, ignore_errors=True)
        emulator_cpu = [e.cpu_seconds() - c for e, c in zip(emulators, emulator_cpu, strict=True)]
        traces = [e.trace() for e in emulators]
    finally:
        for emulator in emulators:
            emulator.stop()
    measured = [r for r in result.records if r.phase == "measured"]
    ok = [r for r in measured if r.ok and r.ttft_s is not None]
    window = (result.measured_end_s or 0.0) - (result.measured_start_s or 0.0)
    chunks = sum(r.chunks for r in ok)
    ttft_err, late, client = ttft_error_parts(ok, traces, plan.warmup, result.t0_perf)
    return {
        "workers": w,
        "streams": plan.concurrency,
        "requests_ok": len(ok),
        "requests": len(measured),
        "chunks": chunks,
        "window_s": window,
        "chunks_per_s": chunks / window if window > 0 else float("nan"),
        "wall_s": wall,
        "workers_cpu_per_s": workers_cpu / window if window > 0 else float("nan"),
        "load_cpu_s": load_cpu,  # each worker's CPU-seconds from its start barrier on (its own process time)
        "all_chunks": sum(r.chunks for r in result.records),
        "chunks_per_worker_cpu_s": sum(r.chunks for r in result.records) / sum(load_cpu),
        "emulator_cpu_per_s_max": max(emulator_cpu) / window if window > 0 else float("nan"),
        "ttft_err_p50_ms": pct(ttft_err, 50) * 1e3,
        "ttft_err_p99_ms": pct(ttft_err, 99) * 1e3,
        "emulator_late_p99_ms": pct(late, 99) * 1e3,
        "client_part_p50_ms": pct(client, 50) * 1e3,
        "client_part_p99_ms": pct(client, 99) * 1e3,
        "notes": result.notes,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", default="1,2,4,8", help="W values, comma separated")
    parser.add_argument("--streams", type=int, default=256, help="streams per worker (C = W x this)")
    parser.add_argument("--requests", type=int, default=4096, help="measured requests per worker")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--step-ms", type=float, default=5.0)
    parser.add_argument("--spin-ms", type=float, default=0.0, help="the emulator's spin before writes")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args()
    levels = [int(x) for x in args.workers.split(",")]
    cpus = len(os.sched_getaffinity(0))
    pin = cpus >= 2 * max(levels)
    offered = args.streams * 1000 / (args.step_ms + TTFT_MS / args.tokens)
    print(
        f"{time.strftime('%Y-%m-%d %H:%M:%S %Z')}; {cpus} CPUs; load average {os.getloadavg()[0]:.1f}; "
        f"{'pinned' if pin else 'not pinned (too few CPUs)'}; per worker: {args.streams} streams, "
        f"{args.requests} measured requests of {args.tokens} tokens, {args.step_ms:g} ms steps "
        f"(about {offered:,.0f} chunks/s offered)"
    )
    rows = []
    for w in levels:
        rows.append(one_run(w, args, pin, max(levels)))
        r = rows[-1]
        print(
            f"  W={w}: {r['chunks_per_s']:,.0f} chunks/s in {r['window_s']:.2f} s ({r['wall_s']:.1f} s wall)"
        )
    one = next((r for r in rows if r["workers"] == 1), rows[0])  # the one-process rate (per worker)
    base = one["chunks_per_s"] / one["workers"]
    print()
    print(
        "| W | streams | ok | chunks/s | x one process | x / W | workers CPU-s/s (incl. start) | max emulator CPU-s/s "
        "| chunks / worker CPU-s | TTFT err p50 / p99 (ms) | emulator late p99 | client part p50 / p99 |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        ratio = r["chunks_per_s"] / base
        print(
            f"| {r['workers']} | {r['streams']} | {r['requests_ok']}/{r['requests']} | {r['chunks_per_s']:,.0f} "
            f"| {ratio:.2f} | {ratio / r['workers']:.2f} | {r['workers_cpu_per_s']:.2f} "
            f"| {r['emulator_cpu_per_s_max']:.2f} | {r['chunks_per_worker_cpu_s']:,.0f} "
            f"| {r['ttft_err_p50_ms']:.2f} / {r['ttft_err_p99_ms']:.2f} "
            f"| {r['emulator_late_p99_ms']:.2f} | {r['client_part_p50_ms']:.2f} / {r['client_part_p99_ms']:.2f} |"
        )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
