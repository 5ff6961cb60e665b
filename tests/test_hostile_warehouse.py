"""Issue 34, finding 4 (the warehouse destroyed through its own commands), the warehouse's part of finding 8
(litter after a kill) and of finding 6 (tracebacks from `sql -o` and from a full disk during ingest).

Real parts: the CLI as a subprocess (`python -m cli`, SPECGAUGE_HOME a tmp dir), real DuckDB files built by
`specgauge ingest` from raw artifacts written with the project's own writers (tests/warehouse_fixtures.py),
a real full disk (a small tmpfs when root; RLIMIT_FSIZE in the CLI's process otherwise) and real SIGKILLs.
What each test saw is recorded for docs/reliability.md (`observe`).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import duckdb
import pytest
from reliability_support import REPO
from warehouse_fixtures import RawBuilder, make_spec

pytest_plugins = ["reliability_support"]

TRACEBACK = "Traceback (most recent call last)"
ATTACKED = "the warehouse attacked through its own commands"
TRACEBACKS = "inputs that raised a traceback"
LITTER = "litter after a kill; a hostile report-server client"
CELLS_BY_CAMPAIGN = "SELECT campaign_id, count(*) AS n FROM cells GROUP BY ALL ORDER BY ALL"

# The CLI in a process whose files may not grow past a limit (argv[1], bytes): a write past it fails with
# EFBIG ("File too large"), as on a full disk, instead of killing the process with SIGXFSZ.
LIMITED_CLI = """
import resource, runpy, signal, sys
limit = int(sys.argv[1])
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
sys.argv = ["specgauge", *sys.argv[2:]]
runpy.run_module("cli", run_name="__main__")
"""

# A rebuild killed half-way: replacing() has made its new database beside the live one (with its WAL).
KILLED_REBUILD = """
import sys, time
from pathlib import Path
from warehouse.db import replacing
with replacing(Path(sys.argv[1])) as con:
    con.execute("CREATE TABLE scratch AS SELECT range AS i FROM range(1000)")
    Path(sys.argv[2]).write_text("building")
    time.sleep(120)
"""

# A snapshot copy killed half-way: the reader has made its temporary copy and not yet renamed it. (The copy
# is held open, empty, at the moment of the kill: shutil.copyfile is made to stop there.)
KILLED_SNAPSHOT_COPY = """
import shutil, sys, time
from pathlib import Path
from warehouse import db
from warehouse.lock import writer_lock
def stalled_copy(src, dst):
    open(dst, "wb").close()
    Path(sys.argv[2]).write_text(str(dst))
    time.sleep(120)
shutil.copyfile = stalled_copy
with writer_lock(Path(sys.argv[1])):
    db._copy_snapshot(Path(sys.argv[1]))
"""


# ------------------------------------------------------------------------------------------------ helpers


def run_cli(home: Path, *args: str, limit_bytes: int | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SPECGAUGE_HOME": str(home)}
    for name in ("SPECGAUGE_DEBUG", "SPECGAUGE_WAREHOUSE", "SPECGAUGE_WAREHOUSE_PARTS"):
        env.pop(name, None)
    command = [sys.executable, "-m", "cli", *args]
    if limit_bytes is not None:
        command = [sys.executable, "-c", LIMITED_CLI, str(limit_bytes), *args]
    return subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)


def one_error_line(done: subprocess.CompletedProcess[str]) -> str:
    """The run's error line: exit 2, nothing else on stderr, no traceback anywhere."""
    assert TRACEBACK not in done.stdout + done.stderr, done.stderr[-3000:]
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), (
        done.returncode,
        done.stderr[-3000:],
    )
    return lines[0]


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def query(home: Path, sql: str, *, db: Path | None = None) -> list[list[str]]:
    """Rows of `specgauge sql -f csv` (exit 0 asserted), header first."""
    done = run_cli(home, "sql", sql, "-f", "csv", *(["--db", str(db)] if db else []))
    assert done.returncode == 0 and TRACEBACK not in done.stderr, done.stderr[-3000:]
    return [line.split(",") for line in done.stdout.strip().splitlines()]


