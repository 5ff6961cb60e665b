"""What recording a deployment's provenance costs at each launch (issue 33, item 5; tasks/launch/provenance.py).

Measured side by side in one run, on a fresh copy of the target (so the page cache is as warm for each row):
- the target's digest without a cache (every launch would read all of it), with a cold cache (the first
  launch of that folder) and with the warm cache (every later launch: one stat per file);
- the package lock of the engine's environment, read from its site-packages (every launch; its text is stored once per hash);
- the hardware probe (CPU from /proc/cpuinfo, GPUs from nvidia-smi when it is on PATH).

Each row is the median of `--runs` runs. The local launcher does this after the engine is ready (collect_facts),
so it never delays the engine's start or its readiness figure.

    .venv/bin/python benchmarks/provenance_cost.py [--target models/twin-target] [--runs 5]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from specgauge.settings import REPO_ROOT, get_settings
from tasks.launch.provenance import freeze_text, hardware_record, target_digest


def _median_s(work: Callable[[], Any], runs: int, before: Callable[[], None] | None = None) -> float:
    times = []
    for _ in range(runs):
        if before is not None:
            before()
        started = time.perf_counter()
        work()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default=str(REPO_ROOT / "models" / "twin-target"))
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--engine-python", default=str(get_settings().engine_python))
    args = parser.parse_args()
    target = Path(args.target)
    with tempfile.TemporaryDirectory(prefix="provenance-bench-") as tmp:
        cache = Path(tmp) / "cache"

        def clear_cache() -> None:
            for file in cache.glob("*.json"):
                file.unlink()

        target_digest(target, None)  # page cache warm for every row alike
        size = target_digest(target, None)["bytes"]
        rows = [
            ("target digest, no cache", _median_s(lambda: target_digest(target, None), args.runs)),
            (
                "target digest, cold cache (first launch)",
                _median_s(lambda: target_digest(target, cache), args.runs, clear_cache),
            ),
            (
                "target digest, warm cache (later launches)",
                _median_s(lambda: target_digest(target, cache), args.runs),
            ),
            (
                "package lock of the engine's environment (its site-packages)",
                _median_s(lambda: freeze_text(args.engine_python), args.runs),
            ),
            ("hardware probe", _median_s(hardware_record, args.runs)),
        ]
    print(f"target {target} ({size / 2**20:.0f} MiB), median of {args.runs} runs")
    print("| step | seconds |\n|---|---|")
    for name, seconds in rows:
        print(f"| {name} | {seconds:.4f} |")


if __name__ == "__main__":
    main()
