"""Who else used the CPU while a cell measured (tasks/metrics/host_load.py), and what validity makes of it."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil
import pytest

from tasks.metrics import host_load

HOG = "import time\nend = time.monotonic() + {seconds}\nwhile time.monotonic() < end: pass\n"


def _spin(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


@pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="Linux only")
def test_a_busy_loop_of_our_own_counts_as_ours_and_a_stranger_as_other() -> None:
    cpus = psutil.cpu_count() or 1
    spent = time.process_time()  # this process's CPU time by another clock than psutil's /proc reading
    before = host_load.snapshot()
    _spin(1.0)  # this process: ours
    after = host_load.snapshot()
    spent = time.process_time() - spent
    ours = host_load.shares(before, after)
    assert ours is not None and ours.cpus == cpus and before is not None and after is not None
    # What the loop got depends on what else runs (CI's other worker, an engine); what is counted as ours
    # must be what it got: the loop's CPU seconds, out of the host's capacity over the window.
    assert spent >= 0.2, spent
    assert ours.ours * (after.host_total_s - before.host_total_s) == pytest.approx(spent, abs=0.1), ours
    # a process that is not our descendant (double fork: re-parented away from us) is someone else
    before = host_load.snapshot()
    launcher = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import subprocess, sys; subprocess.Popen([sys.executable, '-c', sys.argv[1]])",
            HOG.format(seconds=1.5),
        ],
    )
    launcher.wait()
    time.sleep(1.6)
    other = host_load.shares(before, host_load.snapshot())
    assert other is not None
    assert other.other >= 0.5 / cpus, other
    assert other.ours < other.other
    assert 0 <= other.busy <= 1 and other.busy == pytest.approx(other.ours + other.other, abs=1e-9)


def test_no_snapshot_gives_no_shares() -> None:
    assert host_load.shares(None, None) is None
