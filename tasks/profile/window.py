"""One profiled window against a running deployment, and its raw artifact.

The window (docs/profiling.md): warm-up requests (not profiled), scrape `/metrics`, `POST /start_profile`,
N requests at closed-loop concurrency C, `POST /stop_profile`, scrape `/metrics`, wait until the worker's
trace is complete on disk, analyse it, and write

    RAW/<campaign_id>/profiles/<profile_id>/meta.json, breakdown.json, metrics_before.txt,
                                           metrics_after.txt, trace/<worker trace>

once, atomically (`artifacts.store.atomic_dir`). A trace larger than `inline_limit_bytes` stays where the
engine wrote it and meta.json points at it (path and sha256). A window that fails (requests failed, no trace,
an analysis error) is still written, with `status: "failed"` and the reason.

This is the CPU path (vLLM's torch profiler, whose traces land in a directory this process can read).
"""

from __future__ import annotations

import gzip
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from artifacts import ids, layout
from artifacts.documents import ProfileMeta
from artifacts.store import atomic_dir, write_json
from experiments.spec import Sampling
from specgauge.errors import ArtifactError, SpecgaugeError
from specgauge.provenance import host_facts, sha256_file, tool_facts, utc_now, utc_stamp
from tasks.launch.base import Deployment
from tasks.load.records import RequestRecord
from tasks.load.runner import LoadPlan, run_load_sync
from tasks.metrics import prometheus
from tasks.profile import torch_trace
from tasks.profile.breakdown import Breakdown, ProfileError, WindowCounters, counters_from_metrics
from workloads.schema import Prompt

PROFILE_FORMAT = 1
DEFAULT_INLINE_LIMIT = 64 * 1024 * 1024


@dataclass(frozen=True)
class WindowPlan:
    """What a profiled window sends: N measured requests at concurrency C after W warm-up requests."""

    concurrency: int = 2
    requests: int = 8
    warmup: int = 2
    request_timeout_s: float = 120.0
    time_cap_s: float = 600.0
    stop_timeout_s: float = 900.0  # /stop_profile returns once the trace is written: minutes on big windows
    flush_timeout_s: float = 300.0


@dataclass(frozen=True)
class WorkloadInfo:
    file: str
    sha256: str
    stratum: str | None


@dataclass(frozen=True)
class ProfileResult:
    path: Path
    status: str
    error: str | None
    breakdown: Breakdown | None


def profile_id_for(variant: str, workload: str | None, concurrency: int, stamp: str | None = None) -> str:
    return ids.profile_id(variant, workload, concurrency, stamp or utc_stamp())


def trace_files(trace_dir: Path) -> set[Path]:
    return {p for pattern in torch_trace.TRACE_GLOBS for p in trace_dir.glob(pattern)}


def _complete(path: Path) -> bool:
    """A gzip trace is complete when it decompresses to its end (a plain one when it ends with '}')."""
    try:
        if path.name.endswith(".gz"):
            with gzip.open(path, "rb") as fh:
                while fh.read(1 << 20):
                    pass
            return True
        with open(path, "rb") as fh:
            fh.seek(max(path.stat().st_size - 64, 0))
            return fh.read().rstrip().endswith(b"}")
    except (OSError, EOFError, gzip.BadGzipFile):
        return False


def wait_for_worker_trace(
    trace_dir: Path, before: set[Path], *, timeout_s: float, poll_s: float = 0.5
) -> Path:
    """The rank-0 worker trace that appeared since `before`, once it is complete and no longer growing."""
    deadline = time.monotonic() + timeout_s
    last_sizes: dict[Path, int] = {}
    while True:
        new = sorted(p for p in trace_files(trace_dir) - before if torch_trace.FRONTEND_MARK not in p.name)
        workers = [p for p in new if p.name.startswith("rank0.")] or new
        if len(workers) > 1:
            raise ProfileError(
                f"{trace_dir}: several new worker traces ({', '.join(p.name for p in workers)})"
            )
        if workers:
            path = workers[0]
            size = path.stat().st_size
            if last_sizes.get(path) == size and size > 0 and _complete(path):
                return path
            last_sizes[path] = size
        if time.monotonic() > deadline:
            found = ", ".join(p.name for p in new) or "nothing"
            raise ProfileError(
                f"{trace_dir}: no complete worker trace {timeout_s:.0f} s after /stop_profile (new files: {found})"
            )
        time.sleep(poll_s)


async def _post(client: httpx.AsyncClient, url: str, timeout_s: float) -> None:
    try:
        response = await client.post(url, timeout=timeout_s)
    except httpx.HTTPError as exc:
        raise ProfileError(f"POST {url}: {type(exc).__name__}: {exc}") from None
    if response.status_code != 200:
        raise ProfileError(
            f"POST {url}: HTTP {response.status_code}: {response.text[:200]!r} (was the engine started with "
            "--profiler-config?)"
        )


