"""The Nsight Systems path: an export built in Nsight Systems' documented SQLite schema, with a known
answer worked out by hand below, must be reproduced exactly."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from tasks.profile.breakdown import ProfileError, WindowCounters
from tasks.profile.nsys import (
    analyze_sqlite,
    engine_profiler_args,
    nsys_export_command,
    nsys_profile_command,
    steps_from_sqlite,
)

# Tables and columns as documented for `nsys export --type=sqlite` (Nsight Systems' schema reference).
SCHEMA = """
CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME (
    start INTEGER NOT NULL, end INTEGER NOT NULL, eventClass INTEGER NOT NULL, globalTid INTEGER,
    correlationId INTEGER, nameId INTEGER NOT NULL REFERENCES StringIds(id), returnValue INTEGER NOT NULL,
    callchainId INTEGER);
CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (
    start INTEGER NOT NULL, end INTEGER NOT NULL, deviceId INTEGER NOT NULL, contextId INTEGER NOT NULL,
    streamId INTEGER NOT NULL, correlationId INTEGER, globalPid INTEGER,
    demangledName INTEGER NOT NULL REFERENCES StringIds(id), shortName INTEGER NOT NULL REFERENCES StringIds(id),
    mangledName INTEGER REFERENCES StringIds(id), launchType INTEGER, cacheConfig INTEGER,
    registersPerThread INTEGER NOT NULL, gridX INTEGER NOT NULL, gridY INTEGER NOT NULL, gridZ INTEGER NOT NULL,
    blockX INTEGER NOT NULL, blockY INTEGER NOT NULL, blockZ INTEGER NOT NULL,
    staticSharedMemory INTEGER NOT NULL, dynamicSharedMemory INTEGER NOT NULL,
    localMemoryPerThread INTEGER NOT NULL, localMemoryTotal INTEGER NOT NULL, gridId INTEGER NOT NULL,
    sharedMemoryExecuted INTEGER, graphNodeId INTEGER, sharedMemoryLimitConfig INTEGER);
CREATE TABLE NVTX_EVENTS (
    start INTEGER NOT NULL, end INTEGER, eventType INTEGER NOT NULL, rangeId INTEGER, category INTEGER,
    color INTEGER, text TEXT, globalTid INTEGER, endGlobalTid INTEGER, textId INTEGER REFERENCES StringIds(id),
    domainId INTEGER, uint64Value INTEGER, int64Value INTEGER, doubleValue REAL, uint32Value INTEGER,
    int32Value INTEGER, floatValue REAL, jsonTextId INTEGER, jsonText TEXT);
