"""Profiled windows: profiles/<profile_id>/meta.json (ProfileMeta) and breakdown.json (ProfileBreakdown)."""

from __future__ import annotations

from typing import Any

from artifacts.documents.base import Document, Number, Text, Time, Whole
from artifacts.documents.blocks import HostFacts, ToolFacts, VariantFacts
from artifacts.documents.deployments import EngineFacts


class ProfileWorkload(Document):
    file: Text | None = None
    sha256: Text | None = None
    stratum: Text | None = None  # null: every prompt of the file
    prompt_ids: list[Any] | None = None


class ProfileLoad(Document):
    mode: Text | None = None
    concurrency: Whole | None = None
    requests: Whole | None = None


class ProfileRequests(Document):
    total: Whole | None = None
    ok: Whole | None = None
    failed: Whole | None = None


class TraceRef(Document):
    """The engine's trace: a copy inside the artifact (`file`) or, when too large, where it is (`pointer`)."""

    file: Text | None = None
    pointer: Text | None = None
    sha256: Text | None = None
    bytes: Whole | None = None


class ProfileMeta(Document):
    """profiles/<profile_id>/meta.json (tasks.profile.window): one profiled window of one deployment. A
    failed window (`status` failed, `error` says why) has no breakdown.json."""

    format: Whole | None = None
    profile_id: Text
    campaign_id: Text
    deployment_id: Text | None = None
    variant: VariantFacts
    profiler: Text  # torch-profiler | nsys
    workload: ProfileWorkload | None = None
    load: ProfileLoad | None = None
    sampling: dict[str, Any] | None = None
    endpoint: Text | None = None
    deployment: EngineFacts | None = None
    tool: ToolFacts | None = None
    host: HostFacts | None = None
    started_utc: Time | None = None
    window_started_utc: Time | None = None
    window_ended_utc: Time | None = None
    stop_profile_s: Number | None = None
    ended_utc: Time | None = None
    status: Text  # ok | failed
    error: Text | None = None
    requests: ProfileRequests | None = None
    notes: list[Any] | None = None
    trace: TraceRef | None = None


class ProfileCounters(Document):
    drafts: Whole | None = None
    draft_tokens: Whole | None = None
    accepted_tokens: Whole | None = None
    acceptance_rate: Number | None = None
    accepted_per_position: list[Whole] | None = None


class CounterCheck(Document):
    ok: Any = None


class ProfileCrossChecks(Document):
    draft_tokens: CounterCheck | None = None
    drafts: CounterCheck | None = None


class TraceCounts(Document):
    steps: Whole | None = None


class ProfileBreakdown(Document):
    """profiles/<profile_id>/breakdown.json (tasks.profile.breakdown.Breakdown.to_json, docs/profiling.md):
    engine time split into drafting, verification, rejection and other, in `seconds` and in `shares` of
    engine time, with the speculation counters of the window."""

    trace_counts: TraceCounts | None = None
    seconds: dict[str, Number | None] | None = None
    shares: dict[str, Number | None] | None = None
    apportioning: Text | None = None
    counters: ProfileCounters | None = None
    cross_checks: ProfileCrossChecks | None = None
