"""One writer at a time: a file lock beside the DuckDB file, with a note saying who holds it.

DuckDB lets one process open a database file for writing, and fails other processes at once
("Could not set lock on file"). Writers therefore queue on `<db>.lock` (specgauge.locks: flock on Linux;
the kernel releases it when the holder dies, even by SIGKILL). The holder writes `<db>.writer.json` (pid,
host, command, since) so a waiting writer can say whom it waits for.
Prefect flows additionally run their writing tasks under the global concurrency limit WRITER_LIMIT_NAME.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from specgauge.locks import Holder, WaitCallback, held_by_other, one_writer
from specgauge.locks import read_holder as _read_note
from warehouse.errors import WarehouseBusy

WRITER_LIMIT_NAME = "specgauge-warehouse-writer"
"""Name of the Prefect global concurrency limit (limit 1) that flows hold around warehouse writes."""
WRITER_LIMIT_LEASE_S = 60.0
"""Lease of that limit's slot (60 s is the server's minimum). The holder renews it while alive; a holder
that crashed (SIGKILL, OOM) frees the slot within a lease plus the server's repossessor interval (15 s)
instead of Prefect's default 300 s, during which every other writer would wait."""

log = logging.getLogger("specgauge.warehouse")

__all__ = [
    "WRITER_LIMIT_LEASE_S",
    "WRITER_LIMIT_NAME",
    "Holder",
    "WaitCallback",
    "holder_path",
    "lock_path",
    "log",
    "read_holder",
    "writer_active",
    "writer_lock",
]


def lock_path(db_path: Path) -> Path:
    return db_path.with_name(db_path.name + ".lock")


def holder_path(db_path: Path) -> Path:
    return db_path.with_name(db_path.name + ".writer.json")


def read_holder(db_path: Path) -> Holder | None:
    return _read_note(holder_path(Path(db_path)))


def writer_active(db_path: Path) -> bool:
    """Whether a live process holds the warehouse's writer lock right now (the kernel releases it when its
    holder dies, so a crashed writer never counts)."""
    return held_by_other(lock_path(Path(db_path)))


def _default_on_wait(message: str) -> None:
    log.warning(message)


@contextmanager
def writer_lock(
    db_path: Path,
    *,
    timeout_s: float | None = None,
    on_wait: WaitCallback | None = None,
    announce_every_s: float = 30.0,
) -> Iterator[None]:
    """Hold the warehouse's writer lock. When another process holds it, say so through `on_wait`
    (default: a warning on the `specgauge.warehouse` logger), repeat every `announce_every_s`, and wait;
    after `timeout_s` (None: forever) raise WarehouseBusy."""
    db_path = Path(db_path)
    with one_writer(
        lock_path(db_path),
        holder_path(db_path),
        what=f"warehouse {db_path}",
        timeout_s=timeout_s,
        on_wait=on_wait or _default_on_wait,
        announce_every_s=announce_every_s,
        busy=WarehouseBusy,
        lock_name="the warehouse writer lock",
    ):
        yield
