"""Gate verdicts: gates/<verdict_id>.json (GateVerdictDocument): a speculative variant's greedy captures
against plain's, judged against the controls."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from artifacts.documents.base import Document, Flag, Number, Text, Time, Whole
from artifacts.documents.blocks import ToolFacts


class CaptureRef(Document):
    capture_id: Text
    campaign_id: Text | None = None
    deployment_id: Text | None = None
    variant: Text | None = None
    path: Text | None = None


class Agreement(Document):
    """How two captures agree (tasks.gate.Aggregate): the figures the warehouse keeps."""

    exact_match_rate: Number | None = None
    mean_prefix_fraction: Number | None = None
    mean_edit_distance: Number | None = None
    median_first_divergence: Number | None = None


class ComparedPair(Document):
    a: CaptureRef
    b: CaptureRef
    overall: Agreement | None = None


class ControlPair(ComparedPair):
    label: Text | None = None
    kind: Text  # same_deployment | cross_deployment


class GateRule(Document):
    alpha: Number | None = None
    min_prompts: Whole | None = None
    forced: Flag | None = None


class Range(Document):
    min: Number | None = None
    max: Number | None = None


class Envelope(Document):
    """Range of each figure over the controls: how far one configuration diverges from itself."""

    exact_match_rate: Range | None = None


class GateVerdictDocument(Document):
    """gates/<verdict_id>.json, written once by tasks.gate.write_verdict (docs/gate.md): a speculative
    variant's greedy outputs against plain's, judged against the controls. `passed` exactly when `outcome`
    is consistent; `checks` each say name, value, threshold and whether they passed."""

    format: Whole | None = None
    verdict_id: Text
    campaign_id: Text
    created_utc: Time | None = None
    tool: ToolFacts | None = None
    treatment_variant: Text
    outcome: Text  # consistent | diverged | incomplete
    passed: Flag
    claim: Text
    rule: GateRule | None = None
    n_prompts: Whole
    sampling: dict[str, Any] | None = None
    treatment: ComparedPair
    controls: list[ControlPair] = Field(min_length=1)
    checks: list[dict[str, Any]]
    envelope: Envelope | None = None
    per_stratum: dict[str, Any] | None = None
    worst_cases: list[Any] | None = None
    notes: list[Any] | None = None
