"""Worker scripts that need libraries the application lacks (torch, transformers) run under another Python.

The application's venv has no torch: the model side (token counts, drafter training data, truncation, the
simulation's models) runs as a script under this Python when it has the libraries, else under the engine's
(`SPECGAUGE_ENGINE_PYTHON`, `.engine-venv/bin/python`). One place decides which, and with what environment.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from specgauge.settings import get_settings


def python_with(modules: Sequence[str], error: Callable[[str], Exception], *, purpose: str = "") -> Path:
    """This interpreter if it can import every one of `modules`, else the engine's; raises `error(message)`,
    naming both places it looked, when neither will do. `purpose` (" to count tokens") ends the "no Python
    with ..." phrase."""
    if all(importlib.util.find_spec(module) for module in modules):
        return Path(sys.executable)
    engine = Path(get_settings().engine_python)
    if engine.exists():
        return engine
    lacks = "them" if len(modules) > 1 else "it"
    raise error(
        f"no Python with {' and '.join(modules)}{purpose}: this one ({sys.executable}) lacks {lacks} and the "
        f"engine's ({engine}) does not exist; run `make engine` or set SPECGAUGE_ENGINE_PYTHON"
    )


def worker_env() -> dict[str, str]:
    """This process's environment, with tokenizers single-threaded (the worker is one of several processes)
    and transformers' warnings off (its stderr is what a failure reports)."""
    return {**os.environ, "TOKENIZERS_PARALLELISM": "false", "TRANSFORMERS_VERBOSITY": "error"}


def run_script(python: Path, script: Path, stdin: str) -> subprocess.CompletedProcess[str]:
    """`python script` in `worker_env()`, `stdin` its input, its output captured; the caller judges its exit."""
    return subprocess.run(
        [str(python), str(script)], input=stdin, capture_output=True, text=True, env=worker_env(), check=False
    )
