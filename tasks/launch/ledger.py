"""The deployment ledger: every launch is written down before anyone waits on it, and crossed out at
teardown. Whatever is still in it belongs to a run that crashed; the next run stops it.
"""

from __future__ import annotations

import json
import os
from contextlib import suppress
from pathlib import Path
from typing import Any

import psutil

from specgauge.provenance import utc_now
from specgauge.settings import get_settings


def ledger_dir() -> Path:
    path = get_settings().ledger_dir
    path.mkdir(parents=True, exist_ok=True)
    return path


def record(deployment_id: str, launcher: str, **facts: Any) -> Path:
    """Write (or update) the entry of a live deployment, atomically."""
    path = ledger_dir() / f"{deployment_id}.json"
    entry = {
        "id": deployment_id,
        "launcher": launcher,
        "recorded_at": utc_now(),
        "owner_pid": os.getpid(),
        **facts,
    }
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(entry, indent=2, default=str) + "\n")
    tmp.replace(path)
    return path


def forget(deployment_id: str) -> None:
    (ledger_dir() / f"{deployment_id}.json").unlink(missing_ok=True)


def entries() -> list[dict[str, Any]]:
    out = []
    for path in sorted(ledger_dir().glob("*.json")):
        try:
            out.append(json.loads(path.read_text()))
        except (OSError, json.JSONDecodeError):
            continue  # a half-written entry cannot name anything to stop
    return out


def owner_alive(entry: dict[str, Any]) -> bool:
    """Whether the process that launched this deployment still runs (then it is not a leftover)."""
    pid = entry.get("owner_pid")
    if not pid:
        return False
    if pid == os.getpid():
        return True
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A killed process its parent has not waited for yet still answers signal 0: a Prefect runner kills a
    # cancelled flow run's process, then runs its cancellation hook before reaping it.
    with suppress(psutil.Error):
        return psutil.Process(int(pid)).status() != psutil.STATUS_ZOMBIE
    return False
