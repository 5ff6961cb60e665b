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
    # steal (this VM's hypervisor running other tenants) is neither ours nor another process's
    assert 0 <= other.busy <= 1 and other.busy == pytest.approx(
        other.ours + other.other + other.steal, abs=0.01
    )


def test_no_snapshot_gives_no_shares() -> None:
    assert host_load.shares(None, None) is None


def test_steal_is_read_from_proc_stat_and_kept_apart_from_other_processes() -> None:
    tick = 1 / host_load._TICKS
    # user nice system idle iowait irq softirq steal guest guest_nice, as /proc/stat's first line has them
    busy, total, steal = host_load.host_seconds("cpu  100 5 40 800 20 3 2 30 7 0\n") or (0, 0, 0)
    assert steal == pytest.approx(30 * tick)
    assert total == pytest.approx(1000 * tick)  # guest time is inside user: not counted twice
    assert busy == pytest.approx(180 * tick)  # everything but idle and iowait, steal included
    assert host_load.host_seconds("cpu  100 5 40 800 20 3 2\n") == pytest.approx((150 * tick, 970 * tick, 0))
    assert host_load.host_seconds("intr 1 2 3\n") is None
    # A window of 10 s of capacity: 6 busy, of which 2 ours and 3 stolen, so others took 1.
    before = host_load.CpuSnapshot(0.0, host_busy_s=10.0, host_total_s=100.0, tree_s=1.0, host_steal_s=4.0)
    after = host_load.CpuSnapshot(1.0, host_busy_s=16.0, host_total_s=110.0, tree_s=3.0, host_steal_s=7.0)
    window = host_load.shares(before, after)
    assert window is not None
    assert (window.busy, window.ours, window.steal) == pytest.approx((0.6, 0.2, 0.3))
    assert window.other == pytest.approx(0.1)
    # Steal and ours read at slightly different moments can exceed busy: others' share is clipped at 0.
    heavy = host_load.CpuSnapshot(1.0, host_busy_s=16.0, host_total_s=110.0, tree_s=5.0, host_steal_s=8.0)
    clipped = host_load.shares(before, heavy)
    assert clipped is not None and clipped.other == 0.0 and clipped.steal == pytest.approx(0.4)
