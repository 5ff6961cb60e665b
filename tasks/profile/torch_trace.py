"""vLLM's torch-profiler traces (the CPU path): find the worker's trace, cut it into engine steps, time the
drafter, the target's forward and the rejection sampler in each step.

vLLM (`--profiler-config '{"profiler":"torch","torch_profiler_dir":DIR}'`) writes one gzipped Chrome trace
per process and profiling session into DIR: `rank<r>.<id>.pt.trace.json.gz` per worker and
`<host>_<pid>.async_llm.<id>.pt.trace.json.gz` for the API front end. The worker trace (rank 0; other
tensor-parallel ranks do the same work) has, on its main thread:

- per step, a `user_annotation` named `execute_context_<n>(<tokens>)_generation_<m>(<tokens>)`;
- Python-level ranges (`torch_profiler_with_stack`, on by default) named `<file>(<line>): <function>`,
  e.g. `vllm/v1/worker/gpu_model_runner.py(3939): execute_model`. Line numbers change between vLLM
  versions, so ranges are matched by file and function only (`RANGES`).

Timestamps and durations in the trace are microseconds.
"""

from __future__ import annotations

import gzip
import json
import re
from collections import Counter
from itertools import pairwise
from pathlib import Path
from typing import Any

from tasks.profile import breakdown
from tasks.profile import intervals as iv

SOURCE = "torch-profiler"
TRACE_GLOBS = ("*.pt.trace.json.gz", "*.pt.trace.json")
FRONTEND_MARK = "async_llm"

_PY = r"(?:^|/){file}\.py\(\d+\): {func}$"

# What each category of engine time is, by range name. A range counts once however deeply it nests.
RANGES: dict[str, re.Pattern[str]] = {
    # The worker's calls from the engine core: the busy time that all shares are fractions of.
    "engine": re.compile(
        _PY.format(
            file=r"vllm/v1/worker/\w*(?:worker|worker_base)",
            func=r"(?:execute_model|sample_tokens|take_draft_token_ids)",
        )
    ),
    # The target's step: input preparation, forward over every scheduled position, logits.
    "verification": re.compile(
        _PY.format(file=r"vllm/v1/worker/\w*model_runner", func="execute_model")
        + r"|^gpu_model_runner: (?:preprocess|forward|postprocess)$"
    ),
    # The proposer (draft model, EAGLE head, n-gram lookup) and the copy of its drafts.
    "drafting": re.compile(
        _PY.format(file=r"vllm/v1/worker/\w*model_runner", func="propose_draft_token_ids")
        + r"|^gpu_model_runner: draft$"
    ),
    "rejection": re.compile(_PY.format(file=r"vllm/v1/sample/rejection_sampler", func="forward")),
    # One forward pass of a model; inside drafting, the drafter's passes (one per draft position).
    "model_pass": re.compile(_PY.format(file=r"vllm/model_executor/models/\w+", func="forward")),
}


def find_worker_trace(path: Path | str) -> Path:
    """The rank-0 worker trace: `path` itself if a file, else the one rank-0 trace in the directory."""
    path = Path(path)
    if path.is_file():
        return path
    if not path.is_dir():
        raise breakdown.ProfileError(f"{path}: no such trace file or directory")
    found = sorted({p for pattern in TRACE_GLOBS for p in path.glob(pattern) if FRONTEND_MARK not in p.name})
    if not found:
        raise breakdown.ProfileError(
            f"{path}: no worker trace (*.pt.trace.json[.gz] other than the {FRONTEND_MARK} front end)"
        )
    rank0 = [p for p in found if p.name.startswith("rank0.")] or found
    if len(rank0) > 1:
        names = ", ".join(p.name for p in rank0)
        raise breakdown.ProfileError(
            f"{path}: several worker traces ({names}); name the file of the window you want"
        )
    return rank0[0]


