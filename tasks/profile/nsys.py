"""Nsight Systems (the GPU path): the command that profiles the engine, the export to SQLite, and the
analysis of that export into the same breakdown as the CPU path.

Capture: run the engine under `nsys_profile_command(...)` with `engine_profiler_args()` (vLLM's `cuda`
profiler: `POST /start_profile` calls cudaProfilerStart, `/stop_profile` cudaProfilerStop, so
`--capture-range=cudaProfilerApi` records exactly the profiled window). With that profiler vLLM's worker
wraps every step in an NVTX range named `execute_context_<n>(<tokens>)_generation_<m>(<tokens>)`.
Drafting, verification and rejection sampling are NVTX ranges too: the specgauge overlay's
`specgauge:draft`, `specgauge:verify`, `specgauge:reject` (patches/, see docs/profiling.md), or, without
the overlay, vLLM's own scopes (`VLLM_NVTX_SCOPES_FOR_PROFILING=1`: `gpu_model_runner: draft`,
`gpu_model_runner: forward`, `gpu_model_runner: sample`).

Analysis of the export (Nsight Systems' documented SQLite schema; times in ns):
- `CUPTI_ACTIVITY_KIND_KERNEL` (start, end, deviceId, correlationId, globalPid, ...): GPU kernel time;
- `CUPTI_ACTIVITY_KIND_RUNTIME` (start, end, globalTid, correlationId, nameId, ...): the CUDA API call that
  launched each kernel (same correlationId within a process; with `--cuda-graph-trace=node` the kernels of a
  graph carry the correlationId of its cudaGraphLaunch);
- `NVTX_EVENTS` (start, end, eventType, text, globalTid, textId, ...): push/pop and start/end ranges
  (eventType 59, 60, 70, 71), named by `text` or `StringIds.value` through `textId`;
- a serialized global id holds the process id in bits 24..47: pid = (globalTid >> 24) & 0xFFFFFF.

A kernel belongs to the innermost category range on the launching thread that encloses its launch call,
and to the last step range of its process that started at or before the launch (the drafting and the
rejection sampling of a step run after its step range closes). Ranks of a tensor-parallel engine run the
same steps: step i of each process is summed into step i.
"""

from __future__ import annotations

import sqlite3
from bisect import bisect_right
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tasks.profile.breakdown import (
    Breakdown,
    ProfileError,
    Step,
    WindowCounters,
    compute_breakdown,
    parse_step_annotation,
)

SOURCE = "nsys"

# NVTX range names per category: the specgauge overlay's first, vLLM's own scopes as the fallback.
OVERLAY_RANGES: dict[str, tuple[str, ...]] = {
    "drafting": ("specgauge:draft",),
    "verification": ("specgauge:verify",),
    "rejection": ("specgauge:reject",),
}
VLLM_SCOPE_RANGES: dict[str, tuple[str, ...]] = {
    "drafting": ("gpu_model_runner: draft",),
    "verification": ("gpu_model_runner: forward",),
    "rejection": ("gpu_model_runner: sample",),
}
NVTX_RANGE_TYPES = (
    59,
    60,
    70,
    71,
)  # NvtxPushPopRange, NvtxStartEndRange, NvtxtPushPopRange, NvtxtStartEndRange
REQUIRED_TABLES = ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME", "NVTX_EVENTS", "StringIds")


def nsys_profile_command(
    output: str,
    *,
    nsys: str = "nsys",
    trace: Sequence[str] = ("cuda", "nvtx"),
    capture_range: str | None = "cudaProfilerApi",
    capture_range_end: str = "stop",
    cuda_graph_trace: str = "node",
    extra: Sequence[str] = (),
) -> list[str]:
    """The prefix that runs the engine under Nsight Systems; append the engine's own command.

    `output` is the report path without extension (nsys adds .nsys-rep). `capture_range` None profiles the
    whole run; the default records only between /start_profile and /stop_profile.
    """
    command = [
        nsys,
        "profile",
        f"--trace={','.join(trace)}",
        "--trace-fork-before-exec=true",  # vLLM's workers are child processes
        f"--cuda-graph-trace={cuda_graph_trace}",  # kernels of CUDA graphs, each with its launch's correlation
        "--sample=none",
        "--cpuctxsw=none",
        "--force-overwrite=false",  # a report is a raw artifact: never overwritten
        f"--output={output}",
    ]
    if capture_range:
        command += [f"--capture-range={capture_range}", f"--capture-range-end={capture_range_end}"]
    return [*command, *extra]


def engine_profiler_args() -> list[str]:
    """vLLM arguments that make /start_profile and /stop_profile drive the CUDA profiler (and so nsys)."""
    return ["--profiler-config", '{"profiler":"cuda"}']


