"""The decision loop's documents (artifacts.documents.decisions, migration 0015): two kinds of single files,
each written once under the verification campaign:

- decisions/<decision_id>[.rev<n>].json (DecisionDocument, analysis.verification) into `decisions`, one row per
  revision of a recommendation's verdict, and `decision_loads`, one row per measured load (DECISIONS_KIND);
- promotions/<decision_id>.json (PromotionDocument, tasks.promote) into `promotions`, a person's answer to
  that decision (PROMOTIONS_KIND).

The verification's cells are ordinary cells, in `cells`; `v_decision` joins the three tables."""

from __future__ import annotations

import pandera.polars as pa
import polars as pl
from pandera.api.polars.types import PolarsData

from artifacts import ids, layout
from artifacts.documents import OUTCOMES, DecisionDocument, PromotionDocument, utc_datetime
from artifacts.documents.decisions import VALIDITY
from warehouse.errors import ArtifactInvalid
from warehouse.frames import Files, canonical_json, document, to_frame
from warehouse.kinds.base import check_place, file_document, file_kind, placed
from warehouse.kinds.columns import Tool, main_table, placed_columns, source_columns, tool_columns
from warehouse.models import Strict

VIA = ["prefect-ui", "cli"]  # how a promotion was answered (PromotionDocument.via)
_NAME = {"str_length": {"min_value": 1}}


def _interval_holds(estimate: str, low: str, high: str) -> pl.Expr:
    """No interval, or one whose bounds are both there and hold the estimate (with rounding slack). Never
    null: a null check result would pass, so a lone bound or a bound without its estimate must be false."""
    holds = (pl.col(low) <= pl.col(estimate) + 1e-12) & (pl.col(estimate) <= pl.col(high) + 1e-12)
    return (pl.col(low).is_null() & pl.col(high).is_null()) | holds.fill_null(False)


@main_table("decision", last=(Tool,))
class DecisionModel(pa.DataFrameModel):
    source_campaign_id: pl.String = pa.Field(**_NAME)
    workload: pl.String = pa.Field(**_NAME)
    family: pl.String = pa.Field(**_NAME)
    method: pl.String = pa.Field(**_NAME)
    schedule: pl.String = pa.Field()
    speculative_config: pl.String = pa.Field(nullable=True)
    variant: pl.String = pa.Field(nullable=True)
    target: pl.String = pa.Field()
    verification_spec: pl.String = pa.Field()  # "": nothing launched (speculation off at every load)
    fixed_k: pl.Int32 = pa.Field(ge=0)
    tolerance: pl.Float64 = pa.Field(ge=0, lt=1)
    confidence: pl.Float64 = pa.Field(gt=0, lt=1)
    outcome: pl.String = pa.Field(isin=list(OUTCOMES))
    gate_passed: pl.Boolean = pa.Field(nullable=True)
    gate_claim: pl.String = pa.Field(nullable=True)
    summary: pl.String = pa.Field()
    caveats: pl.String = pa.Field()
    created_utc: pl.Datetime = pa.Field(nullable=True)
    # migration 0024
    revision: pl.Int32 = pa.Field(ge=1)
    validity: pl.String = pa.Field(nullable=True, isin=list(VALIDITY))
    validity_reasons: pl.String = pa.Field()
    # migration 0025
    choice: pl.String = pa.Field()
    choice_reason: pl.String = pa.Field()
    traffic: pl.String = pa.Field()
    options: pl.String = pa.Field()
    # migration 0026
    launches: pl.Int32 = pa.Field(nullable=True, ge=1)
    max_launches: pl.Int32 = pa.Field(nullable=True, ge=1)

    Config = Strict


