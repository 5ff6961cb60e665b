"""Adaptation confirmations: adaptations/<adaptation_id>.json (AdaptationDocument): the randomised schedule
of old and new head, the comparisons and the verdict per stratum and load."""

from __future__ import annotations

from artifacts.documents.base import Document, Flag, Number, Text, Time, Whole
from artifacts.documents.blocks import HostFacts, ToolFacts


class HeadFacts(Document):
    """One drafter head of an adaptation: `label` old | new, the path it was loaded from, its content hash
    (specgauge.checkpoints.drafter_digest) and, for a drafter artifact, its id."""

    label: Text
    path: Text
    sha256: Text | None = None
    drafter_id: Text | None = None


class SwapFacts(Document):
    """One hot swap (tasks.drafters.swap.SwapRecord): when, the serving head's hash before and after."""

    at: Time
    old_sha256: Text | None = None
    new_sha256: Text | None = None
    head: Text


class AdaptationBlock(Document):
    """One block of the randomised schedule: `head` served while the stratum's cells ran (one per load);
    `swap` the swap made before it (null: the head was serving already); `serving_sha256` the hash the
    server reported before the cells ran."""

    position: Whole
    repeat: Whole
    head: Text
    stratum: Text
    cells: list[Text]
    statuses: list[Text] | None = None
    swap: SwapFacts | None = None
    serving_sha256: Text | None = None


class AdaptationComparison(Document):
    """New head against old on one stratum, load and metric: the geometric mean of the per-repeat ratios
    (oriented > 1 = better for the new head) with its t interval over repeats (analysis.stats.ratio_interval)."""

    stratum: Text
    load_label: Text
    metric: Text  # mean_acceptance_length | throughput | tpot_p50
    estimate: Number | None = None
    ci_low: Number | None = None
    ci_high: Number | None = None
    n_repeats: Whole
    interval: Text
    ratios: list[Number]
    repeats: list[Whole]
    old_mean: Number | None = None
    new_mean: Number | None = None


class AdaptationVerdict(Document):
    """The benefit rule on one stratum and load (analysis.adaptation.judge): `adopt` when the gain's
    interval lies above 1 + min_effect, no other stratum's gain estimate is below 1 - max_harm, the new
    head's cells all succeeded and the gate after the swap passed; `reason` says why not."""

    stratum: Text
    load_label: Text
    target: Flag
    gain_metric: Text
    estimate: Number | None = None
    ci_low: Number | None = None
    ci_high: Number | None = None
    n_repeats: Whole
    harm_ok: Flag
    worst_other: Text | None = None
    success_ok: Flag
    gate_passed: Flag | None = None
    adopt: Flag
    reason: Text


class AdaptationGate(Document):
    """The greedy-correctness verdict taken with the new head serving (tasks.gate), or why there is none."""

    verdict_id: Text | None = None
    passed: Flag | None = None
    outcome: Text | None = None
    claim: Text | None = None
    plain_campaign_id: Text | None = None
    capture_id: Text | None = None
    error: Text | None = None


class AdaptationDocument(Document):
    """adaptations/<adaptation_id>.json, written once by tasks.adapt.write_adaptation: one deployment's
    confirmation that a swapped-in head pays (docs/adaptation.md). Its cells are ordinary cells of the same
    campaign (ids: artifacts.ids.adapted_cell_id), each carrying the serving head's hash."""

    adaptation_id: Text
    campaign_id: Text
    deployment_id: Text
    variant: Text
    target_stratum: Text
    strata: list[Text]
    loads: list[Text]
    repeats: Whole
    seed: Whole
    min_effect: Number
    max_harm: Number
    confidence: Number
    gain_metric: Text
    old_head: HeadFacts
    new_head: HeadFacts
    schedule: list[AdaptationBlock]
    swaps: list[SwapFacts]
    swapped_back: Flag
    final_sha256: Text | None = None
    gate: AdaptationGate | None = None
    comparisons: list[AdaptationComparison]
    verdicts: list[AdaptationVerdict]
    adopt_strata: list[Text]
    summary: Text
    status: Text  # ok | failed
    error: Text | None = None
    started_utc: Time | None = None
    ended_utc: Time | None = None
    tool: ToolFacts | None = None
    host: HostFacts | None = None