ENGINE_ENV = {"VLLM_NVTX_SCOPES_FOR_PROFILING": "1"}  # vLLM's own NVTX scopes, the overlay's fallback


def nsys_export_command(report: str, output: str, *, nsys: str = "nsys") -> list[str]:
    """`nsys export` of a report to the SQLite file that `analyze_sqlite` reads."""
    return [nsys, "export", "--type=sqlite", "--force-overwrite=false", f"--output={output}", report]


# --------------------------------------------------------------------------------------------- analysis


def _pid(global_id: int) -> int:
    return (int(global_id) >> 24) & 0xFFFFFF


@dataclass(frozen=True)
class _Range:
    start: int
    end: int
    name: str


def _connect(path: Path) -> sqlite3.Connection:
    if not path.is_file():
        raise ProfileError(f"{path}: no such SQLite export")
    try:
        con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    except sqlite3.DatabaseError as exc:
        raise ProfileError(f"{path}: not a SQLite database: {exc}") from None
    missing = [t for t in REQUIRED_TABLES if t not in tables]
    if missing:
        con.close()
        raise ProfileError(
            f"{path}: missing table(s) {', '.join(missing)}: profile with --trace=cuda,nvtx and export with "
            "`nsys export --type=sqlite` (tables are created only when the report has such events)"
        )
    return con


def _ranges(con: sqlite3.Connection) -> dict[int, list[_Range]]:
    """Closed NVTX ranges by thread (globalTid), sorted by start."""
    types = ",".join(str(t) for t in NVTX_RANGE_TYPES)
    rows = con.execute(
        f"""SELECT e.start, e."end", e.globalTid, COALESCE(e.text, s.value) AS name
            FROM NVTX_EVENTS AS e LEFT JOIN StringIds AS s ON e.textId = s.id
            WHERE e.eventType IN ({types}) AND e."end" IS NOT NULL AND e."end" >= e.start"""
    ).fetchall()
    by_thread: dict[int, list[_Range]] = defaultdict(list)
    for start, end, tid, name in rows:
        if name is not None and tid is not None:
            by_thread[int(tid)].append(_Range(int(start), int(end), str(name)))
    for ranges in by_thread.values():
        ranges.sort(key=lambda r: (r.start, -r.end))
    return by_thread


def _category_names(by_thread: dict[int, list[_Range]]) -> tuple[dict[str, str], str]:
    names = {r.name for ranges in by_thread.values() for r in ranges}
    for label, table in (("overlay", OVERLAY_RANGES), ("vllm-scopes", VLLM_SCOPE_RANGES)):
        if any(n in names for ns in table.values() for n in ns):
            return {n: category for category, ns in table.items() for n in ns}, label
    raise ProfileError(
        "no drafting/verification/rejection NVTX ranges in the export: apply the specgauge NVTX overlay "
        "(specgauge:draft/verify/reject) or start the engine with VLLM_NVTX_SCOPES_FOR_PROFILING=1"
    )


class _Timeline:
    """The innermost range at any time on one thread: ranges flattened into disjoint labelled segments."""

    def __init__(self, ranges: list[_Range]) -> None:
        segments: list[tuple[int, int, str]] = []
        stack: list[_Range] = []
        cursor = 0

        def emit(start: int, end: int, name: str) -> None:
            if end > start:
                segments.append((start, end, name))

        for r in ranges:  # sorted by (start, -end)
            while stack and stack[-1].end <= r.start:
                top = stack.pop()
                emit(cursor, top.end, top.name)
                cursor = max(cursor, top.end)
            if stack:
                emit(cursor, r.start, stack[-1].name)
            cursor = r.start
            stack.append(r)
        while stack:
            top = stack.pop()
            emit(cursor, top.end, top.name)
            cursor = max(cursor, top.end)
        self._starts = [s for s, _, _ in segments]
        self._segments = segments

    def at(self, t: int) -> str | None:
        pos = bisect_right(self._starts, t) - 1
        if pos >= 0:
            start, end, name = self._segments[pos]
            if start <= t < end:
                return name
        return None


@dataclass
class _StepTotals:
    context_requests: int
    context_tokens: int
    generation_requests: int
    generation_tokens: int
    start: int
    engine: int = 0
    drafting: int = 0
    verification: int = 0
    rejection: int = 0


