"""How much sampling /metrics during a cell disturbs the latencies it accompanies (the observer effect).

vLLM renders /metrics in its API server process; while it does, streamed chunks wait. On the embedded
engine (2 cores) a scrape can hold a whole short response back, so that every chunk arrives in one burst.
This script runs the same closed-loop cell on one real deployment with the gauge sampler off and at several
intervals, interleaved (off, 0.5 s, 2 s, off, ...) so drift hits every arm alike, and prints TTFT and TPOT
medians, p99, and the share of "burst" requests (all chunks within 1 ms) per arm, with ratios to "off".

    .venv/bin/python benchmarks/gauge_observer_effect.py [--variant draft-k3] [--rounds 3] [--requests 16]

It starts its own engine (about a minute); hold /tmp/specgauge-engine.lock if other engine users run.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path
from tempfile import mkdtemp

import numpy as np
from rich.console import Console
from rich.table import Table

from experiments.spec import load_spec
from specgauge.settings import REPO_ROOT
from tasks.health import wait_ready
from tasks.launch import deployed
from tasks.launch.local import LocalLauncher
from tasks.load.client import StreamingClient
from tasks.load.runner import LoadPlan, run_load
from tasks.metrics.gauges import GaugeSampler
from workloads.schema import load_corpus


async def one_cell(deployment, prompts, sampling, interval: float | None, requests: int):
    plan = LoadPlan(mode="closed", concurrency=1, requests=requests, warmup=2)
    t0 = time.perf_counter()
    async with StreamingClient(deployment.base_url, deployment.served_model_name, timeout_s=120) as client:
        if interval is None:
            result = await run_load(client, prompts, plan, sampling, t0=t0)
        else:
            async with GaugeSampler(
                deployment.metrics_url, deployment.served_model_name, t0=t0, interval_s=interval
            ):
                result = await run_load(client, prompts, plan, sampling, t0=t0)
    return [r for r in result.records if r.phase == "measured" and r.ok]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--variant", default="draft-k3")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--intervals", default="off,0.5,2")
    args = parser.parse_args()
    arms = [None if x == "off" else float(x) for x in args.intervals.split(",")]
    spec = load_spec(REPO_ROOT / "experiments" / "demo.yaml")
    variant = next(v for v in spec.variants if v.name == args.variant)
    prompts = load_corpus(REPO_ROOT / "workloads" / "smoke.jsonl").stratum("chat")
    launcher = LocalLauncher(spec.launcher)
    results: dict[float | None, list] = {arm: [] for arm in arms}
    directory = Path(mkdtemp(prefix="observer-"))
    with deployed(launcher, spec.target, variant, deployment_id="observer", directory=directory) as dep:
        wait_ready(dep, launcher, timeout_s=600)
        for _ in range(args.rounds):
            for arm in arms:
                results[arm] += asyncio.run(one_cell(dep, prompts, spec.sampling, arm, args.requests))

    def stats(records):
        ttft = np.array([r.ttft_s for r in records])
        tpot = np.array([r.tpot_s for r in records if r.tpot_s is not None])
        burst = np.mean(
            [(r.chunk_offsets_s[-1] - r.chunk_offsets_s[0]) < 1e-3 for r in records if r.chunks > 1]
        )
        return np.median(ttft), np.percentile(ttft, 99), np.median(tpot), burst, len(records)

    base = stats(results[None]) if None in results else None
    table = Table(title=f"gauge sampling vs latency ({args.variant}, C=1, {args.rounds} rounds interleaved)")
    for column in (
        "sampler",
        "n",
        "TTFT p50 ms",
        "TTFT p99 ms",
        "TPOT p50 ms",
        "burst share",
        "TTFT p50 ratio",
        "TPOT p50 ratio",
    ):
        table.add_column(column, justify="right")
    for arm in arms:
        ttft50, ttft99, tpot50, burst, n = stats(results[arm])
        ratios = ("", "") if base is None else (f"{ttft50 / base[0]:.2f}", f"{tpot50 / base[2]:.2f}")
        table.add_row(
            "off" if arm is None else f"every {arm:g} s",
            str(n),
            f"{ttft50 * 1e3:.1f}",
            f"{ttft99 * 1e3:.1f}",
            f"{tpot50 * 1e3:.2f}",
            f"{burst:.0%}",
            *ratios,
        )
    Console(width=140).print(table)


if __name__ == "__main__":
    main()
