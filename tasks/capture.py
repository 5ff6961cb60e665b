"""Greedy capture: the outputs a deployment gives for a capture corpus, one request at a time.

A capture is the raw material of the correctness gate (tasks/gate.py). Requests go out sequentially, so
no batching with other requests changes the numerics, with temperature 0 and a fixed seed; each output
keeps its text, its token ids (when the server returns them), finish reason and usage, and a failed
request is kept as a failed row with its reason. The artifact, written once:

    RAW/<campaign>/captures/<capture_id>/meta.json       who, what, how (artifacts.documents.CaptureMeta)
    RAW/<campaign>/captures/<capture_id>/outputs.parquet  one row per prompt, artifacts.documents.OUTPUT_SCHEMA
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import polars as pl

from artifacts import layout
from artifacts.documents import OUTPUT_SCHEMA, CaptureMeta
from artifacts.store import atomic_dir, write_json
from experiments.spec import Sampling
from specgauge.errors import ArtifactError, InputError, MetricsError
from specgauge.provenance import host_facts, tool_facts, utc_now
from tasks.launch.base import Deployment
from tasks.load.client import StreamingClient
from tasks.load.records import RequestRecord
from tasks.metrics.prometheus import ascrape, spec_decode_delta
from workloads.schema import Corpus, Prompt

CAPTURE_FORMAT = 1


Progress = Callable[[int, int, RequestRecord], None]


class SamplingNotGreedy(InputError):
    """A capture for the correctness gate must be greedy unless sampling is explicitly allowed."""


# --- the artifact: writing -------------------------------------------------------------------------------


def prompt_sha256(prompt: Prompt, max_tokens: int) -> str:
    """What the server was asked for one prompt (messages and the token budget), as a hash."""
    canonical = json.dumps(
        {"messages": prompt.chat_messages(), "max_tokens": max_tokens}, sort_keys=True, separators=(",", ":")
    )
    return hashlib.sha256(canonical.encode()).hexdigest()


def effective_max_tokens(prompt: Prompt, sampling: Sampling, max_tokens: int | None) -> int:
    """The capture's own cap wins, then the sampling override, then the prompt's budget."""
    return max_tokens or sampling.max_tokens or prompt.max_tokens


def output_row(record: RequestRecord) -> dict[str, Any]:
    return {
        "prompt_id": record.prompt_id,
        "workload": record.workload,
        "ok": record.ok,
        "error": None if record.ok else (record.error or record.error_class or "failed"),
        "text": record.text,
        "token_ids": record.token_ids,
        "finish_reason": record.finish_reason,
        "prompt_tokens": record.prompt_tokens,
        "completion_tokens": record.completion_tokens,
    }


def outputs_frame(records: list[RequestRecord]) -> pl.DataFrame:
    return pl.DataFrame([output_row(r) for r in records], schema=OUTPUT_SCHEMA, orient="row")


def write_capture_artifact(
    final: Path, meta: CaptureMeta | dict[str, Any], rows: list[dict[str, Any]]
) -> Path:
    """Write a capture directory once, atomically (meta.json + outputs.parquet, OUTPUT_SCHEMA rows)."""
    meta = meta if isinstance(meta, CaptureMeta) else CaptureMeta.model_validate(meta)
    frame = pl.DataFrame(rows, schema=OUTPUT_SCHEMA, orient="row")
    if frame["prompt_id"].to_list() != list(meta.prompt_ids or ()):
        raise ArtifactError(f"{final}: rows do not follow meta's prompt_ids")
    with atomic_dir(final) as tmp:
        write_json(tmp / layout.META, meta)
        frame.write_parquet(tmp / layout.OUTPUTS)
    return final


# --- taking a capture ------------------------------------------------------------------------------------


def check_sampling(sampling: Sampling, *, allow_sampling: bool) -> None:
    if not sampling.greedy and not allow_sampling:
        raise SamplingNotGreedy(
            f"capture sampling has temperature {sampling.temperature:g}: the correctness gate compares greedy "
            "outputs (temperature 0); pass allow_sampling=True only to make a deliberately lossy capture"
        )


async def _scrape_or_none(deployment: Deployment) -> str | None:
    try:
        return await ascrape(deployment.metrics_url, headers=deployment.headers())
    except MetricsError:
        return None


def _speculation(deployment: Deployment, before: str | None, after: str | None) -> dict[str, Any] | None:
    """Speculation counters over the capture (evidence that drafts were verified, not skipped); None for
    a plain deployment, an error note when /metrics could not tell."""
    if not deployment.variant.speculative:
        return None
    if before is None or after is None:
        return {"error": f"/metrics ({deployment.metrics_url}) could not be scraped around the capture"}
    try:
        return spec_decode_delta(before, after, deployment.served_model_name).to_json()
    except MetricsError as exc:
        return {"error": str(exc)}


def _token_ids_consistent(record: RequestRecord) -> bool:
    """Token ids are usable only when they account for every completion token the server counted."""
    if record.token_ids is None or record.completion_tokens is None:
        return record.token_ids is not None
    return len(record.token_ids) == record.completion_tokens


async def capture_async(
    deployment: Deployment,
    corpus: Corpus,
    *,
    sampling: Sampling,
    max_tokens: int | None = None,
    limit: int | None = None,
    raw_campaign_dir: Path,
    capture_id: str,
    campaign_id: str,
    progress: Progress | None = None,
    allow_sampling: bool = False,
    timeout_s: float = 300.0,
) -> Path:
    """The async body of `capture` (for callers already inside an event loop)."""
    check_sampling(sampling, allow_sampling=allow_sampling)
    final = layout.capture_dir(raw_campaign_dir, capture_id)
    if final.exists():
        raise ArtifactError(f"capture {final} exists: raw artifacts are never overwritten")
    prompts = list(corpus.prompts[:limit] if limit else corpus.prompts)
    if not prompts:
        raise InputError(f"{corpus.path}: no prompts to capture (limit={limit})")
    request_sampling = sampling.model_copy(update={"max_tokens": max_tokens}) if max_tokens else sampling
    metrics_before = await _scrape_or_none(deployment)
    started_utc, t0 = utc_now(), time.perf_counter()
    records: list[RequestRecord] = []
    async with StreamingClient(
        deployment.base_url,
        deployment.served_model_name,
        authorization=deployment.authorization(),
        timeout_s=timeout_s,
        want_token_ids=True,
        keep_text=True,
        keep_token_ids=True,
    ) as client:
        for index, prompt in enumerate(prompts):  # one at a time: no batching changes the numerics
            record = await client.send(
                prompt,
                request_sampling,
                index=index,
                phase="measured",
                t0=t0,
                queued_s=time.perf_counter() - t0,
            )
            records.append(record)
            if progress is not None:
                progress(index + 1, len(prompts), record)
    wall_s = time.perf_counter() - t0
    speculation = _speculation(deployment, metrics_before, await _scrape_or_none(deployment))
    warnings = []
    for record in records:
        if record.ok and record.completion_tokens == 0:
            record.token_ids = []  # nothing generated: the client keeps no ids for an empty stream
        if record.ok and record.token_ids is not None and not _token_ids_consistent(record):
            warnings.append(
                f"{record.prompt_id}: {len(record.token_ids)} token ids for {record.completion_tokens} completion "
                "tokens: ids dropped, compared on characters"
            )
            record.token_ids = None
    meta = CaptureMeta.model_validate(
        {
            "format": CAPTURE_FORMAT,
            "capture_id": capture_id,
            "campaign_id": campaign_id,
            "deployment_id": deployment.id,
            "variant": deployment.variant.model_dump(mode="json"),
            "corpus": {"file": corpus.path, "sha256": corpus.sha256},
            "prompt_ids": [p.id for p in prompts],
            "prompt_sha256": {
                p.id: prompt_sha256(p, effective_max_tokens(p, sampling, max_tokens)) for p in prompts
            },
            "sampling": sampling.model_dump(mode="json"),
            "max_tokens": max_tokens,
            "greedy": sampling.greedy,
            "endpoint": "chat",
            "sequential": True,
            "requests": {
                "total": len(records),
                "ok": sum(r.ok for r in records),
                "failed": sum(not r.ok for r in records),
                "with_token_ids": sum(r.token_ids is not None for r in records),
            },
            "warnings": warnings,
            "speculation": speculation,
            "deployment": deployment.to_json(),
            "tool": tool_facts(),
            "host": host_facts(),
            "started_utc": started_utc,
            "ended_utc": utc_now(),
            "wall_s": round(wall_s, 3),
        }
    )
    return write_capture_artifact(final, meta, [output_row(r) for r in records])


def capture(deployment: Deployment, corpus: Corpus, **options: Any) -> Path:
    """Capture `corpus` (its first `limit` prompts) on a ready deployment, one request at a time, and write
    RAW/<campaign>/captures/<capture_id>/. Returns that directory.

    `options` are capture_async's keywords (sampling, raw_campaign_dir, capture_id and campaign_id are
    required). Refuses non-greedy sampling unless `allow_sampling` (a deliberately lossy capture for testing
    the gate). Failed requests are kept as failed rows with their reason; the artifact is written either way."""
    return asyncio.run(capture_async(deployment, corpus, **options))
