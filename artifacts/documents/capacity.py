"""Capacity searches: capacity/<search_id>.json (CapacitySearchDocument), every point of the search."""

from __future__ import annotations

from typing import Any

from artifacts.documents.base import Document, Flag, Number, Text, Time, Whole
from artifacts.documents.blocks import ToolFacts, VariantFacts
from artifacts.documents.cells import WorkloadFacts


class SearchBound(Document):
    """One metric's quantile at a search point (tasks.capacity.Bound): observed, its order-statistic
    confidence bounds (null: too few requests for that side), the limit and the verdict."""

    observed: Number | None = None
    lower: Number | None = None
    upper: Number | None = None
    limit: Number
    verdict: Text  # met | violated | undecided


class SearchPoint(Document):
    rate: Number
    cell_id: Text
    requests: Whole
    failed: Whole
    achieved_rps: Number | None = None
    goodput_rps: Number | None = None
    ttft: SearchBound
    tpot: SearchBound
    status: Text
    verdict: Text  # met | violated | undecided


class SearchLimits(Document):
    ttft_s: Number
    tpot_s: Number
    quantile: Number
    confidence: Number


class CapacitySearchDocument(Document):
    """capacity/<search_id>.json, written once by tasks.capacity.search_deployment: a deployment's capacity
    search under the spec's p99 limits, every point in the order it ran (each point also a cell)."""

    search_id: Text
    campaign_id: Text
    deployment_id: Text
    variant: VariantFacts
    repeat: Whole
    workload: WorkloadFacts
    sampling: dict[str, Any] | None = None
    requests_per_point: Whole
    warmup_per_point: Whole
    limits: SearchLimits
    settings: dict[str, Any]
    capacity_rps: Number | None = None
    first_failing_rps: Number | None = None
    converged: Flag
    stopped_because: Text
    points: list[SearchPoint]
    tool: ToolFacts | None = None
    started_utc: Time | None = None
    ended_utc: Time | None = None
