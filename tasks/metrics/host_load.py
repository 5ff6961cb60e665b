"""Who else used the CPU while a cell measured: the host's busy time against this process tree's.

A cell's throughput on a shared machine depends on what else runs there. On the embedded engine (the local
launcher) the engine is a child of the process that runs the cell, so the host's busy CPU time minus this
process tree's (the client, its load workers, the engine and its workers) and minus steal is what OTHER
processes took. Steal is time the hypervisor gave to other tenants of a virtual machine's host while this
guest wanted to run: no process here used it, so it is kept apart from "other". A cell during which others
or the hypervisor took a large share did not measure the engine alone: analysis/validity.py names such
cells and the validity verdict reads them (docs/analysis.md, "Contention", "Steal").

Host time from /proc/stat's first line (user nice system idle iowait irq softirq steal, all CPUs; busy =
everything but idle and iowait, steal included); the tree's from psutil (user + system of each live member,
plus what their reaped children used). Linux only; elsewhere None. With a remote launcher (SLURM, sml, an
endpoint) the engine is on another host: the figures then describe the client's host only.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import psutil

_PROC_STAT = "/proc/stat"
_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@dataclass(frozen=True)
class CpuSnapshot:
    wall_s: float  # time.monotonic()
    host_busy_s: float  # all CPUs' busy seconds since boot
    host_total_s: float  # all CPUs' seconds since boot (busy + idle + iowait)
    tree_s: float  # this process and its descendants: CPU seconds used so far
    host_steal_s: float = 0.0  # all CPUs' seconds stolen by the hypervisor since boot (part of busy)


@dataclass(frozen=True)
class HostShares:
    """Shares of the host's CPU capacity over a window (0..1 each; busy = ours + other + steal)."""

    cpus: int
    busy: float
    ours: float
    other: float
    steal: float


def host_seconds(first_line: str) -> tuple[float, float, float] | None:
    """(busy, total, steal) seconds of all CPUs from /proc/stat's first line, None if it is not the `cpu`
    line."""
    first = first_line.split()
    if not first or first[0] != "cpu":
        return None
    ticks = [int(v) for v in first[1:]]
    # user nice system idle iowait irq softirq steal guest guest_nice: guest time is already in user
    total = sum(ticks[:8])
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)
    steal = ticks[7] if len(ticks) > 7 else 0  # kernels before 2.6.11 have no steal column
    return (total - idle) / _TICKS, total / _TICKS, steal / _TICKS


def _host_seconds() -> tuple[float, float, float] | None:
    try:
        with open(_PROC_STAT, encoding="ascii") as f:
            return host_seconds(f.readline())
    except OSError:
        return None


def _tree_seconds(root: psutil.Process) -> float:
    total = 0.0
    members = [root]
    try:
        members += root.children(recursive=True)
    except psutil.Error:
        pass
    for member in members:
        try:
            t = member.cpu_times()
        except psutil.Error:  # exited between listing and reading
            continue
        total += t.user + t.system + t.children_user + t.children_system
    return total


def snapshot() -> CpuSnapshot | None:
    """Now, or None where /proc/stat is not readable (not Linux)."""
    host = _host_seconds()
    if host is None:
        return None
    busy, total, steal = host
    return CpuSnapshot(time.monotonic(), busy, total, _tree_seconds(psutil.Process()), steal)


def shares(before: CpuSnapshot | None, after: CpuSnapshot | None) -> HostShares | None:
    """The window's shares of the host's CPU capacity, or None without both snapshots or with no time."""
    if before is None or after is None:
        return None
    capacity = after.host_total_s - before.host_total_s
    if capacity <= 0:
        return None
    busy = max(0.0, after.host_busy_s - before.host_busy_s)
    steal = min(busy, max(0.0, after.host_steal_s - before.host_steal_s))
    # A member that exited inside the window takes its time with it (the tree is listed at each end): the
    # tree's share is then low and `other` high by that much, never the reverse.
    ours = min(busy, max(0.0, after.tree_s - before.tree_s))
    # Clipped: the tree's time (psutil) and the host's (/proc/stat) are read at slightly different moments.
    other = max(0.0, busy - ours - steal)
    return HostShares(
        cpus=psutil.cpu_count() or 1,
        busy=min(1.0, busy / capacity),
        ours=min(1.0, ours / capacity),
        other=min(1.0, other / capacity),
        steal=min(1.0, steal / capacity),
    )