def _requests_summary(records: Sequence[RequestRecord]) -> dict[str, Any]:
    measured = [r for r in records if r.phase == "measured"]
    failed = [r for r in measured if not r.ok]
    errors: dict[str, int] = {}
    for r in failed:
        errors[r.error_class or "unknown"] = errors.get(r.error_class or "unknown", 0) + 1
    return {
        "total": len(measured),
        "ok": len(measured) - len(failed),
        "failed": len(failed),
        "errors": errors,
        "completion_tokens": sum(r.completion_tokens or 0 for r in measured if r.ok),
    }


class _ProfilerSwitch:
    """Turns vLLM's profiler on and off at the measured window's edges, scraping /metrics at each, and
    keeps what happened for meta.json."""

    def __init__(self, deployment: Deployment, stop_timeout_s: float) -> None:
        self.deployment = deployment
        self.headers = deployment.headers()
        self.stop_timeout_s = stop_timeout_s
        self.started = False
        self.stopped = False
        self.metrics_before: str | None = None
        self.metrics_after: str | None = None
        self.window_started_utc: str | None = None
        self.window_ended_utc: str | None = None
        self.stop_profile_s: float | None = None

    async def start(self) -> None:
        async with httpx.AsyncClient(headers=self.headers) as client:
            self.metrics_before = await prometheus.ascrape(
                self.deployment.metrics_url, headers=self.headers, client=client
            )
            await _post(client, f"{self.deployment.base_url}/start_profile", 60.0)
            self.started = True
            self.window_started_utc = utc_now()

    async def stop(self) -> None:
        async with httpx.AsyncClient(headers=self.headers) as client:
            self.window_ended_utc = utc_now()
            t = time.monotonic()
            await _post(client, f"{self.deployment.base_url}/stop_profile", self.stop_timeout_s)
            self.stopped = True
            self.stop_profile_s = round(time.monotonic() - t, 3)
            self.metrics_after = await prometheus.ascrape(
                self.deployment.metrics_url, headers=self.headers, client=client
            )


@dataclass
class _Profiled:
    """What the profiled window produced, whatever stopped it."""

    records: list[RequestRecord] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    trace_path: Path | None = None
    breakdown: Breakdown | None = None
    error: str | None = None


def _profile(
    deployment: Deployment,
    prompts: Sequence[Prompt],
    plan: WindowPlan,
    sampling: Sampling,
    switch: _ProfilerSwitch,
    trace_dir: Path,
) -> _Profiled:
    """Run the window's requests with the profiler on, wait for the worker's trace and analyse it. Never
    raises for a profiling problem: it is the result's error."""
    out = _Profiled()
    before_files = trace_files(trace_dir)
    load_plan = LoadPlan(
        mode="closed",
        concurrency=plan.concurrency,
        requests=plan.requests,
        warmup=plan.warmup,
        time_cap_s=plan.time_cap_s,
    )
    try:
        result = run_load_sync(
            deployment.base_url,
            deployment.served_model_name,
            list(prompts),
            load_plan,
            sampling,
            authorization=deployment.authorization(),
            timeout_s=plan.request_timeout_s,
            before_measured=switch.start,
            after_measured=switch.stop,
        )
        out.records, out.notes = result.records, list(result.notes)
        if not switch.started or not switch.stopped:
            raise ProfileError(
                "the profiled window did not run to its end: " + ("; ".join(out.notes) or "unknown")
            )
        out.trace_path = wait_for_worker_trace(trace_dir, before_files, timeout_s=plan.flush_timeout_s)
        summary = _requests_summary(out.records)
        if summary["failed"]:
            raise ProfileError(
                f"{summary['failed']} of {summary['total']} profiled requests failed: {summary['errors']}"
            )
        # A plain deployment drafts nothing, so nothing is wasted: zero counters say so explicitly.
        counters = WindowCounters(drafts=0, draft_tokens=0, accepted_tokens=0)
        if deployment.variant.speculative:
            counters = counters_from_metrics(
                switch.metrics_before, switch.metrics_after, deployment.served_model_name
            )
        out.breakdown = torch_trace.analyze_trace(out.trace_path, counters, k=deployment.variant.k)
    except (SpecgaugeError, httpx.HTTPError, OSError) as exc:
        out.error = f"{type(exc).__name__}: {exc}"
    finally:
        if switch.started and not switch.stopped:
            _stop_quietly(deployment, plan.stop_timeout_s)
    return out