"""

PUSH_POP, START_END = 59, 60
VM = 1 << 56  # the high bits of a serialized global id (hardware/VM), which must not disturb the pid


def gid(pid: int, tid: int = 0) -> int:
    return VM | (pid << 24) | tid


class Export:
    """Writes rows into a fresh export. Correlation ids count per process, as CUDA's do: the same id appears
    in both ranks, so a kernel must be matched to its launch within its own process."""

    def __init__(self, path: Path) -> None:
        self.con = sqlite3.connect(path)
        self.con.executescript(SCHEMA)
        self.strings: dict[str, int] = {}
        self.correlation: dict[int, int] = {}

    def string(self, value: str) -> int:
        if value not in self.strings:
            self.strings[value] = len(self.strings) + 1
            self.con.execute("INSERT INTO StringIds VALUES (?, ?)", (self.strings[value], value))
        return self.strings[value]

    def nvtx(
        self, start: int, end: int, name: str, pid: int, tid: int, *, as_text: bool = False, kind=PUSH_POP
    ):
        text, text_id = (name, None) if as_text else (None, self.string(name))
        self.con.execute(
            "INSERT INTO NVTX_EVENTS (start, end, eventType, text, globalTid, textId) VALUES (?,?,?,?,?,?)",
            (start, end, kind, text, gid(pid, tid), text_id),
        )

    def launch(self, at: int, pid: int, tid: int, durations: list[int], *, graph: bool = False) -> None:
        """One CUDA API call at `at` launching kernels of the given durations (a graph launches several)."""
        self.correlation[pid] = correlation = self.correlation.get(pid, 0) + 1
        api = "cudaGraphLaunch_v10000" if graph else "cudaLaunchKernel_v7000"
        self.con.execute(
            "INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (?,?,?,?,?,?,?,?)",
            (at, at + 5, 0, gid(pid, tid), correlation, self.string(api), 0, None),
        )
        self.kernels(at + 10, pid, durations, correlation=correlation)

    def kernels(self, start: int, pid: int, durations: list[int], *, correlation: int) -> None:
        name = self.string("void gemm_kernel<float>(float*)")
        t = start
        for duration in durations:
            self.con.execute(
                "INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES "
                "(?,?,0,1,7,?,?,?,?,NULL,0,0,64,1,1,1,128,1,1,0,0,0,0,0,0,NULL,NULL)",
                (t, t + duration, correlation, gid(pid), name, name),
            )
            t += duration

    def close(self) -> None:
        self.con.commit()
        self.con.close()


STEPS = (
    "execute_context_2(10)_generation_0(0)",  # prefill of 2 requests: 10 positions, none drafted
    "execute_context_0(0)_generation_2(6)",  # 2 requests x (1 + k=2): 6 positions, 4 drafted
    "execute_context_0(0)_generation_1(3)",  # 1 request (the other finished): 3 positions, 2 drafted
)


def build_export(path: Path, names: dict[str, str] | None = None) -> None:
    """Two tensor-parallel ranks (processes 100 and 200), three steps each. Kernel nanoseconds:

    rank 100: step 0 verify 500, other 50, reject 20, draft 100+100
              step 1 verify 400+200 (one CUDA graph launch), reject 30, draft 100+100
              step 2 verify 450, reject 20, draft 100+100
    rank 200: the same without the 'other' kernel, and one 200 ns draft kernel per step.
    Left out: a kernel launched before the first step (70 ns) and one without a launching API call (80 ns).
    """
    n = {
        "draft": "specgauge:draft",
        "verify": "specgauge:verify",
        "reject": "specgauge:reject",
        **(names or {}),
    }
    db = Export(path)
    db.launch(500, 100, 101, [70])  # before the first step
    db.kernels(600, 100, [80], correlation=999)  # no runtime row with this correlation id
    for pid, tid, with_other, one_draft_kernel in ((100, 101, True, False), (200, 201, False, True)):
        base = 1000
        verify_kernels = ([500], [400, 200], [450])
        rejects = (20, 30, 20)
        for step, name in enumerate(STEPS):
            db.nvtx(base, base + 800, name, pid, tid)  # vLLM's step range wraps the target's step only
            db.nvtx(base, base + 700, n["verify"], pid, tid)
            db.nvtx(base + 50, base + 300, "attention", pid, tid)  # a nested range of no category
            db.launch(base + 100, pid, tid, verify_kernels[step], graph=len(verify_kernels[step]) > 1)
            if with_other and step == 0:
                db.launch(base + 750, pid, tid, [50])  # inside the step, outside every category
            db.nvtx(base + 810, base + 850, n["reject"], pid, tid, as_text=True, kind=START_END)
            db.launch(base + 820, pid, tid, [rejects[step]])
            db.nvtx(base + 900, base + 1200, n["draft"], pid, tid)
            if one_draft_kernel:
                db.launch(base + 910, pid, tid, [200])
            else:
                db.launch(base + 910, pid, tid, [100])
                db.launch(base + 1010, pid, tid, [100])
            base += 2000
    db.close()


COUNTERS = WindowCounters(drafts=3, draft_tokens=6, accepted_tokens=3, accepted_per_position=(2, 1))


def test_known_answer(tmp_path: Path) -> None:
    path = tmp_path / "report.sqlite"
    build_export(path)
    b = analyze_sqlite(path, COUNTERS, k=2)
    ns = 1e-9
    # Per step, both ranks summed: engine 1490 / 1660 / 1340, verify 1000 / 1200 / 900, draft 400 each,
    # reject 40 / 60 / 40, other 50 / 0 / 0.
    assert [s.engine_s for s in b.steps] == pytest.approx([1490 * ns, 1660 * ns, 1340 * ns], rel=1e-12)
    assert [s.verification_s for s in b.steps] == pytest.approx([1000 * ns, 1200 * ns, 900 * ns], rel=1e-12)
    assert [s.drafting_s for s in b.steps] == pytest.approx([400 * ns] * 3, rel=1e-12)
    assert [s.rejection_s for s in b.steps] == pytest.approx([40 * ns, 60 * ns, 40 * ns], rel=1e-12)
    assert b.engine_s == pytest.approx(4490 * ns, rel=1e-12)
    assert b.other_s == pytest.approx(50 * ns, rel=1e-9)
    # Verification of drafted positions: 1200 x 4/6 + 900 x 2/3 = 1400; rejected share 3/6 -> 700 wasted.
    assert b.verification_drafted_s == pytest.approx(1400 * ns, rel=1e-12)
    assert b.wasted_verification_s == pytest.approx(700 * ns, rel=1e-12)
    # Drafting: 1200 over k=2 positions (no per-pass ranges: 600 each); draft slots = 2 + 2 + 1 requests = 5;
    # kept 2/5 at position 0, 1/5 at position 1 -> wasted 600 x 3/5 + 600 x 4/5 = 840.
    assert b.wasted_drafting_s == pytest.approx(840 * ns, rel=1e-12)
    shares = b.shares
    assert shares["wasted_share"] == pytest.approx(1540 / 4490, rel=1e-12)
    assert shares["wasted_share_of_added"] == pytest.approx(1540 / 2600, rel=1e-12)
    assert shares["drafting_share"] == pytest.approx(1200 / 4490, rel=1e-12)
    assert shares["verification_share"] == pytest.approx(3100 / 4490, rel=1e-12)
    assert shares["rejection_share"] == pytest.approx(140 / 4490, rel=1e-12)
    assert shares["useful_share"] == pytest.approx(2760 / 4490, rel=1e-12)
    assert b.apportioning == "uniform"
    assert b.cross_checks["draft_tokens"]["ok"] and b.cross_checks["drafts"]["ok"]
    facts = b.cross_checks["attribution"]
    assert (facts["kernels_before_first_step"], facts["kernels_without_launch"], facts["processes"]) == (
        1,
        1,
        2,
    )
    assert facts["range_names"] == "overlay"


def test_vllm_scope_names_give_the_same_answer(tmp_path: Path) -> None:
    path = tmp_path / "scopes.sqlite"
    build_export(
        path,
        {
            "draft": "gpu_model_runner: draft",
            "verify": "gpu_model_runner: forward",
            "reject": "gpu_model_runner: sample",
        },
    )
    b = analyze_sqlite(path, COUNTERS, k=2)
    assert b.cross_checks["attribution"]["range_names"] == "vllm-scopes"
    assert b.shares["wasted_share"] == pytest.approx(1540 / 4490, rel=1e-12)


def test_counters_that_disagree_with_the_trace_are_flagged(tmp_path: Path) -> None:
    path = tmp_path / "report.sqlite"
    build_export(path)
    b = analyze_sqlite(
        path, WindowCounters(drafts=4, draft_tokens=8, accepted_tokens=3, accepted_per_position=(2, 1)), k=2
    )
    assert b.cross_checks["draft_tokens"] == {"trace": 6, "counters": 8, "rel_diff": 0.25, "ok": False}
    assert any("disagree" in note for note in b.notes)


def test_without_counters_only_the_time_split(tmp_path: Path) -> None:
    path = tmp_path / "report.sqlite"
    build_export(path)
    b = analyze_sqlite(path, None)
    assert b.shares["wasted_share"] is None and b.wasted_s is None
    assert b.shares["verification_share"] == pytest.approx(3100 / 4490, rel=1e-12)


def test_missing_tables_and_ranges_are_named(tmp_path: Path) -> None:
    empty = tmp_path / "empty.sqlite"
    sqlite3.connect(empty).close()
    with pytest.raises(ProfileError, match=r"missing table.*CUPTI_ACTIVITY_KIND_KERNEL"):
        steps_from_sqlite(empty)
    plain = tmp_path / "plain.sqlite"
    build_export(plain, {"draft": "x", "verify": "y", "reject": "z"})
    with pytest.raises(ProfileError, match="no drafting/verification/rejection NVTX ranges"):
        steps_from_sqlite(plain)
    with pytest.raises(ProfileError, match="no such SQLite export"):
        steps_from_sqlite(tmp_path / "absent.sqlite")


def test_commands() -> None:
    prefix = nsys_profile_command("/scratch/p/report")
    assert prefix[:2] == ["nsys", "profile"]
    assert "--trace=cuda,nvtx" in prefix and "--capture-range=cudaProfilerApi" in prefix
    assert "--output=/scratch/p/report" in prefix and "--cuda-graph-trace=node" in prefix
    assert "--capture-range=cudaProfilerApi" not in nsys_profile_command("r", capture_range=None)
    assert nsys_export_command("r.nsys-rep", "r.sqlite") == [
        "nsys",
        "export",
        "--type=sqlite",
        "--force-overwrite=false",
        "--output=r.sqlite",
        "r.nsys-rep",
    ]
    assert engine_profiler_args() == ["--profiler-config", '{"profiler":"cuda"}']
