"""Two writers of one thing at once (issue 34, finding 2), and what a killed writer leaves (finding 8, part).

One writer per campaign and per import target (specgauge.locks through artifacts.store.campaign_writer): two
`specgauge import seed` of one tree into one home started together write each cell once (the second waits,
then adds nothing); a second `specgauge campaign run` of a running campaign is refused at once, exit 2,
naming the first; the lock of a SIGKILLed holder is taken over at once; the half-written `.tmp-*` folders of
a killed writer are removed by the next writer of that campaign, and a live writer's never are.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from reliability_support import REPO, corpus, emulator_spec, write_spec

pytest_plugins = ["reliability_support"]

CLI = [sys.executable, "-m", "cli"]
FIXTURE = REPO / "tests" / "fixtures" / "seed" / "results" / "8b" / "eagle" / "confirm"
BASELINE_CELL = FIXTURE / "apertus15-8b-baseline-confirm-c1-20260926T131028Z" / "cells" / "code" / "c1"
ROW = "two writers of one campaign or one import"


def cli(home: Path, *args: str, **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*CLI, *args],
        cwd=REPO,
        env={**os.environ, "SPECGAUGE_HOME": str(home), "COLUMNS": "400", **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def study(root: Path, cells: int) -> Path:
    """A reference tree of `cells` cells of one deployment, each its own stratum (so its own cell id)."""
    for i in range(cells):
        cell = root / f"w{i:03d}" / "c1"
        shutil.copytree(BASELINE_CELL, cell)
        metadata = json.loads((cell / "metadata.json").read_text())
        metadata["cell"]["workload"] = f"w{i:03d}"
        (cell / "metadata.json").write_text(json.dumps(metadata))
    return root


def attempt_dirs(campaign: Path) -> list[str]:
    cells = campaign / "cells"
    return sorted(p.name for p in cells.iterdir() if p.is_dir()) if cells.exists() else []


# -- imports --------------------------------------------------------------------------------------------------
def test_two_imports_of_one_tree_at_once_write_each_cell_once(tmp_path: Path, observe) -> None:
    from warehouse.db import reader

    home, n = tmp_path / "home", 60
    tree = study(tmp_path / "study", n)
    procs = [cli(home, "import", "seed", str(tree), "--campaign", "t") for _ in range(2)]  # both at once
    outputs = [p.communicate(timeout=240) for p in procs]
    codes = [p.returncode for p in procs]
    campaign = home / "raw" / "seed-t"
    attempts = attempt_dirs(campaign)
    with reader(home / "warehouse.duckdb") as con:
        (rows,) = con.execute("SELECT count(*) FROM cells").fetchone()
    said = [re.search(r"seed-t: (\d+) cell\(s\) written", out) for out, _ in outputs]
    written = [int(m[1]) if m else None for m in said]  # None: the import said nothing of what it wrote

    assert codes == [0, 0], outputs
    assert len(attempts) == n and all(name.endswith(".a1") for name in attempts), attempts[:5]
    assert rows == n
    assert sorted(written) == [0, n]  # one import wrote every cell; the other found them written
    assert not list(campaign.rglob(".tmp-*")) and not (campaign.parent / ".seed-t.writer.json").exists()
    observe(
        ROW,
        done=f"two `specgauge import seed` of one {n}-cell reference tree into one home, started together",
        expected="each cell written once (one attempt per cell), both exit 0, the warehouse holds each "
        "cell once",
        observed=f"exit codes {codes}; cells written by each import {written}; {len(attempts)} attempts on "
        f"disk for {n} cells; {rows} cell rows in the warehouse",
        records_lost=0,
        leaked=0,
    )


# -- the lock itself ------------------------------------------------------------------------------------------
HOLDER = """
import sys, time
from pathlib import Path
from artifacts.store import campaign_writer
with campaign_writer(Path(sys.argv[1])):
    print("held", flush=True)
    time.sleep(600)
"""


def test_a_killed_holders_lock_is_taken_over_and_a_live_one_is_named(tmp_path: Path) -> None:
    from artifacts.store import CampaignBusy, campaign_writer

    campaign = tmp_path / "raw" / "c-1"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(campaign)], cwd=REPO, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        refused = rf"campaign c-1 .* is being written by pid {holder.pid} on "
        with pytest.raises(CampaignBusy, match=refused), campaign_writer(campaign):
            pass
        heard: list[str] = []
        gave_up = f"still being written by pid {holder.pid}"
        with (
            pytest.raises(CampaignBusy, match=gave_up),
            campaign_writer(campaign, timeout_s=0.3, on_wait=heard.append),
        ):
            pass
        assert heard and "waiting for up to 0.3 s" in heard[0]
    finally:
        holder.send_signal(signal.SIGKILL)  # dies holding it: the kernel releases the flock
        holder.wait(timeout=30)
    started = time.monotonic()
    with campaign_writer(campaign):  # at once, no wait: a dead holder's lock is not stale
        note = json.loads((campaign.parent / ".c-1.writer.json").read_text())
    assert time.monotonic() - started < 5
    assert note["pid"] == os.getpid()
    assert not (campaign.parent / ".c-1.writer.json").exists()
    assert not campaign.exists()  # taking the lock made no campaign folder (it would be quarantined)


# -- what a killed writer leaves ------------------------------------------------------------------------------
WRITER = """
import os, signal, sys, time
from pathlib import Path
from artifacts.store import atomic_dir
with atomic_dir(Path(sys.argv[1])) as tmp:
    (tmp / "meta.json").write_text("{}")
    print(tmp, flush=True)
    if sys.argv[2] == "die":
        os.kill(os.getpid(), signal.SIGKILL)  # killed mid-write: its temporary folder stays
    time.sleep(600)