def load_trace(path: Path | str) -> dict[str, Any]:
    path = Path(path)
    try:
        raw = path.read_bytes()
        text = gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw
        data = json.loads(text)
    except (OSError, EOFError, gzip.BadGzipFile) as exc:
        raise breakdown.ProfileError(f"{path}: unreadable trace: {exc}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise breakdown.ProfileError(f"{path}: not a Chrome-trace JSON: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        raise breakdown.ProfileError(f"{path}: not a Chrome-trace JSON object (no traceEvents list)")
    return data


def _complete_events(trace: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        e
        for e in trace["traceEvents"]
        if isinstance(e, dict) and e.get("ph") == "X" and "dur" in e and "ts" in e and "name" in e
    ]


def worker_thread(events: list[dict[str, Any]], source: str = "<trace>") -> tuple[Any, Any]:
    """(pid, tid) of the thread carrying the per-step annotations."""
    counts = Counter(
        (e.get("pid"), e.get("tid"))
        for e in events
        if breakdown.parse_step_annotation(str(e["name"])) is not None
    )
    if not counts:
        raise breakdown.ProfileError(
            f"{source}: no per-step annotations (execute_context_N(T)_generation_M(T)): is this vLLM's "
            "worker trace (rank*.pt.trace.json.gz), recorded with --profiler-config profiler=torch?"
        )
    return counts.most_common(1)[0][0]


def _outermost(events: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for start, end in sorted(events, key=lambda se: (se[0], -se[1])):
        if out and end <= out[-1][1]:
            continue  # nested in the previous pass
        out.append((start, end))
    return out


def _position_times(drafting: list[iv.Interval], passes: list[iv.Interval]) -> tuple[float, ...] | None:
    """Drafting time per draft position: cut at the end of each pass; what follows the last pass (its
    sampling and the copy of the drafts) goes to the last position."""
    if not drafting or not passes:
        return None
    begin, finish = drafting[0][0], drafting[-1][1]
    cuts = [begin, *(end for _, end in passes[:-1]), finish]
    return tuple(iv.length(iv.clip(drafting, a, b)) for a, b in pairwise(cuts))


def steps_from_trace(trace: dict[str, Any], *, source: str = "<trace>") -> list[breakdown.Step]:
    """Engine steps of a worker trace, with drafting / verification / rejection time per step."""
    events = _complete_events(trace)
    pid, tid = worker_thread(events, source)
    mine = [e for e in events if e.get("pid") == pid and e.get("tid") == tid]
    raw: dict[str, list[iv.Interval]] = {name: [] for name in RANGES}
    annotations: list[tuple[float, tuple[int, int, int, int]]] = []
    for event in mine:
        name = str(event["name"])
        start = float(event["ts"])
        span = (start, start + float(event["dur"]))
        parsed = breakdown.parse_step_annotation(name)
        if parsed is not None:
            annotations.append((start, parsed))
            continue
        for category, pattern in RANGES.items():
            if pattern.search(name):
                raw[category].append(span)
    engine = iv.union(raw["engine"])
    if not engine:
        raise breakdown.ProfileError(
            f"{source}: no worker-call ranges (e.g. 'gpu_worker.py(...): execute_model'): record the trace "
            "with Python stacks (torch_profiler_with_stack, vLLM's default)"
        )
    # Exclusive categories: rejection, then drafting, then verification; all inside the worker's calls.
    rejection = iv.intersect(iv.union(raw["rejection"]), engine)
    drafting = iv.subtract(iv.intersect(iv.union(raw["drafting"]), engine), rejection)
    verification = iv.subtract(
        iv.subtract(iv.intersect(iv.union(raw["verification"]), engine), rejection), drafting
    )
    passes = _outermost(raw["model_pass"])

    annotations.sort()
    starts = []
    for at, _ in annotations:
        around = iv.containing(engine, at)
        starts.append(around[0] if around else at)
    ends = [*starts[1:], max(engine[-1][1], starts[-1])]
    origin = starts[0]
    steps: list[breakdown.Step] = []
    for index, ((_, (ctx_req, ctx_tok, gen_req, gen_tok)), a, b) in enumerate(
        zip(annotations, starts, ends, strict=True)
    ):
        step_drafting = iv.clip(drafting, a, b)
        step_passes = [p for p in passes if iv.containing(step_drafting, p[0]) is not None]
        steps.append(
            breakdown.Step(
                index=index,
                t_s=(a - origin) / 1e6,
                context_requests=ctx_req,
                context_tokens=ctx_tok,
                generation_requests=gen_req,
                generation_tokens=gen_tok,
                engine_s=iv.length(iv.clip(engine, a, b)) / 1e6,
                drafting_s=iv.length(step_drafting) / 1e6,
                verification_s=iv.length(iv.clip(verification, a, b)) / 1e6,
                rejection_s=iv.length(iv.clip(rejection, a, b)) / 1e6,
                drafting_by_position_s=(
                    tuple(t / 1e6 for t in times)
                    if (times := _position_times(step_drafting, step_passes))
                    else None
                ),
            )
        )
    return steps


def analyze_trace(
    path: Path | str, counters: breakdown.WindowCounters | None = None, *, k: int | None = None
) -> breakdown.Breakdown:
    """The breakdown of one profiled window from its worker trace (a file or vLLM's trace directory)."""
    trace_path = find_worker_trace(path)
    steps = steps_from_trace(load_trace(trace_path), source=str(trace_path))
    return breakdown.compute_breakdown(steps, counters, k=k, source=SOURCE)


def trim_trace(src: Path | str, dst: Path | str) -> dict[str, int]:
    """Write a copy of a worker trace keeping only what the analysis reads (the worker thread's step
    annotations and the ranges in RANGES, plus metadata): same breakdown, a small fraction of the size."""
    src, dst = Path(src), Path(dst)
    trace = load_trace(src)
    events = _complete_events(trace)
    pid, tid = worker_thread(events, str(src))
    kept = [
        e
        for e in trace["traceEvents"]
        if isinstance(e, dict)
        and (
            e.get("ph") == "M"
            or (
                e.get("ph") == "X"
                and e.get("pid") == pid
                and e.get("tid") == tid
                and (
                    breakdown.parse_step_annotation(str(e.get("name", ""))) is not None
                    or any(p.search(str(e.get("name", ""))) for p in RANGES.values())
                )
            )
        )
    ]
    out = {k: v for k, v in trace.items() if k not in ("traceEvents", "distributedInfo")}
    out["traceEvents"] = kept
    out["specgaugeTrimmed"] = {
        "from": src.name,
        "events_before": len(trace["traceEvents"]),
        "kept": len(kept),
    }
    payload = json.dumps(out, separators=(",", ":")).encode()
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_bytes(gzip.compress(payload, mtime=0) if dst.name.endswith(".gz") else payload)
    return {"events_before": len(trace["traceEvents"]), "kept": len(kept)}
