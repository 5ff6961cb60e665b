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
from dataclasses import dataclass
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
    headers = deployment.headers()
    state: dict[str, Any] = {"started": False, "stopped": False}
    before_files = trace_files(trace_dir)
    started_utc = utc_now()

    async def before_measured() -> None:
        async with httpx.AsyncClient(headers=headers) as client:
            state["metrics_before"] = await prometheus.ascrape(
                deployment.metrics_url, headers=headers, client=client
            )
            await _post(client, f"{deployment.base_url}/start_profile", 60.0)
            state["started"] = True
            state["window_started_utc"] = utc_now()

    async def after_measured() -> None:
        async with httpx.AsyncClient(headers=headers) as client:
            state["window_ended_utc"] = utc_now()
            t = time.monotonic()
            await _post(client, f"{deployment.base_url}/stop_profile", plan.stop_timeout_s)
            state["stopped"] = True
            state["stop_profile_s"] = round(time.monotonic() - t, 3)
            state["metrics_after"] = await prometheus.ascrape(
                deployment.metrics_url, headers=headers, client=client
            )

    load_plan = LoadPlan(
        mode="closed",
        concurrency=plan.concurrency,
        requests=plan.requests,
        warmup=plan.warmup,
        time_cap_s=plan.time_cap_s,
    )
    error: str | None = None
    breakdown: Breakdown | None = None
    trace_path: Path | None = None
    records: list[RequestRecord] = []
    notes: list[str] = []
    try:
        result = run_load_sync(
            deployment.base_url,
            deployment.served_model_name,
            list(prompts),
            load_plan,
            sampling,
            authorization=deployment.authorization(),
            timeout_s=plan.request_timeout_s,
            before_measured=before_measured,
            after_measured=after_measured,
        )
        records, notes = result.records, list(result.notes)
        if not state["started"] or not state["stopped"]:
            raise ProfileError(
                "the profiled window did not run to its end: " + ("; ".join(notes) or "unknown")
            )
        trace_path = wait_for_worker_trace(trace_dir, before_files, timeout_s=plan.flush_timeout_s)
        summary = _requests_summary(records)
        if summary["failed"]:
            raise ProfileError(
                f"{summary['failed']} of {summary['total']} profiled requests failed: {summary['errors']}"
            )
        # A plain deployment drafts nothing, so nothing is wasted: zero counters say so explicitly.
        counters = WindowCounters(drafts=0, draft_tokens=0, accepted_tokens=0)
        if variant.speculative:
            counters = counters_from_metrics(
                state["metrics_before"], state["metrics_after"], deployment.served_model_name
            )
        breakdown = torch_trace.analyze_trace(trace_path, counters, k=variant.k)
    except (SpecgaugeError, httpx.HTTPError, OSError) as exc:
        error = f"{type(exc).__name__}: {exc}"
    finally:
        if state["started"] and not state["stopped"]:
            _stop_quietly(deployment, plan.stop_timeout_s)
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
        "window_started_utc": state.get("window_started_utc"),
        "window_ended_utc": state.get("window_ended_utc"),
        "stop_profile_s": state.get("stop_profile_s"),
        "ended_utc": utc_now(),
        "status": "ok" if error is None else "failed",
        "error": error,
        "requests": _requests_summary(records),
        "notes": notes,
        "trace": None,
    }
    write_profile_artifact(
        final,
        meta,
        breakdown,
        trace_path=trace_path,
        metrics_before=state.get("metrics_before"),
        metrics_after=state.get("metrics_after"),
        inline_limit_bytes=inline_limit_bytes,
    )
    return ProfileResult(path=final, status=meta["status"], error=error, breakdown=breakdown)


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