def listing(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def wait_for(path: Path, proc: subprocess.Popen[str], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if proc.poll() is not None:
            out, err = proc.communicate()
            raise AssertionError(f"helper exited early ({proc.returncode}): {out}\n{err}")
        assert time.monotonic() < deadline, f"{path} did not appear"
        time.sleep(0.05)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A home whose warehouse holds one campaign (ingested by the CLI), and a raw tree with a second one."""
    root = tmp_path_factory.mktemp("hostile-warehouse")
    home = root / "home"
    RawBuilder(home / "raw", spec=make_spec()).write_all()
    done = run_cli(home, "ingest")
    assert done.returncode == 0, done.stderr[-3000:]
    both = root / "raw-both"
    shutil.copytree(home / "raw", both)
    RawBuilder(both, spec=make_spec(name="second", repeats=2)).write_all()
    return home, both


@pytest.fixture
def home(built: tuple[Path, Path], tmp_path: Path) -> Path:
    """This test's own copy of the built home (SPECGAUGE_HOME)."""
    copy = tmp_path / "home"
    shutil.copytree(built[0], copy, symlinks=True)
    return copy


# ------------------------------------------------------------------------------------------ sql --output


def test_sql_output_never_lands_on_the_warehouse(home: Path, tmp_path: Path, observe) -> None:
    db = home / "warehouse.duckdb"
    before = query(home, CELLS_BY_CAMPAIGN)
    part = next((home / "warehouse.duckdb.parts").rglob("*.parquet"))
    cell_file = next((home / "raw").rglob("summary.json"))
    link = tmp_path / "innocent.csv"
    link.symlink_to(db)
    targets = {
        "the database (csv)": (db, "csv"),
        "its WAL name": (home / "warehouse.duckdb.wal", "csv"),
        "its lock": (home / "warehouse.duckdb.lock", "csv"),
        "its snapshot": (home / "warehouse.duckdb.snapshot", "json"),
        "the snapshot's source note": (home / "warehouse.duckdb.snapshot.source", "csv"),
        "a committed Parquet part (json)": (part, "json"),
        "a committed Parquet part (parquet)": (part, "parquet"),
        "a raw artifact": (cell_file, "json"),
        "a symlink to the database": (link, "csv"),
    }
    guarded = [
        db,
        part,
        cell_file,
        *(home / n for n in ("warehouse.duckdb.snapshot", "warehouse.duckdb.lock")),
    ]
    hashes = {p: sha(p) for p in guarded}
    names = listing(home)
    refused: dict[str, str] = {}
    for what, (target, fmt) in targets.items():
        done = run_cli(home, "sql", "SELECT 1 AS a", "-f", fmt, "-o", str(target))
        refused[what] = one_error_line(done)
        assert "--output" in refused[what], refused[what]
    changed = [str(p) for p, h in hashes.items() if not p.exists() or sha(p) != h]
    assert changed == [] and listing(home) == names
    assert link.is_symlink()

    # the warehouse still works through every command, with the same answers
    ingest = run_cli(home, "ingest")
    rebuild = run_cli(home, "warehouse", "rebuild")
    assert ingest.returncode == 0 and rebuild.returncode == 0, ingest.stderr[-2000:] + rebuild.stderr[-2000:]
    after = query(home, CELLS_BY_CAMPAIGN)
    assert after == before

    # and an ordinary output still works, written whole
    out = tmp_path / "cells.csv"
    done = run_cli(home, "sql", CELLS_BY_CAMPAIGN, "-f", "csv", "-o", str(out))
    assert done.returncode == 0 and out.read_text().splitlines()[0] == "campaign_id,n"
    observe(
        ATTACKED,
        done="`specgauge sql ... -o` aimed at the warehouse file, its WAL, lock, snapshot and source note, a "
        "committed Parquet part (json and parquet), a raw artifact, and a symlink to the database",
        expected="each refused with one error line and exit 2; no file of the warehouse changes; ingest, "
        "rebuild and sql keep working with the same answers",
        observed=f"{len(refused)} of {len(targets)} refused with exit 2 (e.g. `{refused['the database (csv)']}`); "
        f"files changed: {changed or 'none'}; then ingest exit {ingest.returncode}, rebuild exit "
        f"{rebuild.returncode}, cells per campaign {after[1:]} as before",
        records_lost=0,
        leaked=0,
    )


def test_db_option_creates_nothing_beside_a_foreign_file(home: Path, tmp_path: Path, observe) -> None:
    foreign = tmp_path / "etc"
    foreign.mkdir()
    passwd = foreign / "passwd"
    passwd.write_text("root:x:0:0:root:/root:/bin/bash\n")
    other = foreign / "theirs.duckdb"
    con = duckdb.connect(str(other))
    con.execute("CREATE TABLE t AS SELECT 42 AS answer")
    con.close()
    names = listing(foreign)
    hashes = {p: sha(p) for p in (passwd, other)}

    sql_text = one_error_line(run_cli(home, "sql", "SELECT 1", "--db", str(passwd)))
    recommend_text = one_error_line(run_cli(home, "recommend", "--db", str(passwd)))
    ingest_text = one_error_line(run_cli(home, "ingest", "--db", str(passwd)))
    rebuild_text = one_error_line(run_cli(home, "warehouse", "rebuild", "--db", str(passwd)))
    assert all(str(passwd) in t and "not a DuckDB" in t for t in (sql_text, recommend_text, ingest_text))
    assert str(passwd) in rebuild_text
    # a DuckDB file specgauge did not make: read in place, read-only; never written
    rows = query(home, "SELECT answer FROM t", db=other)
    write_text = one_error_line(run_cli(home, "ingest", "--db", str(other)))
    assert rows == [["answer"], ["42"]] and "did not make" in write_text
    left = listing(foreign)
    changed = [str(p) for p, h in hashes.items() if sha(p) != h]
    assert left == names and changed == []
    observe(
        ATTACKED,
        done="`sql`, `recommend`, `ingest` and `warehouse rebuild` with --db naming a text file (a copy of "
        "/etc/passwd), and `sql` and `ingest` with --db naming a DuckDB file specgauge did not make",
        expected="one error line each for the text file; the foreign DuckDB file read read-only in place and "
        "never written; nothing created beside either (.lock, .snapshot, .snapshot.source)",
        observed=f"`{sql_text}`; recommend, ingest, rebuild refused likewise; foreign DuckDB answered "
        f"{rows[1:]} and ingest into it was refused (`{write_text[:120]}...`); files beside them before "
        f"{names}, after {left}; changed: {changed or 'none'}",
        records_lost=0,
        leaked=0,
    )


# --------------------------------------------------------------------------------- damaged, then repaired


def _overwrite_with_text(db: Path) -> None:
    db.write_text("a\n1\n")  # what `sql ... -o warehouse.duckdb` used to leave


def _corrupt_blocks(db: Path) -> None:
    with open(db, "r+b") as fh:  # DuckDB's header survives; the blocks after it do not
        fh.seek(12_288)
        fh.write(b"\xff" * 200_000)


@pytest.mark.parametrize("damage", [_overwrite_with_text, _corrupt_blocks], ids=["text", "corrupt-blocks"])
def test_rebuild_repairs_a_damaged_warehouse(home: Path, damage, observe) -> None:
    db = home / "warehouse.duckdb"
    before = query(home, CELLS_BY_CAMPAIGN)
    damage(db)
    damaged_bytes = sha(db)

    ingest = one_error_line(run_cli(home, "ingest"))
    sql = one_error_line(run_cli(home, "sql", CELLS_BY_CAMPAIGN))
    for text in (ingest, sql):
        assert "damaged" in text and "specgauge warehouse rebuild" in text, text
    rebuild = run_cli(home, "warehouse", "rebuild")
    assert rebuild.returncode == 0 and TRACEBACK not in rebuild.stderr, rebuild.stderr[-3000:]
    kept = sorted(home.glob("warehouse.duckdb.damaged-*"))
    assert len(kept) == 1 and sha(kept[0]) == damaged_bytes  # the damaged file, kept for the user
    assert f"kept as {kept[0]}" in rebuild.stderr
    after = query(home, CELLS_BY_CAMPAIGN)
    again = run_cli(home, "ingest")
    assert after == before and again.returncode == 0, again.stderr[-2000:]
    observe(
        ATTACKED,
        done=f"the warehouse file {'overwritten with CSV text' if damage is _overwrite_with_text else 'with corrupt blocks after its header'}; "
        "then ingest, sql, `warehouse rebuild`, ingest",
        expected="ingest and sql: one error line saying the warehouse is damaged and that `specgauge warehouse "
        "rebuild` repairs it; rebuild sets the damaged file aside (kept) and rebuilds from the raw artifacts",
        observed=f"ingest: `{ingest[:160]}...`; rebuild exit {rebuild.returncode}, damaged file kept as "
        f"{kept[0].name}; cells per campaign {after[1:]} as before; the next ingest exit {again.returncode}",
        records_lost=0,
        leaked=0,
    )


# ------------------------------------------------------------------------------ tracebacks from sql -o


def test_sql_output_failures_are_one_line_and_leave_no_half_file(home: Path, tmp_path: Path, observe) -> None:
    seen: dict[str, str] = {}
    seen["/dev/full"] = one_error_line(run_cli(home, "sql", "SELECT 1 AS a", "-f", "csv", "-o", "/dev/full"))
    for fmt in ("csv", "parquet"):
        missing = tmp_path / "missing" / "folder" / f"out.{fmt}"
        seen[f"missing folder ({fmt})"] = one_error_line(
            run_cli(home, "sql", "SELECT 1 AS a", "-f", fmt, "-o", str(missing))
        )
        assert "does not exist" in seen[f"missing folder ({fmt})"]
    assert "No space left on device" in seen["/dev/full"]
    assert not (tmp_path / "missing").exists()

    # A write that fails half-way (the file size limit) leaves the previous output whole, and no temporary.
    out = tmp_path / "out.csv"
    out.write_text("previous,output\n")
    big = "SELECT range AS i, repeat('x', 100) AS pad FROM range(20000)"
    limited = run_cli(home, "sql", big, "-f", "csv", "-o", str(out), limit_bytes=64 * 1024)
    seen["file size limit"] = one_error_line(limited)
    assert "File too large" in seen["file size limit"]
    assert out.read_text() == "previous,output\n" and listing(tmp_path) == ["home", "out.csv"]
    observe(
        TRACEBACKS,
        done="`specgauge sql -o /dev/full`, `-o` into a missing folder (csv and parquet), and a csv output "
        "that outgrows the file size limit (RLIMIT_FSIZE 64 KiB) over an existing file",
        expected="one error line and exit 2 each; no half file, the previous output kept whole",
        observed="; ".join(f"{k}: `{v}`" for k, v in seen.items())
        + f"; the previous output kept: {out.read_text() == 'previous,output' + chr(10)}; files left "
        f"beside it: {listing(tmp_path)}",
        records_lost=0,
        leaked=0,
    )


# ---------------------------------------------------------------------------- a full disk during ingest


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Path]:
    mount = tmp_path / "small-disk"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=40m", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=True)


@pytest.mark.parametrize("limit", ["tmpfs", "rlimit_fsize"])
def test_disk_full_during_ingest_rolls_back(built, tmp_path: Path, limit: str, request, observe) -> None:
    if limit == "tmpfs" and os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root; the rlimit_fsize case covers this without it")
    base = request.getfixturevalue("tmpfs") if limit == "tmpfs" else tmp_path
    home = base / "home"
    shutil.copytree(built[0], home, symlinks=True)
    raw_both = built[1]
    db = home / "warehouse.duckdb"
    before = query(home, CELLS_BY_CAMPAIGN)
    limit_bytes = None
    if (
        limit == "tmpfs"
    ):  # leave 1 MiB free: the second campaign's rows fit, its checkpoint and snapshot do not
        free = shutil.disk_usage(base).free
        (base / "filler").write_bytes(b"\0" * (free - (1 << 20)))
    else:  # the database may not grow past 100 kB over its size: the checkpoint fails, as on a full disk
        limit_bytes = db.stat().st_size + 100_000

    done = run_cli(home, "ingest", str(raw_both), limit_bytes=limit_bytes)
    message = one_error_line(done)
    assert "disk is full" in message and "rolled back" in message, message
    during = query(home, CELLS_BY_CAMPAIGN)  # readable, as before, while the disk is still full
    assert during == before
    left = [n for n in listing(home) if ".tmp" in n or n.endswith(".wal")]
    assert left == []

    if limit == "tmpfs":
        (base / "filler").unlink()
    again = run_cli(home, "ingest", str(raw_both))
    assert again.returncode == 0, again.stderr[-3000:]
    after = query(home, CELLS_BY_CAMPAIGN)
    assert len(after) == len(before) + 1
    observe(
        TRACEBACKS,
        done="`specgauge ingest` of a second campaign onto "
        + (
            "a 40 MiB tmpfs with 1 MiB free"
            if limit == "tmpfs"
            else "a warehouse under RLIMIT_FSIZE (+100 kB)"
        ),
        expected="one error line and a nonzero exit; the write rolled back, the warehouse as before it and "
        "readable by sql; the same ingest succeeds once there is room",
        observed=f"exit {done.returncode}: `{message[:200]}...`; sql then exit 0 with {during[1:]} (as "
        f"before); temporaries or WAL left: {left or 'none'}; after freeing space ingest exit "
        f"{again.returncode}, campaigns {[r[0] for r in after[1:]]}",
        records_lost=0,
        leaked=0,
    )


# ------------------------------------------------------------------------------------ litter after a kill


def test_litter_of_killed_writers_is_removed_by_the_next_writer(home: Path, tmp_path: Path, observe) -> None:
    db = home / "warehouse.duckdb"
    env = {**os.environ, "SPECGAUGE_HOME": str(home)}

    def kill_midway(script: str, name: str) -> tuple[int, list[str]]:
        marker = tmp_path / f"marker-{name}"
        proc = subprocess.Popen(
            [sys.executable, "-c", script, str(db), str(marker)],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        wait_for(marker, proc)
        os.kill(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=30)
        return proc.pid, sorted(
            n for n in listing(home) if "tmp" in n or "rebuild" in n or n.endswith(".wal")
        )

    rebuild_pid, after_rebuild = kill_midway(KILLED_REBUILD, "rebuild")
    assert f".warehouse.duckdb.rebuild{rebuild_pid}" in after_rebuild
    # the next process to make a snapshot removes the dead rebuild's files, then is killed mid-copy itself
    copy_pid, after_copy = kill_midway(KILLED_SNAPSHOT_COPY, "copy")
    assert after_copy == [f".warehouse.duckdb.snapshot.tmp{copy_pid}"], after_copy
    assert (home / after_copy[0]).stat().st_size == 0
    # a live process's temporary is never touched
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        live_tmp = home / f".warehouse.duckdb.snapshot.tmp{alive.pid}"
        live_tmp.write_bytes(b"")
        done = run_cli(home, "ingest")
        assert done.returncode == 0, done.stderr[-3000:]
        remaining = sorted(n for n in listing(home) if "tmp" in n or "rebuild" in n or n.endswith(".wal"))
        assert remaining == [live_tmp.name]
    finally:
        alive.kill()
        alive.wait()
    assert query(home, CELLS_BY_CAMPAIGN)[1:]
    observe(
        LITTER,
        done="SIGKILL of a `warehouse rebuild` while it built its new database, then of a reader while it "
        "copied the snapshot; a temporary named for a live process planted beside them; then `specgauge ingest`",
        expected="the next process making a snapshot, and the next writer, remove the dead processes' "
        "temporaries (rebuild database and WAL, empty snapshot copy) and leave the live process's",
        observed=f"left by the killed rebuild: {after_rebuild}; after the killed snapshot copy (which cleaned "
        f"the rebuild's first): {after_copy}; after the next ingest: {remaining} (the live process's only)",
        records_lost=0,
        leaked=len(remaining) - 1,
    )
