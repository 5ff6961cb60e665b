"""Paths that a flow run started from a deployment may touch.

A deployment's parameters come from whoever may start it (the Prefect UI, a schedule, the API), not from the
worker machine's user, so a path parameter must not let them read or write the worker's other files. Runs
started in the user's own shell (the CLI, a script) take any path, as the shell does.

- Specs: experiments/loader.check_spec_path (the repo's experiments/, HOME/specs, SPECGAUGE_SPEC_DIRS).
- Warehouse files, raw trees and report folders: under SPECGAUGE_HOME.
- Inputs (training JSONL, captures, drafter heads): under the repository, SPECGAUGE_HOME or SPECGAUGE_SPEC_DIRS.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from specgauge.errors import InputError


def from_deployment() -> bool:
    """Whether this code runs in a flow run started from a deployment, or in a subflow of one."""
    from prefect.context import FlowRunContext

    context = FlowRunContext.get()
    if context is not None and getattr(context.flow_run, "deployment_id", None) is not None:
        return True
    try:  # set by the flow engine for a deployment's run and inherited by its subflows
        from prefect.context import _deployment_id
    except ImportError:
        return False
    return _deployment_id.get() is not None


def configured_dirs() -> list[Path]:
    from specgauge.settings import get_settings

    spec_dirs = get_settings().spec_dirs or ""
    return [Path(p).expanduser() for p in spec_dirs.split(os.pathsep) if p.strip()]


def home_roots() -> list[Path]:
    """Where a deployment's run may write or open a warehouse: SPECGAUGE_HOME."""
    from specgauge.settings import get_settings

    return [get_settings().home]


def input_roots() -> list[Path]:
    """Where a deployment's run may read inputs: the repository, SPECGAUGE_HOME, SPECGAUGE_SPEC_DIRS."""
    from specgauge.settings import REPO_ROOT

    return [REPO_ROOT, *home_roots(), *configured_dirs()]


def check_under(
    path: str | Path, roots: Sequence[Path], what: str, *, error: type[InputError] = InputError
) -> Path:
    """`path` resolved (relative to the repository, symlinks followed) when it lies under one of `roots`;
    `error` naming the parameter otherwise, before anything opens it."""
    from specgauge.settings import REPO_ROOT

    candidate = Path(path).expanduser()
    if not candidate.is_absolute():  # found where the flows look (experiments.plan.resolve_repo_path)
        found = [root / candidate for root in (REPO_ROOT, Path.cwd()) if (root / candidate).exists()]
        candidate = found[0] if found else REPO_ROOT / candidate
    resolved = candidate.resolve()
    if any(resolved.is_relative_to(root.resolve()) for root in roots):
        return resolved
    shown = str(path) if len(str(path)) <= 200 else str(path)[:197] + "..."
    raise error(
        f"{what} {shown!r} is not under {', '.join(str(r) for r in roots)}: a flow run from a deployment "
        "reaches only those folders (add one with SPECGAUGE_SPEC_DIRS)"
    )


def flow_path(value: str | None, what: str, roots: Sequence[Path] | None = None) -> str | None:
    """A flow's path parameter, checked against `roots` (default: SPECGAUGE_HOME) when the run came from a
    deployment; returned unchanged."""
    if value and from_deployment():
        check_under(value, home_roots() if roots is None else roots, what)
    return value


def flow_paths(values: Sequence[str] | None, what: str, roots: Sequence[Path] | None = None) -> list[str]:
    return [flow_path(value, what, roots) or value for value in values or []]