def steps_from_sqlite(path: Path | str) -> tuple[list[Step], dict[str, object]]:
    """Engine steps of an export with kernel time per category, and facts about the attribution."""
    path = Path(path)
    con = _connect(path)
    try:
        by_thread = _ranges(con)
        categories, naming = _category_names(by_thread)
        kernels = con.execute(
            """SELECT k.start, k."end", r.globalTid, r.start
               FROM CUPTI_ACTIVITY_KIND_KERNEL AS k
               LEFT JOIN CUPTI_ACTIVITY_KIND_RUNTIME AS r
                 ON r.correlationId = k.correlationId
                AND ((r.globalTid >> 24) & 16777215) = ((k.globalPid >> 24) & 16777215)
               ORDER BY k.start"""
        ).fetchall()
    finally:
        con.close()

    # Steps per process, in time order; categories per thread.
    steps_by_pid: dict[int, list[tuple[int, tuple[int, int, int, int]]]] = defaultdict(list)
    category_ranges: dict[int, list[_Range]] = {}
    for tid, ranges in by_thread.items():
        for r in ranges:
            parsed = parse_step_annotation(r.name)
            if parsed is not None:
                steps_by_pid[_pid(tid)].append((r.start, parsed))
        category_ranges[tid] = [r for r in ranges if r.name in categories]
    if not steps_by_pid:
        raise ProfileError(
            f"{path}: no per-step NVTX ranges (execute_context_N(T)_generation_M(T)): start the engine with "
            '--profiler-config \'{"profiler":"cuda"}\' so that vLLM annotates each step'
        )
    for entries in steps_by_pid.values():
        entries.sort()
    step_starts = {pid: [s for s, _ in entries] for pid, entries in steps_by_pid.items()}
    timelines = {tid: _Timeline(ranges) for tid, ranges in category_ranges.items() if ranges}
    counts = {len(v) for v in steps_by_pid.values()}
    if len(counts) != 1:
        raise ProfileError(
            f"{path}: processes have different numbers of steps ({sorted(counts)}): not one engine's ranks?"
        )
    n_steps = counts.pop()
    first_pid = min(steps_by_pid)
    totals = [
        _StepTotals(*steps_by_pid[first_pid][i][1], start=steps_by_pid[first_pid][i][0])
        for i in range(n_steps)
    ]
    for pid, entries in steps_by_pid.items():
        for i, (_, parsed) in enumerate(entries):
            if parsed != steps_by_pid[first_pid][i][1]:
                raise ProfileError(f"{path}: step {i} differs between processes {first_pid} and {pid}")

    unmatched = before_first = 0
    unmatched_ns = before_first_ns = 0
    for k_start, k_end, launch_tid, launch_start in kernels:
        duration = int(k_end) - int(k_start)
        if launch_tid is None:
            unmatched += 1
            unmatched_ns += duration
            continue
        pid = _pid(launch_tid)
        starts = step_starts.get(pid)
        index = bisect_right(starts, int(launch_start)) - 1 if starts else -1
        if index < 0:
            before_first += 1
            before_first_ns += duration
            continue
        step = totals[index]
        step.engine += duration
        timeline = timelines.get(int(launch_tid))
        enclosing = timeline.at(int(launch_start)) if timeline else None
        if enclosing is not None:
            category = categories[enclosing]
            setattr(step, category, getattr(step, category) + duration)

    origin = totals[0].start
    steps = [
        Step(
            index=i,
            t_s=(t.start - origin) / 1e9,
            context_requests=t.context_requests,
            context_tokens=t.context_tokens,
            generation_requests=t.generation_requests,
            generation_tokens=t.generation_tokens,
            engine_s=t.engine / 1e9,
            drafting_s=t.drafting / 1e9,
            verification_s=t.verification / 1e9,
            rejection_s=t.rejection / 1e9,
        )
        for i, t in enumerate(totals)
    ]
    facts: dict[str, object] = {
        "range_names": naming,
        "processes": len(steps_by_pid),
        "kernels": len(kernels),
        "kernels_without_launch": unmatched,
        "kernels_without_launch_s": unmatched_ns / 1e9,
        "kernels_before_first_step": before_first,
        "kernels_before_first_step_s": before_first_ns / 1e9,
    }
    return steps, facts


def analyze_sqlite(
    path: Path | str, counters: WindowCounters | None = None, *, k: int | None = None
) -> Breakdown:
    """The breakdown of one profiled window from an `nsys export --type=sqlite` file."""
    steps, facts = steps_from_sqlite(path)
    notes = []
    if facts["kernels_without_launch"]:
        notes.append(
            f"{facts['kernels_without_launch']} kernel(s) ({facts['kernels_without_launch_s']:.6f} s) had no "
            "launching CUDA API call in the export and are left out"
        )
    if facts["kernels_before_first_step"]:
        notes.append(
            f"{facts['kernels_before_first_step']} kernel(s) launched before the first step are left out"
        )
    breakdown = compute_breakdown(steps, counters, k=k, source=SOURCE, notes=notes)
    breakdown.cross_checks["attribution"] = facts
    return breakdown
