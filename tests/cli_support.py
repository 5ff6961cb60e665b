"""The specgauge CLI as a user runs it: `python -m cli` in a process of its own, from the repository root.

Not a test module (no `test_` prefix): test modules import it.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping
from typing import Any

from specgauge.settings import REPO_ROOT

CLI = [sys.executable, "-m", "cli"]


def cli_run(
    env: Mapping[str, str], *args: str, timeout: float, **options: Any
) -> subprocess.CompletedProcess[str]:
    """`python -m cli ARGS` under `env`, its output captured as text; subprocess.TimeoutExpired past
    `timeout` seconds. `options` go to subprocess.run (a preexec_fn that limits memory, ...)."""
    return subprocess.run(
        [*CLI, *args], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=timeout, **options
    )
