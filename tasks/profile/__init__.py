"""Profiled windows and where speculation spends (and wastes) engine time: torch-profiler traces on the
CPU engine, Nsight Systems exports on GPUs, both reduced to one breakdown (docs/profiling.md)."""

from tasks.profile.breakdown import Breakdown, ProfileError, Step, WindowCounters, compute_breakdown

__all__ = ["Breakdown", "ProfileError", "Step", "WindowCounters", "compute_breakdown"]