class DecisionLoadModel(pa.DataFrameModel):
    decision_key: pl.String = pa.Field()
    concurrency: pl.Int32 = pa.Field(ge=1)
    batch_from: pl.Int32 = pa.Field(ge=1)  # vLLM's ranges start at batch size 1
    batch_to: pl.Int32 = pa.Field(ge=1)
    k: pl.Int32 = pa.Field(ge=0)
    claim: pl.String = pa.Field(**_NAME)
    sweep_speedup: pl.Float64 = pa.Field(nullable=True, gt=0)
    sweep_interval: pl.String = pa.Field()
    over_plain: pl.Float64 = pa.Field(nullable=True, gt=0)
    over_plain_low: pl.Float64 = pa.Field(nullable=True, gt=0)
    over_plain_high: pl.Float64 = pa.Field(nullable=True, gt=0)
    over_plain_interval: pl.String = pa.Field()
    n_repeats: pl.Int32 = pa.Field(ge=0)
    over_fixed: pl.Float64 = pa.Field(nullable=True, gt=0)
    over_fixed_low: pl.Float64 = pa.Field(nullable=True, gt=0)
    over_fixed_high: pl.Float64 = pa.Field(nullable=True, gt=0)
    outcome: pl.String = pa.Field(isin=list(OUTCOMES))
    reason: pl.String = pa.Field(**_NAME)

    @pa.dataframe_check(error="batch_to: a load's range runs from batch_from up to batch_to (inclusive)")
    def range_is_ordered(cls, data: PolarsData) -> pl.LazyFrame:
        return data.lazyframe.select(pl.col("batch_from") <= pl.col("batch_to"))

    @pa.dataframe_check(
        error="over_plain_low: the interval must hold its estimate (low <= over_plain <= high)"
    )
    def over_plain_interval_holds(cls, data: PolarsData) -> pl.LazyFrame:
        return data.lazyframe.select(_interval_holds("over_plain", "over_plain_low", "over_plain_high"))

    @pa.dataframe_check(
        error="over_fixed_low: the interval must hold its estimate (low <= over_fixed <= high)"
    )
    def over_fixed_interval_holds(cls, data: PolarsData) -> pl.LazyFrame:
        return data.lazyframe.select(_interval_holds("over_fixed", "over_fixed_low", "over_fixed_high"))

    @pa.dataframe_check(error="concurrency: a decision measures each load once")
    def one_row_per_load(cls, data: PolarsData) -> pl.LazyFrame:
        return data.lazyframe.select(~pl.struct("decision_key", "concurrency").is_duplicated())

    Config = Strict


@main_table("promotion", id_column="decision_id", last=(Tool,))
class PromotionModel(pa.DataFrameModel):
    approved: pl.Boolean = pa.Field()
    approver: pl.String = pa.Field(**_NAME)
    note: pl.String = pa.Field()
    via: pl.String = pa.Field(isin=VIA)
    speculative_config: pl.String = pa.Field(nullable=True)
    vllm_args: pl.String = pa.Field()
    files: pl.String = pa.Field()
    decided_utc: pl.Datetime = pa.Field()
    # migration 0024
    decision_revision: pl.Int32 = pa.Field(ge=1)
    override: pl.String = pa.Field()

    Config = Strict


