"""The CPU path's trace analysis: a synthetic vLLM worker trace with a known answer worked out by hand, and
the real (trimmed) trace of a profiled window on the embedded engine stored in tests/data/profile/."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import pytest

from tasks.metrics.prometheus import spec_decode_delta
from tasks.profile import intervals as iv
from tasks.profile.breakdown import ProfileError, WindowCounters, counters_from_metrics, parse_step_annotation
from tasks.profile.torch_trace import (
    analyze_trace,
    find_worker_trace,
    load_trace,
    steps_from_trace,
    trim_trace,
)

DATA = Path(__file__).parent / "data" / "profile"
FIXTURE = DATA / "draft-k3.code.c2.worker.pt.trace.json.gz"
SERVED = "tiny-draft-k3"

WORKER = "vllm/v1/worker/gpu_worker.py(1300): execute_model"
SAMPLE = "vllm/v1/worker/gpu_worker.py(1293): sample_tokens"
TAKE = "vllm/v1/worker/gpu_worker.py(1362): take_draft_token_ids"
RUNNER = "vllm/v1/worker/gpu_model_runner.py(3939): execute_model"
REJECT = "vllm/v1/sample/rejection_sampler.py(106): forward"
DRAFT_OUTER = "vllm/v1/worker/gpu_model_runner.py(4362): propose_draft_token_ids"
DRAFT_INNER = "vllm/v1/worker/gpu_model_runner.py(4748): propose_draft_token_ids"
PASS = "vllm/model_executor/models/llama.py(534): forward"
PASS_INNER = "vllm/model_executor/models/llama.py(406): forward"


def ev(name: str, start: float, end: float, *, tid: int = 1, cat: str = "python_function") -> dict:
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": start, "dur": end - start}


def synthetic_trace() -> dict:
    """Three steps, k = 2, times in microseconds:

    step 0 (prefill, 2 requests, 10 positions): worker calls [0,100) [120,220) [230,240) = 210;
        verify 80, reject 10, drafting 60 (passes end at 180: 40 for position 0, 20 for position 1)
    step 1 (2 generation requests, 6 positions, 4 drafted): calls 100 + 100 + 10 = 210;
        verify 60, reject 20, drafting 60 (pass 0 ends at 485: 35 + 25)
    step 2 (1 generation request, 3 positions, 2 drafted; vLLM's detailed annotation): calls 80 + 60 = 140;
        verify 60, reject 10, drafting 30 (10 + 20)
    """
    events = [
        {"ph": "M", "name": "thread_name", "pid": 1, "tid": 1, "args": {"name": "VLLM::Worker"}},
        ev(RUNNER, 0, 1000, tid=2),  # another thread: ignored
        ev("threading.py(331): wait", 240, 300),  # the worker idles between calls: not engine time
        # step 0
        ev(WORKER, 0, 100),
        ev("execute_context_2(10)_generation_0(0)", 5, 95, cat="user_annotation"),
        ev(RUNNER, 10, 90),
        ev(SAMPLE, 120, 220),
        ev(REJECT, 125, 135),
        ev(DRAFT_OUTER, 140, 200),
        ev(DRAFT_INNER, 142, 198),  # nested: counted once
        ev(PASS, 150, 180),
        ev(PASS_INNER, 151, 179),  # the model's inner forward: not a pass of its own
        ev(PASS, 182, 195),
        ev(TAKE, 230, 240),
        # step 1
        ev(WORKER, 300, 400),
        ev("execute_context_0(0)_generation_2(6)", 305, 395, cat="user_annotation"),
        ev(RUNNER, 310, 370),
        ev(PASS, 312, 360),  # the target's forward: outside drafting, not a draft pass
        ev(SAMPLE, 420, 520),
        ev(REJECT, 425, 445),
        ev(DRAFT_OUTER, 450, 510),
        ev(PASS, 455, 485),
        ev(PASS, 488, 500),
        ev(TAKE, 530, 540),
        # step 2
        ev(WORKER, 600, 680),
        ev(
            "execute_3_context_0(sq0sk0sqsq0sqsk0)_generation_1(sq3sk40sqsq9sqsk120)",
            602,
            678,
            cat="user_annotation",
        ),
        ev(RUNNER, 605, 665),
        ev(SAMPLE, 700, 760),
        ev(REJECT, 705, 715),
        ev(DRAFT_OUTER, 720, 750),
        ev(PASS, 722, 730),
        ev(PASS, 732, 745),
    ]
    return {"schemaVersion": 1, "traceEvents": events}


def write_trace(path: Path, trace: dict) -> Path:
    path.write_bytes(gzip.compress(json.dumps(trace).encode()))
    return path


def test_synthetic_known_answer(tmp_path: Path) -> None:
    write_trace(tmp_path / "rank0.1.pt.trace.json.gz", synthetic_trace())
    counters = WindowCounters(drafts=3, draft_tokens=6, accepted_tokens=2, accepted_per_position=(2, 0))
    b = analyze_trace(tmp_path, counters, k=2)
    us = 1e-6
    assert [
        (s.context_requests, s.context_tokens, s.generation_requests, s.generation_tokens) for s in b.steps
    ] == [
        (2, 10, 0, 0),
        (0, 0, 2, 6),
        (0, 0, 1, 3),
    ]
    assert [s.engine_s for s in b.steps] == pytest.approx([210 * us, 210 * us, 140 * us], rel=1e-9)
    assert [s.verification_s for s in b.steps] == pytest.approx([80 * us, 60 * us, 60 * us], rel=1e-9)
    assert [s.rejection_s for s in b.steps] == pytest.approx([10 * us, 20 * us, 10 * us], rel=1e-9)
    assert [s.drafting_s for s in b.steps] == pytest.approx([60 * us, 60 * us, 30 * us], rel=1e-9)
    assert [s.drafting_by_position_s for s in b.steps] == [
        pytest.approx((40 * us, 20 * us), rel=1e-9),
        pytest.approx((35 * us, 25 * us), rel=1e-9),
        pytest.approx((10 * us, 20 * us), rel=1e-9),
    ]
    assert b.engine_s == pytest.approx(560 * us, rel=1e-9)
    assert b.other_s == pytest.approx(170 * us, rel=1e-9)
    # verification of drafted positions: 60 x 4/6 + 60 x 2/3 = 80; rejected 4 of 6 -> 53.33 wasted
    assert b.verification_drafted_s == pytest.approx(80 * us, rel=1e-9)
    assert b.wasted_verification_s == pytest.approx(80 * 4 / 6 * us, rel=1e-9)
    # drafting: 85 at position 0, 65 at position 1; slots 2 + 2 + 1 = 5; kept 2/5 and 0/5
    assert b.wasted_drafting_s == pytest.approx((85 * 3 / 5 + 65) * us, rel=1e-9)
    wasted = 80 * 4 / 6 + 85 * 3 / 5 + 65
    assert b.shares["wasted_share"] == pytest.approx(wasted / 560, rel=1e-9)
    assert b.shares["wasted_share_of_added"] == pytest.approx(wasted / 230, rel=1e-9)
    assert b.shares["useful_share"] == pytest.approx((150 + 200 - wasted) / 560, rel=1e-9)
    assert b.apportioning == "position-aware"


def test_without_per_position_counters_drafting_is_uniform(tmp_path: Path) -> None:
    path = write_trace(tmp_path / "rank0.1.pt.trace.json.gz", synthetic_trace())
    b = analyze_trace(path, WindowCounters(drafts=3, draft_tokens=6, accepted_tokens=2), k=2)
    # kept fraction A / (k S) = 2 / 10 at both positions of 150 us of drafting
    assert b.wasted_drafting_s == pytest.approx(150 * 0.8 * 1e-6, rel=1e-9)
    assert b.apportioning == "uniform"


def test_fixture_is_a_real_worker_trace_and_agrees_with_its_counters() -> None:
    trace = load_trace(FIXTURE)
    annotations = [e for e in trace["traceEvents"] if parse_step_annotation(str(e.get("name", "")))]
    counters = counters_from_metrics(
        (DATA / "metrics_before.txt").read_text(), (DATA / "metrics_after.txt").read_text(), SERVED
    )
    b = analyze_trace(FIXTURE, counters, k=3)
    assert len(b.steps) == len(annotations) > 10
    # what the trace says was verified is what the server counted in the same window
    assert b.cross_checks["draft_tokens"]["ok"] and b.cross_checks["drafts"]["ok"]
    assert sum(s.drafted_positions for s in b.steps) == counters.draft_tokens
    # the four exclusive parts make up the engine time; wasted + useful + rejection + other = 1
    shares = b.shares
    assert shares["drafting_share"] + shares["verification_share"] + shares["rejection_share"] + shares[
        "other_share"
    ] == pytest.approx(1.0)
    assert shares["wasted_share"] + shares["useful_share"] + shares["rejection_share"] + shares[
        "other_share"
    ] == pytest.approx(1.0)
    assert 0 < shares["wasted_share"] < shares["added_share"] < 1
    assert b.apportioning == "position-aware"
    for step in b.steps:
        if step.drafting_s:
            assert step.drafting_by_position_s is not None and len(step.drafting_by_position_s) == 3
            assert sum(step.drafting_by_position_s) == pytest.approx(step.drafting_s)


def test_fixture_step_times_match_the_raw_events() -> None:
    """Each step's verification time is the sum of the model runner's execute_model calls in it, read
    straight from the events; its engine time the merged worker calls."""
    trace = load_trace(FIXTURE)
    events = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    runner = sorted(
        (e["ts"], e["ts"] + e["dur"])
        for e in events
        if re.search(r"model_runner\.py\(\d+\): execute_model$", e["name"])
    )
    steps = steps_from_trace(trace)
    assert len(runner) == len(steps)  # one target step per engine step
    for step, (start, end) in zip(steps, runner, strict=True):
        assert step.verification_s == pytest.approx((end - start) / 1e6, rel=1e-9)
    calls = iv.union(
        (e["ts"], e["ts"] + e["dur"])
        for e in events
        if re.search(
            r"(gpu_worker|worker_base)\.py\(\d+\): (execute_model|sample_tokens|take_draft_token_ids)$",
            e["name"],
        )
    )
    assert sum(s.engine_s for s in steps) == pytest.approx(iv.length(calls) / 1e6, rel=1e-9)


def test_fixture_counters_are_the_prometheus_deltas() -> None:
    delta = spec_decode_delta(
        (DATA / "metrics_before.txt").read_text(), (DATA / "metrics_after.txt").read_text(), SERVED
    )
    counters = WindowCounters.from_spec_delta(delta)
    assert counters.draft_tokens == delta.draft_tokens and counters.accepted_tokens == delta.accepted_tokens
    assert sum(counters.accepted_per_position or ()) == delta.accepted_tokens


def test_trim_keeps_the_answer(tmp_path: Path) -> None:
    path = write_trace(tmp_path / "rank0.9.pt.trace.json.gz", synthetic_trace())
    counters = WindowCounters(drafts=3, draft_tokens=6, accepted_tokens=2, accepted_per_position=(2, 0))
    kept = trim_trace(path, tmp_path / "trimmed" / "rank0.9.pt.trace.json.gz")
    assert kept["kept"] < kept["events_before"]  # the other thread and the idle wait are gone
    full = analyze_trace(path, counters, k=2).to_json()
    assert analyze_trace(tmp_path / "trimmed", counters, k=2).to_json() == full


def test_bad_traces_are_named(tmp_path: Path) -> None:
    with pytest.raises(ProfileError, match="no worker trace"):
        find_worker_trace(tmp_path)
    (tmp_path / "vm_1.async_llm.5.pt.trace.json.gz").write_bytes(gzip.compress(b"{}"))
    with pytest.raises(ProfileError, match="no worker trace"):
        find_worker_trace(tmp_path)
    write_trace(tmp_path / "rank0.1.pt.trace.json.gz", synthetic_trace())
    write_trace(tmp_path / "rank0.2.pt.trace.json.gz", synthetic_trace())
    with pytest.raises(ProfileError, match="several worker traces"):
        find_worker_trace(tmp_path)
    broken = tmp_path / "broken.pt.trace.json.gz"
    broken.write_bytes(gzip.compress(b'{"traceEvents": [')[:-8])
    with pytest.raises(ProfileError, match=r"broken\.pt\.trace\.json\.gz"):
        load_trace(broken)
    no_steps = write_trace(tmp_path / "other.json.gz", {"traceEvents": [ev(WORKER, 0, 10)]})
    with pytest.raises(ProfileError, match="no per-step annotations"):
        analyze_trace(no_steps)
    no_stack = write_trace(
        tmp_path / "nostack.json.gz",
        {"traceEvents": [ev("execute_context_1(4)_generation_0(0)", 0, 10, cat="user_annotation")]},
    )
    with pytest.raises(ProfileError, match="torch_profiler_with_stack"):
        analyze_trace(no_stack)
