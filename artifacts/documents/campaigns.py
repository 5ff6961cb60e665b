"""Campaigns: campaign.json (CampaignRecord, with the spec's facts and the planned deployment slots) and
runs/<stamp>-<pid>-<nn>.json, one per finished run (RunRecord)."""

from __future__ import annotations

from typing import Any

from artifacts.documents.base import Configuration, Document, Number, Text, Time, Whole
from artifacts.documents.blocks import HostFacts, ToolFacts


class SloFacts(Document):
    ttft_p99_s: Number | None = None
    tpot_p99_s: Number | None = None


class SpecFacts(Configuration):
    """experiments.spec.ExperimentSpec as JSON: every field kept; these few are read by the warehouse."""

    name: Text | None = None
    repeats: Whole | dict[str, Any] | None = None  # a count, or adaptive {min, max, target_halfwidth}
    slo: SloFacts | None = None

    @property
    def max_repeats(self) -> int | None:
        """Repeat blocks planned: the count, or the adaptive rule's maximum."""
        return self.repeats.get("max") if isinstance(self.repeats, dict) else self.repeats


class PlannedSlot(Document):
    """One deployment slot of the plan (experiments.plan.DeploymentPlan)."""

    slot: Text
    variant: Text
    repeat: Whole
    role: Text  # arm | control
    position: Whole
    cells: list[Text]
    captures: list[Text]


class ImportFacts(Document):
    """Where an imported campaign came from (tasks.imports): the campaign was not run by specgauge but
    translated from another harness's results. `source`: the study (e.g. a GitHub repository),
    `path`: the results folder read, `importer` and `importer_version`: the translation that wrote it."""

    source: Text
    path: Text
    importer: Text
    importer_version: Text
    source_commit: Text | None = None
    imported_utc: Time | None = None


class CampaignRecord(Configuration):
    """campaign.json, written once by tasks.campaign_state.record_campaign. `variant_order`: the variants in
    launch order, one list per repeat (randomised by the spec's seed). It has no status: each finished run
    adds a RunRecord, and the warehouse derives the status from the latest (docs/warehouse.md). `imported`:
    set only on a campaign translated from another harness's results (tasks.imports); absent otherwise.
    """

    campaign_id: Text
    name: Text | None = None
    label: Text | None = None
    spec_sha256: Text | None = None
    spec: SpecFacts
    variant_order: list[list[Text]] | None = None
    deployments: list[PlannedSlot] | None = None
    created_utc: Time
    tool: ToolFacts | None = None
    host: HostFacts | None = None
    imported: ImportFacts | None = None


class RunRecord(Configuration):
    """runs/<stamp>-<pid>-<nn>.json, one per finished run of the campaign (tasks.campaign_state.record_run).
    `failed_cells`: the cells that did not end ok in that run (cell id -> status; older records: a list)."""

    campaign_id: Text | None = None
    started_utc: Time | None = None
    ended_utc: Time | None = None
    deployments: list[Any] | None = None
    failed_cells: dict[str, Any] | list[Any] | None = None
    tool: ToolFacts | None = None
    host: HostFacts | None = None