def run_window(
    deployment: Deployment,
    prompts: Sequence[Prompt],
    *,
    campaign_id: str,
    raw_dir: Path,
    trace_dir: Path,
    plan: WindowPlan = WindowPlan(),
    sampling: Sampling = Sampling(),
    workload: WorkloadInfo | None = None,
    profile_id: str | None = None,
    inline_limit_bytes: int = DEFAULT_INLINE_LIMIT,
) -> ProfileResult:
    """Profile one window on a ready deployment whose engine writes torch traces into `trace_dir`."""
    if not prompts:
        raise ProfileError("no prompts to send in the profiled window")
    variant = deployment.variant
    profile_id = profile_id or profile_id_for(
        variant.name, workload.stratum if workload else None, plan.concurrency
    )
    final = layout.profile_dir(layout.campaign_dir(raw_dir, campaign_id), profile_id)
    if final.exists():
        raise ArtifactError(f"artifact {final} exists: raw artifacts are never overwritten")
    trace_dir = Path(trace_dir)
    trace_dir.mkdir(parents=True, exist_ok=True)
    switch = _ProfilerSwitch(deployment, plan.stop_timeout_s)
    started_utc = utc_now()
    profiled = _profile(deployment, prompts, plan, sampling, switch, trace_dir)
    error = profiled.error
    meta = {
        "format": PROFILE_FORMAT,
        "profile_id": profile_id,
        "campaign_id": campaign_id,
        "deployment_id": deployment.id,
        "variant": variant.model_dump(mode="json"),
        "profiler": torch_trace.SOURCE,
        "workload": {
            "file": workload.file if workload else None,
            "sha256": workload.sha256 if workload else None,
            "stratum": workload.stratum if workload else None,
            "prompt_ids": [p.id for p in prompts],
        },
        "load": {
            "mode": "closed",
            "concurrency": plan.concurrency,
            "requests": plan.requests,
            "warmup": plan.warmup,
            "request_timeout_s": plan.request_timeout_s,
            "time_cap_s": plan.time_cap_s,
        },
        "sampling": sampling.model_dump(mode="json"),
        "endpoint": "chat",
        "deployment": deployment.to_json(),
        "tool": tool_facts(),
        "host": host_facts(),
        "started_utc": started_utc,
        "window_started_utc": switch.window_started_utc,
        "window_ended_utc": switch.window_ended_utc,
        "stop_profile_s": switch.stop_profile_s,
        "ended_utc": utc_now(),
        "status": "ok" if error is None else "failed",
        "error": error,
        "requests": _requests_summary(profiled.records),
        "notes": profiled.notes,
        "trace": None,
    }
    write_profile_artifact(
        final,
        meta,
        profiled.breakdown,
        trace_path=profiled.trace_path,
        metrics_before=switch.metrics_before,
        metrics_after=switch.metrics_after,
        inline_limit_bytes=inline_limit_bytes,
    )
    return ProfileResult(path=final, status=meta["status"], error=error, breakdown=profiled.breakdown)


def write_profile_artifact(
    final: Path,
    meta: dict[str, Any],
    breakdown: Breakdown | None,
    *,
    trace_path: Path | None = None,
    metrics_before: str | None = None,
    metrics_after: str | None = None,
    inline_limit_bytes: int = DEFAULT_INLINE_LIMIT,
) -> Path:
    """Write a profile artifact once, atomically; `meta["trace"]` is filled in from `trace_path` (a copy
    under trace/ up to `inline_limit_bytes`, else a pointer), both with the trace's sha256."""
    meta = dict(meta)
    with atomic_dir(final) as tmp:
        if trace_path is not None and trace_path.exists():
            size = trace_path.stat().st_size
            digest = sha256_file(trace_path)
            if size <= inline_limit_bytes:
                (tmp / "trace").mkdir()
                shutil.copy2(trace_path, tmp / "trace" / trace_path.name)
                meta["trace"] = {"file": f"trace/{trace_path.name}", "sha256": digest, "bytes": size}
            else:
                meta["trace"] = {"pointer": str(trace_path), "sha256": digest, "bytes": size}
        if metrics_before is not None:
            (tmp / layout.METRICS_BEFORE).write_text(metrics_before)
        if metrics_after is not None:
            (tmp / layout.METRICS_AFTER).write_text(metrics_after)
        write_json(tmp / layout.META, ProfileMeta.model_validate(meta))
        if breakdown is not None:
            write_json(tmp / layout.BREAKDOWN, breakdown.to_json())
    return final


def _stop_quietly(deployment: Deployment, timeout_s: float) -> None:
    """Leave no profiler running after a failed window; the failure itself is already recorded."""
    try:
        httpx.post(f"{deployment.base_url}/stop_profile", headers=deployment.headers(), timeout=timeout_s)
    except httpx.HTTPError:
        pass
