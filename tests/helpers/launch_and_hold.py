"""Launch the demo's plain variant inside `deployed()` and hold it, for teardown tests run as a subprocess.

Prints one JSON line {"pid": ..., "id": ...} once the engine process exists, then: `--then raise` raises
inside the block, `--then wait` waits on the readiness check (to be interrupted by a signal), `--then sleep`
sleeps (to be SIGKILLed: only the ledger can clean up after that).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from experiments.spec import load_spec
from tasks.health import wait_ready
from tasks.launch import deployed
from tasks.launch.local import LocalLauncher

REPO = Path(__file__).resolve().parents[2]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dir", type=Path, required=True)
    parser.add_argument("--then", choices=["raise", "wait", "sleep"], required=True)
    args = parser.parse_args()
    spec = load_spec(REPO / "experiments" / "demo.yaml")
    launcher = LocalLauncher(spec.launcher)
    with deployed(
        launcher, spec.target, spec.plain, deployment_id=f"hold-{args.then}", directory=args.dir
    ) as dep:
        print(json.dumps({"pid": dep.pid, "id": dep.id}), flush=True)
        time.sleep(8)  # let vLLM spawn its engine-core child, so teardown must reach the whole group
        if args.then == "raise":
            raise RuntimeError("planted failure inside the deployment block")
        if args.then == "wait":
            wait_ready(dep, launcher, timeout_s=600)
        time.sleep(3600)


if __name__ == "__main__":
    sys.exit(main())
