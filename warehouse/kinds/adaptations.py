"""Adaptation confirmations (adaptations/<adaptation_id>.json: artifacts.documents.AdaptationDocument, written
once by tasks.adapt.write_adaptation) into `adaptations`, one row per confirmation, `adaptation_comparisons`
(new head against old per stratum, load and metric) and `adaptation_verdicts` (the benefit rule per stratum
and load) (migration 0012). The confirmation's cells are ordinary cells, in `cells`."""

from __future__ import annotations

import pandera.polars as pa
import polars as pl
from pandera.api.polars.types import PolarsData

from artifacts import layout
from artifacts.documents import AdaptationDocument, utc_datetime
from warehouse.frames import Files, canonical_json, to_frame
from warehouse.kinds.base import file_document, file_kind, placed
from warehouse.kinds.columns import RunTimes, Tool, main_table, placed_columns, source_columns, tool_columns
from warehouse.models import Strict

METRICS = ["mean_acceptance_length", "throughput", "tpot_p50"]
_SHA = {"nullable": True, "str_length": {"min_value": 64, "max_value": 64}}


@main_table("adaptation", last=(RunTimes, Tool))
class AdaptationModel(pa.DataFrameModel):
    deployment_id: pl.String = pa.Field(str_length={"min_value": 1})
    variant: pl.String = pa.Field(str_length={"min_value": 1})
    target_stratum: pl.String = pa.Field(str_length={"min_value": 1})
    strata: pl.String = pa.Field()
    loads: pl.String = pa.Field()
    repeats: pl.Int32 = pa.Field(ge=1)
    seed: pl.Int32 = pa.Field()
    min_effect: pl.Float64 = pa.Field(ge=0)
    max_harm: pl.Float64 = pa.Field(ge=0, lt=1)
    confidence: pl.Float64 = pa.Field(gt=0, lt=1)
    gain_metric: pl.String = pa.Field(isin=METRICS)
    old_path: pl.String = pa.Field()
    old_sha256: pl.String = pa.Field(**_SHA)
    new_path: pl.String = pa.Field()
    new_sha256: pl.String = pa.Field(**_SHA)
    new_drafter_id: pl.String = pa.Field(nullable=True)
    n_blocks: pl.Int32 = pa.Field(ge=0)
    n_swaps: pl.Int32 = pa.Field(ge=0)
    swapped_back: pl.Boolean = pa.Field()
    final_sha256: pl.String = pa.Field(**_SHA)
    gate_verdict_id: pl.String = pa.Field(nullable=True)
    gate_passed: pl.Boolean = pa.Field(nullable=True)
    gate_outcome: pl.String = pa.Field(nullable=True)
    gate_claim: pl.String = pa.Field(nullable=True)
    adopt_strata: pl.String = pa.Field()
    summary: pl.String = pa.Field()
    status: pl.String = pa.Field(isin=["ok", "failed"])
    error: pl.String = pa.Field(nullable=True)

    @pa.dataframe_check(error="swapped_back: the old head must serve again at the end (final_sha256 = old)")
    def swapped_back_means_old(cls, data: PolarsData) -> pl.LazyFrame:
        return data.lazyframe.select(
            ~pl.col("swapped_back")
            | pl.col("final_sha256").is_null()
            | pl.col("old_sha256").is_null()
            | (pl.col("final_sha256") == pl.col("old_sha256"))
        )

    Config = Strict


class _NewOverOld(pa.DataFrameModel):
    """The columns a comparison and a verdict share: where (stratum, load) and new over old with its
    interval over repeats."""

    adaptation_key: pl.String = pa.Field()
    stratum: pl.String = pa.Field(str_length={"min_value": 1})
    load_label: pl.String = pa.Field(str_length={"min_value": 1})
    estimate: pl.Float64 = pa.Field(nullable=True, gt=0)
    ci_low: pl.Float64 = pa.Field(nullable=True, gt=0)
    ci_high: pl.Float64 = pa.Field(nullable=True, gt=0)
    n_repeats: pl.Int32 = pa.Field(ge=0)


class AdaptationComparisonModel(_NewOverOld):
    metric: pl.String = pa.Field(isin=METRICS)
    interval: pl.String = pa.Field()
    ratios: pl.String = pa.Field()
    repeats: pl.String = pa.Field()
    old_mean: pl.Float64 = pa.Field(nullable=True)
    new_mean: pl.Float64 = pa.Field(nullable=True)

    @pa.dataframe_check(error="ci_low: the interval must hold its estimate (ci_low <= estimate <= ci_high)")
    def interval_holds_estimate(cls, data: PolarsData) -> pl.LazyFrame:
        return data.lazyframe.select(
            pl.col("ci_low").is_null()
            | (
                (pl.col("ci_low") <= pl.col("estimate") + 1e-12)
                & (pl.col("estimate") <= pl.col("ci_high") + 1e-12)
            )
        )

    Config = Strict


