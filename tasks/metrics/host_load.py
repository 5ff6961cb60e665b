"""Who else used the CPU while a cell measured: the host's busy time against this process tree's.

A cell's throughput on a shared machine depends on what else runs there. On the embedded engine (the local
launcher) the engine is a child of the process that runs the cell, so the host's busy CPU time minus this
process tree's (the client, its load workers, the engine and its workers) is what OTHER processes took. A
cell during which they took a large share did not measure the engine alone: analysis/validity.py names such
cells and the validity verdict reads them (docs/analysis.md, "Contention").

Host time from /proc/stat (all CPUs, busy = everything but idle and iowait); the tree's from psutil (user +
system of each live member, plus what their reaped children used). Linux only; elsewhere None. With a remote
launcher (SLURM, sml, an endpoint) the engine is on another host: the figures then describe the client's
host only.
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


@dataclass(frozen=True)
class HostShares:
    """Shares of the host's CPU capacity over a window (0..1 each; busy = ours + other)."""

    cpus: int
    busy: float
    ours: float
    other: float


def _host_seconds() -> tuple[float, float] | None:
    try:
        with open(_PROC_STAT, encoding="ascii") as f:
            first = f.readline().split()
    except OSError:
        return None
    if not first or first[0] != "cpu":
        return None
    ticks = [int(v) for v in first[1:]]
    # user nice system idle iowait irq softirq steal guest guest_nice: guest time is already in user
    total = sum(ticks[:8])
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)
    return (total - idle) / _TICKS, total / _TICKS


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
    return CpuSnapshot(time.monotonic(), host[0], host[1], _tree_seconds(psutil.Process()))


def shares(before: CpuSnapshot | None, after: CpuSnapshot | None) -> HostShares | None:
    """The window's shares of the host's CPU capacity, or None without both snapshots or with no time."""
    if before is None or after is None:
        return None
    capacity = after.host_total_s - before.host_total_s
    if capacity <= 0:
        return None
    busy = max(0.0, after.host_busy_s - before.host_busy_s)
    # A member that exited inside the window takes its time with it (the tree is listed at each end): the
    # tree's share is then low and `other` high by that much, never the reverse.
    ours = min(busy, max(0.0, after.tree_s - before.tree_s))
    return HostShares(
        cpus=psutil.cpu_count() or 1,
        busy=min(1.0, busy / capacity),
        ours=min(1.0, ours / capacity),
        other=min(1.0, (busy - ours) / capacity),
    )
