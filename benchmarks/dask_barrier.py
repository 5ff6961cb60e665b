"""How closely the Dask load's shares start together, and how well a host's clock offset is measured.

On one machine every host's true clock offset against the scheduler is 0, so the offsets
`tasks/load/dask_load.py` measures (NTP-style, the best of 8 exchanges) are their own error. The script
starts a LocalCluster of W worker processes, then runs R cells against an emulator process: per cell, each
share's measured offset and uncertainty, and the spread of the shares' first sends (each stamped by its own
process, moved onto the parent's clock): how far apart the processes really began at the common instant.

    .venv/bin/python benchmarks/dask_barrier.py [--workers 4] [--cells 10]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time

from emulator import EmulatorConfig, EmulatorProcess
from experiments.spec import LoadSpec, Sampling
from tasks.load.dask_clusters import open_cluster
from tasks.load.dask_load import ServerAccess, run_load_dask
from tasks.load.runner import LoadPlan
from workloads.schema import Prompt


def _prompts() -> list[Prompt]:
    return [
        Prompt(id=f"p{i}", workload="w", max_tokens=8, messages=[{"role": "user", "content": f"q {i}"}])
        for i in range(8)
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--cells", type=int, default=10)
    args = parser.parse_args()
    w = args.workers
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    plan = LoadPlan("open", rate=40.0 * w, requests=8 * w, warmup=w, seed=1)
    offsets: list[float] = []
    uncertainties: list[float] = []
    spreads: list[float] = []
    with EmulatorProcess(EmulatorConfig(port=0, model="bench", ttft_ms=10, step_ms=2)) as emu:
        started = time.monotonic()
        with open_cluster(LoadSpec(cluster={"kind": "local", "workers_per_host": w}).cluster) as client:
            print(f"LocalCluster of {w} worker processes up in {time.monotonic() - started:.1f} s")
            for _ in range(args.cells):
                result = asyncio.run(
                    run_load_dask(client, ServerAccess(emu.url, "bench"), _prompts(), plan, Sampling())
                )
                for host in result.cluster["hosts"]:
                    offsets += [abs(v) for v in host["worker_offsets_ms"].values()]
                    uncertainties.append(host["uncertainty_ms"])
                firsts: dict[int, float] = {}
                for record in result.records:
                    if record.phase == "warmup" and record.sent_s is not None:
                        share = record.index % w
                        firsts[share] = min(firsts.get(share, record.sent_s), record.sent_s)
                spreads.append((max(firsts.values()) - min(firsts.values())) * 1e3)
            print(f"load average during: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")

    def row(name: str, values: list[float]) -> str:
        ordered = sorted(values)
        p95 = ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))]
        return f"| {name} | {len(values)} | {statistics.median(values):.3f} | {p95:.3f} | {max(values):.3f} |"

    print(f"\n{args.cells} cells of {plan.warmup + plan.requests} requests, W = {w} (true offsets: 0)\n")
    print("| figure (ms) | n | median | p95 | max |")
    print("|---|---|---|---|---|")
    print(row("measured offset of a worker, absolute (its error here)", offsets))
    print(row("offset uncertainty of a host (best exchange's half round trip)", uncertainties))
    print(row("spread of the shares' first sends in a cell", spreads))


if __name__ == "__main__":
    main()
