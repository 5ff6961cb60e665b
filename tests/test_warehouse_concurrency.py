"""One writer at a time, readers that never block it, and a SIGKILLed ingest that leaves no partial cell.

Real processes: DuckDB's file lock is per process, so these run writers in subprocesses."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from warehouse_fixtures import RawBuilder, make_spec

from flows.ingest import only_lock_contention, run_ingest
from warehouse.db import reader
from warehouse.errors import WarehouseBusy
from warehouse.ingest import ingest_raw
from warehouse.parts import parts_dir

REPO = Path(__file__).resolve().parent.parent
SPECGAUGE = [sys.executable, "-m", "cli"]

HOLD_WRITER = """
import sys, time
from pathlib import Path
from warehouse.db import writer
with writer(Path(sys.argv[1])):
    Path(sys.argv[2]).write_text("held")
    release, deadline = Path(sys.argv[2] + ".release"), time.monotonic() + float(sys.argv[3])
    while not release.exists() and time.monotonic() < deadline:  # held for SECONDS, or until released
        time.sleep(0.05)
"""

KILLABLE_INGEST = """
import sys, time
from pathlib import Path
from warehouse.ingest import ingest_raw
seen = []
def hook(kind, keys):
    if kind == "cell":
        seen.extend(keys)
        if len(seen) == 3:  # inside the third cell's transaction, its rows already inserted
            # written aside, then renamed: the test reads it the moment it appears (and then kills us)
            Path(sys.argv[3] + ".tmp").write_text("\\n".join(seen))
            Path(sys.argv[3] + ".tmp").rename(sys.argv[3])
            time.sleep(120)
