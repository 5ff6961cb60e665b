"""Launching deployments: pick a launcher for a spec, run it with guaranteed teardown, reap leftovers."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from experiments.spec import ExperimentSpec, TargetSpec, Variant
from specgauge.errors import InputError
from tasks.drafters.prelaunch import check_drafters
from tasks.launch import ledger
from tasks.launch.base import Deployment, Launcher
from tasks.launch.local import LocalLauncher


def launcher_for(spec: ExperimentSpec) -> Launcher:
    settings = spec.launcher
    if settings.kind == "local":
        return LocalLauncher(settings)
    if settings.kind == "endpoint":
        from tasks.launch.endpoint import EndpointLauncher

        return EndpointLauncher(settings)
    if settings.kind == "slurm":
        from tasks.launch.slurm import SlurmLauncher

        return SlurmLauncher(settings)
    if settings.kind == "sml":
        from tasks.launch.sml import SmlLauncher

        return SmlLauncher(settings)
    raise NotImplementedError(f"launcher kind {settings.kind!r}")


def check_launchable(spec: ExperimentSpec, source: str = "spec") -> None:
    """Input problems a launcher can see before anything starts, e.g. a local draft model whose vocabulary
    is not the target's. A campaign calls this before it writes or launches anything, so bad input costs
    no engine start and leaves no partial campaign. Raises InputError naming the input (`source`: the spec's
    path, for messages)."""
    check_drafters(spec, source)  # tasks/drafters/prelaunch.py
    if spec.launcher.kind != "local":
        return  # cluster paths are not readable from here; the engine checks on its side
    from tasks.launch.local import check_draft_vocabulary, resolve_local

    for variant in spec.variants:
        if variant.method == "draft_model" and variant.draft_model:
            try:
                check_draft_vocabulary(resolve_local(spec.target.model), resolve_local(variant.draft_model))
            except InputError as exc:
                raise InputError(f"variant {variant.name!r}: {exc}") from None


def _stopper(kind: str):
    if kind == "local":
        return LocalLauncher.stop_leftover
    if kind == "endpoint":
        return lambda entry: "endpoint: nothing was launched"
    if kind in ("slurm", "sml"):  # both are SLURM jobs: scancel by the recorded job id
        from tasks.launch.slurm import SlurmLauncher

        return SlurmLauncher.stop_leftover
    raise KeyError(kind)


def reap_leftovers(*, include_own: bool = False, id_prefix: str = "") -> list[dict[str, Any]]:
    """Stop every deployment in the ledger whose launching process is gone; return what was done.

    `include_own` also stops what this very process launched and did not tear down: for the cancellation
    and crash hooks of a flow run, never for the reaping at a campaign's start (a long-lived process, a
    test session say, may hold live deployments of its own). `id_prefix` limits it to deployments whose
    id starts so (a campaign's own: `<campaign_id>.`)."""
    done = []
    for entry in ledger.entries():
        if not str(entry.get("id", "")).startswith(id_prefix):
            continue
        own = entry.get("owner_pid") == os.getpid()
        if (own and not include_own) or (not own and ledger.owner_alive(entry)):
            continue
        try:
            outcome = _stopper(entry["launcher"])(entry)
        except Exception as exc:  # one bad entry must not stop the others from being reaped
            outcome = f"could not stop: {exc}"
            done.append({**entry, "outcome": outcome})
            continue
        ledger.forget(entry["id"])
        done.append({**entry, "outcome": outcome})
    return done


class _Terminated(BaseException):
    """SIGTERM turned into an exception so that `finally` blocks (teardown) run."""


@contextmanager
def sigterm_raises() -> Iterator[None]:
    """Within the block, SIGTERM raises instead of killing the process outright (main thread only)."""

    def handler(signum: int, frame: object) -> None:
        raise _Terminated(f"signal {signum}")

    try:
        previous = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread: Prefect's own handling and the ledger cover this case
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextmanager
def deployed(
    launcher: Launcher, target: TargetSpec, variant: Variant, *, deployment_id: str, directory: Path
) -> Iterator[Deployment]:
    """Launch, yield, and tear down on every exit path: success, error, Ctrl-C, SIGTERM."""
    deployment = launcher.launch(target, variant, deployment_id=deployment_id, directory=directory)
    try:
        with sigterm_raises():
            yield deployment
    except BaseException:
        deployment.status = "failed" if deployment.status != "ready" else deployment.status
        raise
    finally:
        launcher.teardown(deployment)


__all__ = [
    "Deployment",
    "Launcher",
    "LocalLauncher",
    "check_drafters",
    "check_launchable",
    "deployed",
    "launcher_for",
    "reap_leftovers",
]
