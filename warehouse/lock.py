"""One writer at a time: a file lock beside the DuckDB file, with a note saying who holds it.

DuckDB lets one process open a database file for writing, and fails other processes at once
("Could not set lock on file"). Writers therefore queue on `<db>.lock` (the filelock package, flock on
Linux; the kernel releases it when the holder dies, even by SIGKILL). The holder writes
`<db>.writer.json` (pid, host, command, since) so a waiting writer can say whom it waits for.
Prefect flows additionally run their writing tasks under the global concurrency limit WRITER_LIMIT_NAME.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil
from filelock import FileLock, Timeout

from specgauge.provenance import utc_now
from warehouse.errors import WarehouseBusy

WRITER_LIMIT_NAME = "specgauge-warehouse-writer"
"""Name of the Prefect global concurrency limit (limit 1) that flows hold around warehouse writes."""
WRITER_LIMIT_LEASE_S = 60.0
"""Lease of that limit's slot (60 s is the server's minimum). The holder renews it while alive; a holder
that crashed (SIGKILL, OOM) frees the slot within a lease plus the server's repossessor interval (15 s)
instead of Prefect's default 300 s, during which every other writer would wait."""

log = logging.getLogger("specgauge.warehouse")

WaitCallback = Callable[[str], None]


def lock_path(db_path: Path) -> Path:
    return db_path.with_name(db_path.name + ".lock")


def holder_path(db_path: Path) -> Path:
    return db_path.with_name(db_path.name + ".writer.json")


@dataclass
class Holder:
    pid: int
    host: str
    command: str
    since_utc: str

    def describe(self) -> str:
        alive = self.host != socket.gethostname() or psutil.pid_exists(self.pid)
        stale = "" if alive else " (that process is gone: this note may be stale)"
        return f"pid {self.pid} on {self.host} ({self.command}), since {self.since_utc}{stale}"


def read_holder(db_path: Path) -> Holder | None:
    try:
        return Holder(**json.loads(holder_path(db_path).read_text()))
    except (OSError, ValueError, TypeError):
        return None


def _write_holder(db_path: Path) -> None:
    holder = Holder(
        pid=os.getpid(),
        host=socket.gethostname(),
        command=" ".join(Path(sys.argv[0]).name.split() + sys.argv[1:])[:200] or "python",
        since_utc=utc_now(),
    )
    tmp = holder_path(db_path).with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(asdict(holder)) + "\n")
    tmp.replace(holder_path(db_path))


def writer_active(db_path: Path) -> bool:
    """Whether a live process holds the warehouse's writer lock right now (the kernel releases it when its
    holder dies, so a crashed writer never counts)."""
    lock = FileLock(str(lock_path(Path(db_path))), thread_local=False, is_singleton=True)
    try:
        lock.acquire(timeout=0)
    except Timeout:
        return True
    lock.release()
    return False


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
    db_path.parent.mkdir(parents=True, exist_ok=True)
    # One lock object per path in a process (is_singleton), so a nested writer re-enters instead of
    # deadlocking on its own flock.
    lock = FileLock(str(lock_path(db_path)), thread_local=False, is_singleton=True)
    say = on_wait or _default_on_wait
    try:
        lock.acquire(timeout=0)
    except Timeout:
        started = time.monotonic()
        holder = read_holder(db_path)
        who = holder.describe() if holder else "another process (it left no note)"
        limit = "" if timeout_s is None else f" for up to {timeout_s:g} s"
        say(f"warehouse {db_path} is being written by {who}; waiting{limit} for it to finish")
        while True:
            remaining = None if timeout_s is None else timeout_s - (time.monotonic() - started)
            if remaining is not None and remaining <= 0:
                raise WarehouseBusy(
                    f"warehouse {db_path} is still being written by {who} after {timeout_s:g} s"
                ) from None
            step = announce_every_s if remaining is None else min(announce_every_s, remaining)
            try:
                lock.acquire(timeout=step)
                break
            except Timeout:
                say(f"still waiting for the warehouse writer lock ({time.monotonic() - started:.0f} s)")
        say(f"got the warehouse writer lock after {time.monotonic() - started:.1f} s")
    outermost = lock.lock_counter == 1
    try:
        if outermost:
            _write_holder(db_path)
        yield
    finally:
        try:
            if outermost:
                holder_path(db_path).unlink(missing_ok=True)
        finally:
            lock.release()