ingest_raw(Path(sys.argv[1]), Path(sys.argv[2]), before_commit=hook, per_artifact=True)
"""


@pytest.fixture
def raw(tmp_path: Path) -> RawBuilder:
    builder = RawBuilder(tmp_path / "raw", spec=make_spec(repeats=2))
    builder.write_all(captures=False)
    return builder


def wait_for(path: Path, proc: subprocess.Popen, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if proc.poll() is not None:
            out, err = proc.communicate()
            raise AssertionError(f"helper exited early ({proc.returncode}): {out}\n{err}")
        if time.monotonic() > deadline:
            raise AssertionError(f"{path} did not appear")
        time.sleep(0.05)


def count(db: Path, sql: str) -> int:
    with reader(db) as con:
        return con.execute(sql).fetchone()[0]


def hold_writer(db: Path, marker: Path, seconds: float) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD_WRITER, str(db), str(marker), str(seconds)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    wait_for(marker, proc)
    return proc


def test_second_writer_waits_says_who_holds_the_lock_then_both_succeed(
    raw: RawBuilder, tmp_path: Path
) -> None:
    db = tmp_path / "w.duckdb"
    first = hold_writer(db, tmp_path / "held", seconds=120)
    second = subprocess.Popen(
        [*SPECGAUGE, "ingest", str(raw.raw_dir), "--db", str(db)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    # The lock is released once the second writer says it waits: a fixed hold was over before a CLI that
    # started slowly (busy cores) asked for the lock.
    said: list[str] = []
    for line in second.stderr:  # type: ignore[union-attr]
        said.append(line)
        if "waiting" in line:
            break
    (tmp_path / "held.release").write_text("go")
    _, rest = second.communicate(timeout=300)
    _, first_err = first.communicate(timeout=60)

    assert first.returncode == 0, first_err
    err = " ".join(("".join(said) + rest).split())
    assert second.returncode == 0, err
    assert f"is being written by pid {first.pid}" in err
    assert "waiting" in err and "got the warehouse writer lock after" in err
    assert count(db, "SELECT count(*) FROM cells") == 12


def test_a_writer_that_waits_too_long_gives_up_with_a_retryable_error(
    raw: RawBuilder, tmp_path: Path
) -> None:
    db = tmp_path / "w.duckdb"
    holder = hold_writer(db, tmp_path / "held", seconds=300)  # held until released below
    try:
        heard: list[str] = []
        with pytest.raises(WarehouseBusy, match=f"pid {holder.pid}"):
            ingest_raw(raw.raw_dir, db, lock_timeout_s=0.5, on_wait=heard.append)
        assert heard and "waiting for up to 0.5 s" in heard[0]
        # the Prefect task retries exactly this, and nothing else
        busy = asyncio.run(_failed_state(WarehouseBusy("busy")))
        other = asyncio.run(_failed_state(ValueError("bad")))
        assert only_lock_contention(None, None, busy) is True
        assert only_lock_contention(None, None, other) is False
    finally:
        (tmp_path / "held.release").write_text("go")
        holder.communicate(timeout=60)
    assert run_ingest(raw.raw_dir, db).ok  # free again: the task's plain function loads everything


async def _failed_state(exc: BaseException):
    from prefect.states import exception_to_failed_state

    return await exception_to_failed_state(exc)


def test_readers_never_block_writers(raw: RawBuilder, tmp_path: Path) -> None:
    db = tmp_path / "w.duckdb"
    ingest_raw(raw.raw_dir, db)
    slot = raw.slot("plain", 1)
    raw.write_cell(slot, slot.cells[0])  # a new attempt for the next writer to load

    with reader(db) as con:  # a reader holds its connection open the whole time
        assert con.execute("SELECT count(*) FROM cells").fetchone()[0] == 12
        writer = subprocess.run(
            [*SPECGAUGE, "ingest", str(raw.raw_dir), "--db", str(db)],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert writer.returncode == 0, writer.stderr
        assert "waiting" not in writer.stderr
        assert con.execute("SELECT count(*) FROM cells").fetchone()[0] == 12  # its snapshot is stable
    assert count(db, "SELECT count(*) FROM cells") == 13  # a new reader sees the write


def test_sql_answers_while_a_writer_works(raw: RawBuilder, tmp_path: Path) -> None:
    db = tmp_path / "w.duckdb"
    ingest_raw(raw.raw_dir, db)
    holder = hold_writer(db, tmp_path / "held", seconds=300)  # held until released below
    try:
        query = subprocess.run(
            [*SPECGAUGE, "sql", "SELECT count(*) AS n FROM v_cells", "--db", str(db), "--format", "csv"],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
        )
        still_writing = holder.poll() is None
    finally:
        (tmp_path / "held.release").write_text("go")
        holder.communicate(timeout=60)
    assert query.returncode == 0, query.stderr
    assert query.stdout.splitlines() == ["n", "12"]
    assert still_writing, "the query returned while the writer still held the warehouse"
    assert "waiting" not in query.stderr


def test_sigkill_mid_ingest_leaves_no_partial_cell(raw: RawBuilder, tmp_path: Path) -> None:
    db = tmp_path / "w.duckdb"
    marker = tmp_path / "third-cell-inserted"
    proc = subprocess.Popen(
        [sys.executable, "-c", KILLABLE_INGEST, str(raw.raw_dir), str(db), str(marker)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    wait_for(marker, proc, timeout_s=120)
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    first, second, _third = marker.read_text().splitlines()

    with reader(db) as con:  # replays the dead writer's WAL under the writer lock, then reads
        cells = [k for (k,) in con.execute("SELECT cell_key FROM cells ORDER BY cell_key").fetchall()]
        per_cell = dict(con.execute("SELECT cell_key, count(*) FROM requests GROUP BY cell_key").fetchall())
        gauge_keys = {k for (k,) in con.execute("SELECT DISTINCT cell_key FROM gauges").fetchall()}
    assert cells == sorted([first, second])  # committed before the kill; the third never was
    assert per_cell == {k: raw.spec.load.requests + raw.spec.load.warmup for k in cells}
    assert gauge_keys == set(cells)
    # the third cell's Parquet files were written, but no manifest lists them: invisible (swept later)
    with reader(db) as con:
        manifest = {f for (f,) in con.execute("SELECT file FROM warehouse_parts").fetchall()}
    files = {str(p.relative_to(parts_dir(db))) for p in parts_dir(db).rglob("*.parquet")}
    assert len(manifest) == 4 and manifest < files and len(files - manifest) == 2

    report = ingest_raw(raw.raw_dir, db)  # the lock died with its holder: no wait, and the job completes
    assert report.ok
    assert count(db, "SELECT count(*) FROM cells") == 12
    assert count(db, "SELECT count(*) FROM (SELECT cell_key FROM requests GROUP BY cell_key)") == 12
