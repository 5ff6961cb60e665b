"""Launching deployments: pick a launcher for a spec (the registry), run it with guaranteed teardown, reap
leftovers."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from experiments.spec import TargetSpec, Variant
from tasks.launch import ledger
from tasks.launch.base import Deployment
from tasks.launch.config import LauncherConfig, SavedSettings
from tasks.launch.protocol import Launcher
from tasks.launch.registry import launcher_class, launcher_for


def reap_leftovers(
    *, include_own: bool = False, id_prefix: str = "", saved: SavedSettings | None = None
) -> list[dict[str, Any]]:
    """Stop every deployment in the ledger whose launching process is gone; return what was done.

    `include_own` also stops what this very process launched and did not tear down: for the cancellation
    and crash hooks of a flow run, never for the reaping at a campaign's start (a long-lived process, a
    test session say, may hold live deployments of its own). `id_prefix` limits it to deployments whose
    id starts so (a campaign's own: `<campaign_id>.`). `saved` reads the settings an entry names (a cluster's
    SSH block: `blocks.SavedBlocks()`); without it such an entry is reported, not stopped."""
    done = []
    for entry in ledger.entries():
        if not str(entry.get("id", "")).startswith(id_prefix):
            continue
        own = entry.get("owner_pid") == os.getpid()
        if (own and not include_own) or (not own and ledger.owner_alive(entry)):
            continue
        try:
            outcome = launcher_class(entry["launcher"]).stop_leftover(entry, saved)
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
    "LauncherConfig",
    "SavedSettings",
    "check_drafters",
    "deployed",
    "launcher_class",
    "launcher_for",
    "reap_leftovers",
]
