"""The decision loop's documents (flows/decide.py): what was recommended from a sweep, what the launch of that
schedule measured at each load, the verdict, and a person's sign-off. Written once each (artifacts.store):

    RAW/<verification campaign>/decisions/<decision_id>.json      DecisionDocument (analysis.verification)
    RAW/<verification campaign>/promotions/<decision_id>.json     PromotionDocument (tasks.promote)

The warehouse reads them into `decisions`, `decision_loads` and `promotions` (warehouse/kinds/decisions.py,
view `v_decision`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from artifacts import layout
from artifacts.documents.base import Configuration, Document, Flag, Number, Text, Time, Whole
from artifacts.documents.blocks import ToolFacts

Outcome = Literal["confirmed", "refuted", "inconclusive"]
OUTCOMES: tuple[str, ...] = ("confirmed", "refuted", "inconclusive")


class DecisionLoad(Document):
    """One measured load of the verification: what the schedule does there and what the launch showed."""

    concurrency: Whole
    batch_from: Whole  # the schedule's range this load stands for (inclusive)
    batch_to: Whole
    k: Whole  # the schedule's depth in that range; 0: speculation off
    claim: Text  # what the recommendation claims here: "beats plain" (k > 0) or "no worse than plain" (k = 0)
    sweep_speedup: Number | None = (
        None  # the sweep's throughput speedup of the chosen family at its best depth
    )
    sweep_interval: Text = ""
    over_plain: Number | None = (
        None  # the launched schedule's throughput over plain, per-repeat geometric mean
    )
    over_plain_low: Number | None = None
    over_plain_high: Number | None = None
    over_plain_interval: Text = ""
    n_repeats: Whole = 0
    over_fixed: Number | None = None  # the schedule over the best fixed depth, paired per repeat
    over_fixed_low: Number | None = None
    over_fixed_high: Number | None = None
    outcome: Text  # confirmed | refuted | inconclusive
    reason: Text


class DecisionDocument(Configuration):  # a target and variant: redacted when written
    """decisions/<decision_id>.json: one recommendation and its verification (analysis.verification.write_decision)."""

    decision_id: Text
    campaign_id: Text  # the verification campaign (the file lives under it)
    source_campaign_id: Text  # the sweep the recommendation came from
    workload: Text
    family: Text  # method and drafter, e.g. "eagle3 models/twin-eagle3"
    method: Text
    schedule: list[list[Whole]]  # vLLM's num_speculative_tokens_per_batch_size: [[from, to, k], ...]
    speculative_config: dict[str, Any] | None = None  # None: speculation off at every load
    variant: dict[str, Any] | None = None  # the schedule as a spec variant entry (experiments.spec.Variant)
    target: dict[str, Any]  # the spec's target entry (experiments.spec.TargetSpec) it was measured on
    verification_spec: Text  # the verification campaign's spec file (launcher and the rest)
    fixed_k: Whole
    tolerance: Number  # an off range is "no worse than plain" while the schedule keeps above 1 - tolerance
    confidence: Number
    loads: list[DecisionLoad]
    outcome: Text  # confirmed (every load) | refuted (any load) | inconclusive
    gate_passed: Flag | None = None  # the schedule's own greedy-correctness gate in the verification campaign
    gate_claim: Text | None = None
    summary: Text
    caveats: list[Text] = Field(default_factory=list)
    created_utc: Time | None = None
    tool: ToolFacts | None = None


class PromotionDocument(Configuration):  # engine arguments: redacted when written
    """promotions/<decision_id>.json: a person's answer to a decision (tasks.promote.write_promotion); the
    promoted config is what the nightly regression runs. Written once: a new answer needs a new decision."""

    decision_id: Text
    campaign_id: Text
    approved: Flag
    approver: Text
    note: Text = ""
    via: Text  # "prefect-ui" (a paused flow run resumed with input) or "cli"
    speculative_config: dict[str, Any] | None = None
    vllm_args: list[Text] = Field(default_factory=list)
    files: list[Text] = Field(
        default_factory=list
    )  # what was written for the team to deploy, relative to SPECGAUGE_HOME
    decided_utc: Time
    tool: ToolFacts | None = None


def read_decision(raw_dir: Path, decision_id: str) -> tuple[Path, DecisionDocument]:
    """A decision by id, from any campaign's folder under `raw_dir` (InputError when there is none)."""
    from artifacts.store import read_document
    from specgauge.errors import InputError

    found = sorted(Path(raw_dir).glob(f"*/{layout.DECISIONS}/{decision_id}.json"))
    if not found:
        raise InputError(f"no decision {decision_id!r} under {raw_dir}")
    return found[-1], read_document(found[-1], DecisionDocument)
