"""Does the embedded engine stream token by token? Default executor against the uniprocess executor.

Launches the same variant twice (vLLM's default multiprocess executor, then `--distributed-executor-backend
uni`), streams the same chat prompts one at a time with plain httpx (no specgauge client involved), and
counts responses whose chunks all arrived within 1 ms (delivered in one burst), with first-chunk times.

    .venv/bin/python benchmarks/embedded_streaming.py [--variant draft-k3] [--requests 16] [--rounds 2]

Each launch takes about a minute; hold /tmp/specgauge-engine.lock if other engine users run.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from tempfile import mkdtemp

import httpx
from rich.console import Console
from rich.table import Table

from experiments.spec import load_spec
from specgauge.settings import REPO_ROOT
from tasks.health import wait_ready
from tasks.launch import deployed
from tasks.launch.local import LocalLauncher
from workloads.schema import load_corpus


def stream_times(base_url: str, model: str, prompt) -> list[float]:
    body = {
        "model": model,
        "messages": prompt.chat_messages(),
        "max_tokens": prompt.max_tokens,
        "temperature": 0,
        "stream": True,
    }
    started, times = time.perf_counter(), []
    with httpx.stream("POST", f"{base_url}/v1/chat/completions", json=body, timeout=120) as response:
        for line in response.iter_lines():
            if line.startswith("data: {"):
                times.append(time.perf_counter() - started)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--variant", default="draft-k3")
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds of both executors")
    args = parser.parse_args()
    spec = load_spec(REPO_ROOT / "experiments" / "demo.yaml")
    variant = next(v for v in spec.variants if v.name == args.variant)
    prompts = load_corpus(REPO_ROOT / "workloads" / "smoke.jsonl").stratum("chat")
    table = Table(title=f"streaming on the embedded engine ({args.variant}, C=1, httpx)")
    for column in (
        "round",
        "executor",
        "responses",
        "bursts",
        "first chunk p50 ms",
        "first chunk max ms",
        "load avg",
    ):
        table.add_column(column, justify="right")
    for round_number in range(1, args.rounds + 1):  # interleaved, so a noisy spell hits both arms
        for uni in (False, True):
            launcher = LocalLauncher(spec.launcher.model_copy(update={"uniprocess_executor": uni}))
            directory = Path(mkdtemp(prefix="streaming-"))
            with deployed(
                launcher, spec.target, variant, deployment_id="streaming", directory=directory
            ) as dep:
                wait_ready(dep, launcher, timeout_s=600)
                runs = [
                    stream_times(dep.base_url, dep.served_model_name, prompts[i % len(prompts)])
                    for i in range(args.requests)
                ]
            bursts = sum(1 for t in runs if len(t) >= 4 and t[-1] - t[0] < 1e-3)
            firsts = sorted(t[0] * 1e3 for t in runs)
            table.add_row(
                str(round_number),
                "uni" if uni else "default (multiprocess)",
                str(len(runs)),
                str(bursts),
                f"{firsts[len(firsts) // 2]:.0f}",
                f"{firsts[-1]:.0f}",
                f"{os.getloadavg()[0]:.1f}",
            )
    Console(width=140).print(table)


if __name__ == "__main__":
    main()
