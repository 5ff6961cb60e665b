"""Where one ingest's seconds go: `ingest_raw` with a timer around each of its steps, per thread.

The ingest runs in two threads (warehouse.ingest._prefetch): a reading thread reads, hashes, parses and
validates the next batch while the main thread writes the current one (Parquet files, DuckDB, commit). So a
step's seconds are given per thread; the main thread's wall time is the ingest's, and its line "waiting
for the reading thread" is the reading thread's work that writing did not hide. Each step's time is its own
(exclusive of the steps timed inside it); CPU seconds are the calling thread's (time.thread_time), so the
work of polars' and DuckDB's own worker threads shows only in the process's total. `--serial` reads and
writes in turns in one thread instead: slower, but each step's CPU is then the whole process's.

    .venv/bin/python benchmarks/ingest_profile.py RAW_CAMPAIGN_DIR [--serial] [--runs N] [--workdir DIR]

benchmarks/warehouse_bench.py --profile runs it (both ways) on its synthetic 1x campaign. Figures and what
they say: docs/performance.md, "Warehouse".
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from rich.console import Console
from rich.table import Table

import warehouse.db as db_module
import warehouse.ingest as ingest_module
from warehouse import parts

# (module, function name, the step it is): every call of these is timed.
STEPS: tuple[tuple[Any, str, str], ...] = (
    (db_module, "connect", "open DuckDB"),
    (db_module, "migrate", "migrate (check schema, views)"),
    (parts, "set_root", "parts root, sweep"),
    (parts, "sweep", "parts root, sweep"),
    (db_module, "_checkpoint", "DuckDB checkpoint"),
    (db_module, "_refresh_snapshot_locked", "reader snapshot copy"),
    (ingest_module, "_read", "read artifact files"),
    (ingest_module, "artifact_sha256", "sha256 of files"),
    (ingest_module, "_frames", "parse JSON documents into rows"),
    (ingest_module, "read_parquet_parts", "read request/gauge Parquet"),
    (ingest_module, "_rows_together", "rows into frames"),
    (ingest_module, "to_frame", "rows into frames"),
    (ingest_module, "_checked", "validate (pandera)"),
    (ingest_module, "_validated", "batch: rechunk, Arrow, other"),
    (ingest_module, "_prepared", "discover, decide, batch"),
    (ingest_module, "_write_parts", "write Parquet files"),
    (ingest_module, "_insert", "DuckDB INSERT"),
    (parts, "record", "manifest, recreate views"),
    (parts, "ensure_root", "manifest, recreate views"),
    (ingest_module, "_write", "transaction: begin, log, commit"),
)
if hasattr(ingest_module, "sketches"):  # the latency sketches of each batch's cells (warehouse/sketches.py)
    STEPS += (
        (ingest_module.sketches, "sketch_rows", "latency sketches: count rows"),
        (ingest_module.sketches, "insert", "latency sketches: INSERT"),
        (ingest_module.sketches, "roll_up", "latency sketches: roll up groups"),
    )


class _Clocks(NamedTuple):
    """Wall seconds, this thread's CPU seconds and the process's CPU seconds."""

    wall: float
    cpu: float
    process_cpu: float

    @classmethod
    def now(cls) -> _Clocks:
        return cls(time.perf_counter(), time.thread_time(), time.process_time())

    def minus(self, other: _Clocks) -> _Clocks:
        return _Clocks(*(a - b for a, b in zip(self, other, strict=True)))

    def plus(self, other: _Clocks) -> _Clocks:
        return _Clocks(*(a + b for a, b in zip(self, other, strict=True)))


_NO_TIME = _Clocks(0.0, 0.0, 0.0)


@dataclass
class _Frame:
    """One step in progress: when it began, and what the steps it called took (not its own time)."""

    label: str
    start: _Clocks
    children: _Clocks = _NO_TIME


@dataclass
class StepTimes:
    """Exclusive wall and CPU seconds per (thread, step), and calls."""

    wall: dict[tuple[str, str], float] = field(default_factory=lambda: defaultdict(float))
    cpu: dict[tuple[str, str], float] = field(default_factory=lambda: defaultdict(float))
    process_cpu: dict[tuple[str, str], float] = field(default_factory=lambda: defaultdict(float))
    calls: dict[tuple[str, str], int] = field(default_factory=lambda: defaultdict(int))
    _stacks: threading.local = field(default_factory=threading.local)

    @contextmanager
    def step(self, label: str) -> Iterator[None]:
        stack: list[_Frame] = self._stacks.__dict__.setdefault("stack", [])
        frame = _Frame(label, _Clocks.now())
        stack.append(frame)
        try:
            yield
        finally:
            stack.pop()
            spent = _Clocks.now().minus(frame.start)
            own = spent.minus(frame.children)
            key = (_thread_name(), label)
            self.wall[key] += own.wall
            self.cpu[key] += own.cpu
            self.process_cpu[key] += own.process_cpu
            self.calls[key] += 1
            if stack:
                stack[-1].children = stack[-1].children.plus(spent)


def _thread_name() -> str:
    name = threading.current_thread().name
    return "reading" if name.startswith("warehouse-ingest-prefetch") else "main"


def _timed(times: StepTimes, label: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with times.step(label):
            result = fn(*args, **kwargs)
            if hasattr(result, "__next__"):  # a generator (_prepared): time each step of it where it runs
                return _timed_iter(times, label, result)
            return result

    return wrapper


def _timed_iter(times: StepTimes, label: str, it: Iterator[Any]) -> Iterator[Any]:
    while True:
        with times.step(label):
            try:
                item = next(it)
            except StopIteration:
                return
        yield item


def _serial(batches: Iterator[Any]) -> Iterator[Any]:
    return batches


@contextmanager
def instrumented(serial: bool = False) -> Iterator[StepTimes]:
    """Every function of STEPS wrapped with a timer while inside; the originals put back after. `serial`:
    batches are read and validated in the main thread, not beside the writing, so that each step's share of
    the process's CPU (polars' and DuckDB's worker threads included) is its own."""
    times = StepTimes()
    originals = [(module, name, getattr(module, name)) for module, name, _ in STEPS]
    originals.append((ingest_module, "_prefetch", ingest_module._prefetch))
    try:
        for module, name, label in STEPS:
            setattr(module, name, _timed(times, label, getattr(module, name)))
        if serial:
            ingest_module._prefetch = _serial
        yield times
    finally:
        for module, name, fn in originals:
            setattr(module, name, fn)