def decision_frames(
    source_path: str, campaign_id: str, decision_id: str, files: Files, sha256: str
) -> dict[str, pl.DataFrame]:
    """One decision file (`decision_id`: its name, with the revision's suffix) as its `decisions` row and
    `decision_loads` rows (pure: no database)."""
    name = f"{decision_id}.json"
    base_id, revision = ids.parse_decision_revision(decision_id)
    doc = document(files, name, DecisionDocument)
    check_place(name, doc, decision_id=base_id, revision=revision, campaign_id=campaign_id)
    for i, entry in enumerate(doc.schedule):
        if len(entry) != 3 or not 1 <= entry[0] <= entry[1] or entry[2] < 0:
            raise ArtifactInvalid(
                f"expected [batch_from, batch_to, k], 1 <= batch_from <= batch_to, k >= 0; got {entry}",
                file=name,
                column=f"schedule[{i}]",
            )
    if doc.outcome == "confirmed":  # confirmed means confirmed at every load (analysis.recommend.overall)
        unconfirmed = [load.concurrency for load in doc.loads if load.outcome != "confirmed"]
        if not doc.loads or unconfirmed:
            why = (
                f"not at concurrency {', '.join(map(str, unconfirmed))}" if unconfirmed else "it has no load"
            )
            raise ArtifactInvalid(
                f"a decision is confirmed only when every load is: {why}",
                file=name,
                column="outcome",
            )
    key = f"{campaign_id}/{decision_id}"
    row = {
        **placed_columns("decision", campaign_id, decision_id),
        "decision_id": base_id,  # the key keeps the revision's suffix: one row per revision
        "revision": revision,
        "validity": doc.validity,
        "validity_reasons": doc.validity_reasons,
        "source_campaign_id": doc.source_campaign_id,
        "workload": doc.workload,
        "family": doc.family,
        "method": doc.method,
        "schedule": canonical_json(doc.schedule),
        "speculative_config": None
        if doc.speculative_config is None
        else canonical_json(doc.speculative_config),
        "variant": None if doc.variant is None else canonical_json(doc.variant),
        "target": canonical_json(doc.target),
        "verification_spec": doc.verification_spec,
        "fixed_k": doc.fixed_k,
        "tolerance": doc.tolerance,
        "confidence": doc.confidence,
        "outcome": doc.outcome,
        "gate_passed": doc.gate_passed,
        "gate_claim": doc.gate_claim,
        "summary": doc.summary,
        "caveats": canonical_json(doc.caveats),
        "choice": doc.choice,
        "choice_reason": doc.choice_reason,
        "traffic": doc.traffic,
        "options": canonical_json([option.model_dump(mode="json") for option in doc.options]),
        "launches": doc.launches,
        "max_launches": doc.max_launches,
        "created_utc": utc_datetime(doc.created_utc),
        **tool_columns(doc.tool),
        **source_columns(source_path, sha256),
    }
    columns = set(DecisionLoadModel.to_schema().columns) - {"decision_key"}
    loads = [{"decision_key": key, **load.model_dump(include=columns)} for load in doc.loads]
    return {
        "decisions": to_frame(DecisionModel, [row]),
        "decision_loads": to_frame(DecisionLoadModel, loads),
    }


def promotion_frames(
    source_path: str, campaign_id: str, decision_id: str, files: Files, sha256: str
) -> dict[str, pl.DataFrame]:
    """One promotion file as its `promotions` row (pure: no database)."""
    doc = file_document(files, PromotionDocument, campaign_id, decision_id, "decision_id")
    row = {
        **placed_columns("promotion", campaign_id, decision_id, id_column="decision_id"),
        "approved": doc.approved,
        "approver": doc.approver,
        "note": doc.note,
        "via": doc.via,
        "speculative_config": None
        if doc.speculative_config is None
        else canonical_json(doc.speculative_config),
        "vllm_args": canonical_json(doc.vllm_args),
        "files": canonical_json(doc.files),
        "decided_utc": utc_datetime(doc.decided_utc),
        "decision_revision": doc.decision_revision,
        "override": doc.override,
        **tool_columns(doc.tool),
        **source_columns(source_path, sha256),
    }
    return {"promotions": to_frame(PromotionModel, [row])}


DECISIONS_KIND = file_kind(
    name="decisions",
    table="decisions",
    key_column="decision_key",
    found=layout.decision_files,
    frames=placed(decision_frames),
    models={"decisions": DecisionModel, "decision_loads": DecisionLoadModel},
    sources={"decision_loads": "loads"},
)

PROMOTIONS_KIND = file_kind(
    name="promotions",
    table="promotions",
    key_column="promotion_key",
    found=layout.promotion_files,
    frames=placed(promotion_frames),
    models={"promotions": PromotionModel},
)