class AdaptationVerdictModel(_NewOverOld):
    target: pl.Boolean = pa.Field()
    gain_metric: pl.String = pa.Field(isin=METRICS)
    harm_ok: pl.Boolean = pa.Field()
    worst_other: pl.String = pa.Field(nullable=True)
    success_ok: pl.Boolean = pa.Field()
    gate_passed: pl.Boolean = pa.Field(nullable=True)
    adopt: pl.Boolean = pa.Field()
    reason: pl.String = pa.Field(str_length={"min_value": 1})

    @pa.dataframe_check(error="adopt: a stratum is adopted only with no harm, success and a passed gate")
    def adopt_needs_every_condition(cls, data: PolarsData) -> pl.LazyFrame:
        return data.lazyframe.select(
            ~pl.col("adopt")
            | (pl.col("harm_ok") & pl.col("success_ok") & pl.col("gate_passed").fill_null(False))
        )

    Config = Strict


def adaptation_frames(
    source_path: str, campaign_id: str, adaptation_id: str, files: Files, sha256: str
) -> dict[str, pl.DataFrame]:
    """One adaptation file as its three tables' rows (pure: no database)."""
    doc = file_document(files, AdaptationDocument, campaign_id, adaptation_id, "adaptation_id")
    key = f"{campaign_id}/{adaptation_id}"
    gate = doc.gate
    row = {
        **placed_columns("adaptation", campaign_id, adaptation_id),
        "deployment_id": doc.deployment_id,
        "variant": doc.variant,
        "target_stratum": doc.target_stratum,
        "strata": canonical_json(doc.strata),
        "loads": canonical_json(doc.loads),
        "repeats": doc.repeats,
        "seed": doc.seed,
        "min_effect": doc.min_effect,
        "max_harm": doc.max_harm,
        "confidence": doc.confidence,
        "gain_metric": doc.gain_metric,
        "old_path": doc.old_head.path,
        "old_sha256": doc.old_head.sha256,
        "new_path": doc.new_head.path,
        "new_sha256": doc.new_head.sha256,
        "new_drafter_id": doc.new_head.drafter_id,
        "n_blocks": len(doc.schedule),
        "n_swaps": len(doc.swaps),
        "swapped_back": doc.swapped_back,
        "final_sha256": doc.final_sha256,
        "gate_verdict_id": gate.verdict_id if gate else None,
        "gate_passed": gate.passed if gate else None,
        "gate_outcome": gate.outcome if gate else None,
        "gate_claim": (gate.claim or gate.error) if gate else None,
        "adopt_strata": canonical_json(doc.adopt_strata),
        "summary": doc.summary,
        "status": doc.status,
        "error": doc.error,
        "started_utc": utc_datetime(doc.started_utc),
        "ended_utc": utc_datetime(doc.ended_utc),
        **tool_columns(doc.tool),
        **source_columns(source_path, sha256),
    }
    comparisons = [
        {
            "adaptation_key": key,
            **c.model_dump(
                include=set(AdaptationComparisonModel.to_schema().columns) - {"ratios", "repeats"}
            ),
            "ratios": canonical_json(c.ratios),
            "repeats": canonical_json(c.repeats),
        }
        for c in doc.comparisons
    ]
    verdicts = [
        {"adaptation_key": key, **v.model_dump(include=set(AdaptationVerdictModel.to_schema().columns))}
        for v in doc.verdicts
    ]
    return {
        "adaptations": to_frame(AdaptationModel, [row]),
        "adaptation_comparisons": to_frame(AdaptationComparisonModel, comparisons),
        "adaptation_verdicts": to_frame(AdaptationVerdictModel, verdicts),
    }


KIND = file_kind(
    name="adaptations",
    table="adaptations",
    key_column="adaptation_key",
    found=layout.adaptation_files,
    frames=placed(adaptation_frames),
    models={
        "adaptations": AdaptationModel,
        "adaptation_comparisons": AdaptationComparisonModel,
        "adaptation_verdicts": AdaptationVerdictModel,
    },
    sources={"adaptation_comparisons": "comparisons", "adaptation_verdicts": "verdicts"},
)