@dataclass
class IngestProfile:
    wall_s: float
    cpu_s: float  # the whole process's, all threads
    request_rows: int
    steps: StepTimes
    serial: bool


def profile_ingest(campaign_dir: Path, db_path: Path, *, serial: bool = False) -> IngestProfile:
    """Ingest `campaign_dir` into `db_path` (as `specgauge ingest` does), timing each step."""
    with instrumented(serial) as times:
        cpu0, started = time.process_time(), time.perf_counter()
        with times.step("ingest (untimed rest)"):
            report = ingest_module.ingest_raw(campaign_dir, db_path)
        wall, cpu = time.perf_counter() - started, time.process_time() - cpu0
    assert report.ok, report.as_dict()
    return IngestProfile(wall, cpu, report.rows_by_table["requests"], times, serial)


def profile_table(profile: IngestProfile, title: str) -> Table:
    """One line per step: its wall seconds in each thread, its CPU seconds (serial: the whole process's,
    else the calling thread's) and its share of the ingest's wall time."""
    steps = profile.steps
    labels = [*dict.fromkeys(label for *_, label in STEPS), "ingest (untimed rest)"]
    cpu_of = steps.process_cpu if profile.serial else steps.cpu
    cpu_head = "process CPU s" if profile.serial else "thread CPU s"
    table = Table(title=title, title_justify="left")
    for column in ("step", "main s", "reading s", cpu_head, "share of wall", "calls"):
        table.add_column(column, justify="left" if column == "step" else "right")
    for label in labels:
        wall = {t: steps.wall.get((t, label), 0.0) for t in ("main", "reading")}
        if not any(wall.values()):
            continue
        name = label
        if label == "ingest (untimed rest)":
            name = "other (main: waiting for the reading thread)" if not profile.serial else "other"
        table.add_row(
            name,
            f"{wall['main']:.3f}",
            f"{wall['reading']:.3f}" if not profile.serial else "",
            f"{cpu_of.get(('main', label), 0.0) + cpu_of.get(('reading', label), 0.0):.3f}",
            f"{wall['main'] / profile.wall_s:.0%}" if wall["main"] else "",
            str(steps.calls.get(("main", label), 0) + steps.calls.get(("reading", label), 0)),
        )
    reading_total = sum(v for (thread, _), v in steps.wall.items() if thread == "reading")
    table.add_row(
        "total",
        f"{profile.wall_s:.3f}",
        f"{reading_total:.3f}" if not profile.serial else "",
        f"{profile.cpu_s:.2f} (process)",
        f"{profile.request_rows / profile.wall_s:,.0f} rows/s",
        "",
    )
    return table


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("campaign_dir", type=Path)
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--runs", type=int, default=1, help="ingests into fresh warehouses, one table each")
    parser.add_argument("--serial", action="store_true", help="read and write in turns: CPU per step")
    args = parser.parse_args()
    console = Console(width=150)
    for run in range(args.runs):
        work = Path(tempfile.mkdtemp(prefix="ingest-profile-", dir=args.workdir))
        try:
            load = os.getloadavg()[0]
            profile = profile_ingest(args.campaign_dir, work / "w.duckdb", serial=args.serial)
            mode = "serial" if args.serial else "as run"
            title = f"ingest profile ({mode}), run {run + 1}: load average {load:.2f} before, {os.getloadavg()[0]:.2f} after"
            console.print(profile_table(profile, title))
        finally:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
