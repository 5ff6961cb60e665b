"""How long a hot swap of an EAGLE-3 head takes on the embedded engine, and that it takes effect.

Starts one engine serving tests/data/specs/hot_swap.yaml's eagle3 variant (hot_swap: true), then, in a
loop: measures acceptance on a few greedy code prompts, swaps to a head whose lm_head rows are permuted
(drafts land on wrong tokens), measures again, swaps back. Prints each swap's time (the whole
`swap_head`: contract check, RPC with stage/copy/verify, prefix-cache reset, record) and the engine-side
stage/commit split, the accepted tokens per head, and whether greedy outputs stayed identical (speculation
is lossless, whatever the head).

    nice -n 19 .venv/bin/python benchmarks/hot_swap.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import tempfile
import time
from pathlib import Path
from types import ModuleType

from experiments.spec import load_spec
from specgauge.settings import get_settings
from tasks.drafters.swap import serving_drafter_sha256, swap_head
from tasks.health import wait_ready
from tasks.launch.local import LocalLauncher

REPO = Path(__file__).resolve().parent.parent


def _hot_swap_heads() -> ModuleType:
    """tests/hot_swap_heads.py (the heads the hot-swap tests derive), loaded from its file: tests/ is not a
    package the app's venv installs."""
    spec = importlib.util.spec_from_file_location("hot_swap_heads", REPO / "tests" / "hot_swap_heads.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


SPEC = REPO / "tests" / "data" / "specs" / "hot_swap.yaml"
HEADS = _hot_swap_heads()  # PROMPTS, greedy(), derive_head(), BASE_HEAD: the ones the tests use


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    spec = load_spec(SPEC)
    variant = next(v for v in spec.variants if v.hot_swap)
    work = Path(tempfile.mkdtemp(prefix="hot-swap-bench-"))
    other = HEADS.derive_head(get_settings().engine_python, work / "permuted", "permute_lm_head")
    launcher = LocalLauncher(spec.launcher)
    deployment = launcher.launch(
        spec.target, variant, deployment_id="bench.hot-swap", directory=work / "engine"
    )
    try:
        started = time.perf_counter()
        wait_ready(deployment, launcher, timeout_s=900)
        launcher.collect_facts(deployment)
        print(
            f"engine ready in {time.perf_counter() - started:.1f} s; serving {serving_drafter_sha256(deployment)}"
        )
        reference, accepted, drafted = HEADS.greedy(deployment, HEADS.PROMPTS)
        print(f"original head: {accepted}/{drafted} draft tokens accepted")
        times: list[float] = []
        for i in range(args.rounds):
            for head in (other, HEADS.BASE_HEAD):
                record = swap_head(deployment, head)
                times.append(record.seconds)
                outputs, accepted, drafted = HEADS.greedy(deployment, HEADS.PROMPTS)
                print(
                    f"round {i}: swap to {head.name}: {record.seconds * 1000:.0f} ms; {accepted}/{drafted} "
                    f"accepted; greedy outputs identical: {outputs == reference}; engine {record.engine}"
                )
        print(
            f"swap time over {len(times)} swaps: median {statistics.median(times) * 1000:.0f} ms, "
            f"min {min(times) * 1000:.0f} ms, max {max(times) * 1000:.0f} ms"
        )
    finally:
        launcher.teardown(deployment)


if __name__ == "__main__":
    main()
