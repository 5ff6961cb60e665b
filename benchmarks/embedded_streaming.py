"""Does the embedded engine stream token by token? Which settings and conditions make it deliver whole
responses in one burst?

Arms, interleaved per round so the machine's drift hits each alike:
- `worker`: `apart` is vLLM's default multiprocess executor (a worker process beside the engine core); `core` is
  the launcher's default (`--distributed-executor-backend uni` with `VLLM_ENABLE_V1_MULTIPROCESSING=0`: the
  worker inside the engine core's process);
- `hog`: `quiet`, or `busy`: one extra process spinning on the CPU at normal priority for the whole cell (what
  a test suite, a compile or another campaign does to a 2-core machine).

Each launch of the variant serves closed-loop cells at each concurrency through specgauge's own client
(tasks.load: kernel receive timestamps, so a burst is one the server sent, not one the client read late),
and counts bursts as the cells' cross-check does (tasks.metrics.summary: a response of >= 4 chunks whose
chunks all arrived within 1 ms).

    flock /tmp/specgauge-engine.lock .venv/bin/python benchmarks/embedded_streaming.py \\
        [--variant draft-k3] [--requests 24] [--rounds 2] [--concurrency 1,2,4] [--arms core-quiet,core-busy]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import signal
import time
from pathlib import Path
from tempfile import mkdtemp

from rich.console import Console
from rich.table import Table

from experiments.spec import load_spec
from specgauge.settings import REPO_ROOT
from tasks.health import wait_ready
from tasks.launch import deployed
from tasks.launch.local import LocalLauncher
from tasks.load.runner import LoadPlan, run_load_sync
from tasks.metrics.summary import BURST_SPREAD_S
from workloads.schema import load_corpus

ARMS = ("apart-quiet", "core-quiet", "apart-busy", "core-busy")


def spin(stop_at: float) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # not the launcher's handler, inherited by the fork
    while time.monotonic() < stop_at:
        pass


def bursts(records) -> tuple[int, int, list[float]]:
    """(bursts, responses of >= 4 chunks, first-chunk times) of the measured ok records."""
    multi = [r for r in records if r.phase == "measured" and r.ok and r.chunks >= 4]
    held = sum(1 for r in multi if max(r.chunk_offsets_s) - min(r.chunk_offsets_s) < BURST_SPREAD_S)
    firsts = [r.ttft_s for r in records if r.phase == "measured" and r.ok and r.ttft_s is not None]
    return held, len(multi), firsts


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--variant", default="draft-k3")
    parser.add_argument("--requests", type=int, default=24, help="measured requests per cell")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds of every arm")
    parser.add_argument("--concurrency", default="1,2,4", help="comma-separated closed-loop concurrencies")
    parser.add_argument("--arms", default=",".join(ARMS), help=f"some of {', '.join(ARMS)}")
    args = parser.parse_args()
    spec = load_spec(REPO_ROOT / "experiments" / "demo.yaml")
    variant = next(v for v in spec.variants if v.name == args.variant)
    prompts = list(load_corpus(REPO_ROOT / "workloads" / "smoke.jsonl").prompts)
    levels = [int(c) for c in args.concurrency.split(",")]
    arms = args.arms.split(",")
    table = Table(title=f"streaming on the embedded engine ({args.variant}, specgauge's client)")
    for column in ("round", "worker", "machine", "C", "responses", "bursts", "TTFT p50 ms", "load avg"):
        table.add_column(column, justify="right")
    totals: dict[tuple[str, int], list[int]] = {}
    for round_number in range(1, args.rounds + 1):
        for arm in arms:
            worker, machine = arm.split("-")
            launcher = LocalLauncher(
                spec.launcher.model_copy(update={"uniprocess_executor": worker == "core"})
            )
            directory = Path(mkdtemp(prefix="streaming-"))
            with deployed(
                launcher, spec.target, variant, deployment_id="streaming", directory=directory
            ) as dep:
                wait_ready(dep, launcher, timeout_s=600)
                for level in levels:
                    hog = None
                    if machine == "busy":
                        hog = multiprocessing.Process(
                            target=spin, args=(time.monotonic() + 600,), daemon=True
                        )
                        hog.start()
                    try:
                        plan = LoadPlan("closed", concurrency=level, requests=args.requests, warmup=level)
                        result = run_load_sync(
                            dep.base_url, dep.served_model_name, prompts, plan, spec.sampling, timeout_s=120
                        )
                    finally:
                        if hog is not None:
                            hog.terminate()
                            hog.join()
                    held, responses, firsts = bursts(result.records)
                    firsts.sort()
                    total = totals.setdefault((arm, level), [0, 0])
                    total[0] += held
                    total[1] += responses
                    table.add_row(
                        str(round_number),
                        worker,
                        machine,
                        str(level),
                        str(responses),
                        str(held),
                        f"{firsts[len(firsts) // 2] * 1e3:.0f}" if firsts else "-",
                        f"{os.getloadavg()[0]:.1f}",
                    )
    console = Console(width=140)
    console.print(table)
    summary = Table(title="bursts over all rounds")
    for column in ("worker", "machine", "C", "bursts / responses", "share"):
        summary.add_column(column, justify="right")
    for (arm, level), (held, responses) in totals.items():
        worker, machine = arm.split("-")
        share = f"{held / responses:.1%}" if responses else "-"
        summary.add_row(worker, machine, str(level), f"{held} / {responses}", share)
    console.print(summary)


if __name__ == "__main__":
    main()
