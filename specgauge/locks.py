"""One writer of one thing at a time: a file lock with a note saying who holds it.

A lock is a file (`<thing>.lock`) held with flock through the filelock package: the kernel releases it when
its holder dies, even by SIGKILL, so the lock of a dead process is simply taken over by the next writer,
never left stale. The holder writes a note beside it (pid, host, command, since) so that a waiting or
refused writer can name whom it waits for. Used for the warehouse (warehouse.lock), each campaign's raw
folder (tasks.campaign_state.campaign_writer) and each import target (flows.import_reference).

`one_writer(..., timeout_s=0)` refuses at once; `timeout_s=None` waits for as long as it takes, saying so
every `announce_every_s`; either way a writer that gives up raises `busy` (default `WriterBusy`) naming the
holder.
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

from specgauge.errors import SpecgaugeError
from specgauge.provenance import utc_now
from specgauge.redact import redact_args

log = logging.getLogger("specgauge.locks")

WaitCallback = Callable[[str], None]


class WriterBusy(SpecgaugeError):
    """Another live process writes the same thing, and this writer would not (or no longer) wait."""


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


def read_holder(note: Path) -> Holder | None:
    try:
        return Holder(**json.loads(Path(note).read_text()))
    except (OSError, ValueError, TypeError):
        return None


def _command() -> str:
    # The note is a file others read and errors quote: a secret on the command line stays out of it.
    args, _ = redact_args(sys.argv[1:])
    return " ".join(Path(sys.argv[0]).name.split() + list(args))[:200] or "python"


def write_holder(note: Path) -> None:
    """This process's note, written atomically (a reader never sees half of it)."""
    note = Path(note)
    holder = Holder(pid=os.getpid(), host=socket.gethostname(), command=_command(), since_utc=utc_now())
    tmp = note.with_name(f"{note.name}.tmp{os.getpid()}")
    tmp.write_text(json.dumps(asdict(holder)) + "\n")
    tmp.replace(note)


def _file_lock(lock_file: Path) -> FileLock:
    # One lock object per path in a process (is_singleton), so a nested writer of the same thing re-enters
    # instead of deadlocking on its own flock.
    return FileLock(str(lock_file), thread_local=False, is_singleton=True)


def held_by_other(lock_file: Path) -> bool:
    """Whether a live process other than this one holds the lock right now (a dead holder never counts)."""
    lock = _file_lock(Path(lock_file))
    if lock.is_locked:  # this process holds it
        return False
    try:
        lock.acquire(timeout=0)
    except Timeout:
        return True
    lock.release()
    return False


def _default_on_wait(message: str) -> None:
    log.warning(message)


@contextmanager
def one_writer(
    lock_file: Path,
    note_file: Path,
    *,
    what: str,
    timeout_s: float | None = None,
    on_wait: WaitCallback | None = None,
    announce_every_s: float = 30.0,
    busy: type[SpecgaugeError] = WriterBusy,
    lock_name: str | None = None,
) -> Iterator[None]:
    """Hold the lock `lock_file` while writing `what` (e.g. "campaign X"), with this process's note in
    `note_file`. Held by another process: with `timeout_s=0` raise `busy` at once naming the holder;
    otherwise say so through `on_wait` (default: a warning), repeat every `announce_every_s`, and wait, up
    to `timeout_s` (None: forever), then raise `busy`. `lock_name` names the lock in the waiting messages
    (default: "the writer lock of <what>")."""
    lock_file, note_file = Path(lock_file), Path(note_file)
    lock_file.parent.mkdir(parents=True, exist_ok=True)
    lock = _file_lock(lock_file)
    say = on_wait or _default_on_wait
    name = lock_name or f"the writer lock of {what}"
    try:
        lock.acquire(timeout=0)
    except Timeout:
        started = time.monotonic()
        holder = read_holder(note_file)
        who = holder.describe() if holder else "another process (it left no note)"
        if timeout_s is not None and timeout_s <= 0:
            raise busy(f"{what} is being written by {who}; try again when it has finished") from None
        limit = "" if timeout_s is None else f" for up to {timeout_s:g} s"
        say(f"{what} is being written by {who}; waiting{limit} for it to finish")
        while True:
            remaining = None if timeout_s is None else timeout_s - (time.monotonic() - started)
            if remaining is not None and remaining <= 0:
                raise busy(f"{what} is still being written by {who} after {timeout_s:g} s") from None
            step = announce_every_s if remaining is None else min(announce_every_s, remaining)
            try:
                lock.acquire(timeout=step)
                break
            except Timeout:
                say(f"still waiting for {name} ({time.monotonic() - started:.0f} s)")
        say(f"got {name} after {time.monotonic() - started:.1f} s")
    outermost = lock.lock_counter == 1
    try:
        if outermost:
            write_holder(note_file)
        yield
    finally:
        try:
            if outermost:
                note_file.unlink(missing_ok=True)
        finally:
            lock.release()