"""


def test_a_killed_writers_temporaries_go_when_the_next_writer_starts(tmp_path: Path, observe) -> None:
    home = tmp_path / "home"
    cells = home / "raw" / "seed-t" / "cells"
    dead = subprocess.run(
        [sys.executable, "-c", WRITER, str(cells / "x.r0.w.c1.a1"), "die"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    left = Path(dead.stdout.strip())
    live = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(cells / "x.r0.w.c2.a1"), "live"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert live.stdout is not None
        writing = Path(live.stdout.readline().strip())
        assert dead.returncode == -signal.SIGKILL and left.is_dir() and writing.is_dir()
        tree = study(tmp_path / "study", 2)
        done = subprocess.run(
            [*CLI, "import", "seed", str(tree), "--campaign", "t"],
            cwd=REPO,
            env={**os.environ, "SPECGAUGE_HOME": str(home)},
            capture_output=True,
            text=True,
            timeout=240,
        )
        still_writing = writing.is_dir()
    finally:
        live.send_signal(signal.SIGKILL)
        live.wait(timeout=30)
    assert done.returncode == 0, done.stdout + done.stderr
    assert not left.exists(), "the killed writer's temporary folder is still there"
    assert still_writing, "a live writer's temporary folder was removed"
    observe(
        "two writers of one campaign or one import",
        done="a writer SIGKILLed inside atomic_dir (its .tmp-* cell folder left), another writer alive "
        "inside one; then `specgauge import seed` into the same campaign",
        expected="the killed writer's .tmp-* folder removed when the next writer takes the campaign's lock; "
        "the live writer's kept",
        observed=f"import exit {done.returncode}; killed writer's temporary left: {left.exists()}; live "
        f"writer's temporary kept: {still_writing}",
        records_lost=0,
        leaked=int(left.exists()),
    )


# -- campaigns ------------------------------------------------------------------------------------------------
@pytest.mark.server  # a real Prefect API
def test_a_second_run_of_a_running_campaign_is_refused_naming_the_first(
    prefect_api, standin_engine, home: Path, tmp_path: Path, observe
) -> None:
    from reliability_support import campaign_dir

    work = corpus(tmp_path / "w.jsonl", [("p0", "code", "def add(a, b):", 8), ("p1", "chat", "hi", 8)])
    spec = write_spec(
        tmp_path / "s.yaml",
        emulator_spec(
            "two-runs",
            work,
            load={"concurrencies": [1, 2], "requests": 6, "allow_short_cells": True},
            validity={"aa_control": False, "client_calibration": False},
        ),
    )
    env = {"PREFECT_API_URL": prefect_api, "SPECGAUGE_STANDIN_ARGS": "--step-ms 60"}  # cells of seconds
    directory = campaign_dir(spec)
    first = cli(home, "campaign", "run", str(spec), "--no-gate", "--no-analyze", **env)
    deadline = time.monotonic() + 180
    while not (directory / "deployments").exists() and first.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)  # the first run is launching: it writes from now on
    second = cli(home, "campaign", "run", str(spec), "--no-gate", "--no-analyze", **env)
    second_out, second_err = second.communicate(timeout=300)
    first_running = first.poll() is None  # still measuring when the second gave up
    first_out, first_err = first.communicate(timeout=300)
    attempts = attempt_dirs(directory)
    errors = [line for line in second_err.splitlines() if line.startswith("error:")]

    assert first.returncode == 0, first_out + first_err
    assert second.returncode == 2, second_out + second_err
    assert first_running
    assert len(errors) == 1 and f"is being written by pid {first.pid} " in errors[0], second_err
    assert "Traceback" not in second_err
    assert len(attempts) == 4 and all(name.endswith(".a1") for name in attempts), attempts
    observe(
        ROW,
        done="a second `specgauge campaign run` of the same spec while the first measures (stand-in "
        "engine, one raw tree, one Prefect API)",
        expected="the second refused at once with exit 2, naming the first's pid; each cell measured once",
        observed=f"exit codes first {first.returncode}, second {second.returncode} (first still running: "
        f"{first_running}); {errors[0][:160]!r}; {len(attempts)} attempts for 4 cells",
        records_lost=0,
        leaked=0,
    )
