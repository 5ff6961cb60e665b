"""Correctness under sampling (sampling_checks/<check_id>.json: artifacts.documents.sampling_checks, written
once by analysis.sampling_report.write_check) into `sampling_checks`, one row per check, and
`sampling_check_rows`, one row per arm, prompt and statistic (migration 0019). The samples themselves stay
in the file."""

from __future__ import annotations

from typing import Any

import pandera.polars as pa
import polars as pl

from artifacts import layout
from artifacts.documents import utc_datetime
from artifacts.documents.sampling_checks import SamplingCheckDocument
from warehouse.frames import Files, canonical_json, to_frame
from warehouse.kinds.base import file_document, file_kind, placed
from warehouse.kinds.columns import Tool, main_table, placed_columns, source_columns, tool_columns
from warehouse.models import Strict

OUTCOMES = ["pass", "fail", "inconclusive"]


@main_table("check", last=(Tool,))
class SamplingCheckModel(pa.DataFrameModel):
    treatment_variant: pl.String = pa.Field()
    method: pl.String = pa.Field(nullable=True)
    outcome: pl.String = pa.Field(isin=OUTCOMES)
    passed: pl.Boolean = pa.Field()
    claim: pl.String = pa.Field()
    reasons: pl.List(pl.String) = pa.Field()
    temperature: pl.Float64 = pa.Field(gt=0)
    top_p: pl.Float64 = pa.Field(gt=0, le=1)
    samples: pl.Int32 = pa.Field(gt=0)
    tokens: pl.Int32 = pa.Field(gt=0)
    n_prompts: pl.Int32 = pa.Field(gt=0)
    rejected_prompts: pl.Int32 = pa.Field(ge=0)
    null_rejected_prompts: pl.Int32 = pa.Field(ge=0)
    alpha: pl.Float64 = pa.Field(gt=0, lt=1)
    permutations: pl.Int32 = pa.Field(gt=0)
    max_critical_tv: pl.Float64 = pa.Field(gt=0)
    correction: pl.String = pa.Field()
    deployments: pl.List(pl.String) = pa.Field()  # plain, treatment, plain again
    rule: pl.String = pa.Field()  # JSON
    created_utc: pl.Datetime = pa.Field(nullable=True)

    @pa.dataframe_check(error="passed must be outcome == 'pass'")
    def passed_matches_outcome(cls, data: Any) -> pl.LazyFrame:
        return data.lazyframe.select(pl.col("passed") == (pl.col("outcome") == "pass"))

    Config = Strict


class SamplingCheckRowModel(pa.DataFrameModel):
    check_key: pl.String = pa.Field()
    arm: pl.String = pa.Field(isin=["treatment", "null"])
    prompt_id: pl.String = pa.Field()
    position: pl.Int32 = pa.Field(ge=-1)  # -1: the whole m-token prefix
    tv: pl.Float64 = pa.Field(ge=0, le=1)
    p_value: pl.Float64 = pa.Field(gt=0, le=1)
    critical_tv: pl.Float64 = pa.Field(ge=0, le=1)
    null_tv_mean: pl.Float64 = pa.Field(ge=0, le=1)
    prompt_p_value: pl.Float64 = pa.Field(gt=0, le=1)
    prompt_p_holm: pl.Float64 = pa.Field(nullable=True, gt=0, le=1)
    rejected: pl.Boolean = pa.Field()

    Config = Strict


def check_frames(
    source_path: str, campaign_id: str, check_id: str, files: Files, sha256: str
) -> dict[str, pl.DataFrame]:
    """One check file as its sampling_checks row and sampling_check_rows (pure: no database)."""
    doc = file_document(files, SamplingCheckDocument, campaign_id, check_id, "check_id")
    assert isinstance(doc, SamplingCheckDocument)
    key = f"{campaign_id}/{check_id}"

    def rejected(arm: str) -> int:
        return len({r.prompt_id for r in doc.rows if r.arm == arm and r.rejected})

    row = {
        **placed_columns("check", campaign_id, check_id),
        "treatment_variant": doc.treatment_variant,
        "method": doc.method,
        "outcome": doc.outcome,
        "passed": doc.passed,
        "claim": doc.claim,
        "reasons": list(doc.reasons),
        "temperature": doc.temperature,
        "top_p": doc.top_p,
        "samples": doc.samples,
        "tokens": doc.tokens,
        "n_prompts": len(doc.prompt_ids),
        "rejected_prompts": rejected("treatment"),
        "null_rejected_prompts": rejected("null"),
        "alpha": doc.rule.alpha,
        "permutations": doc.rule.permutations,
        "max_critical_tv": doc.rule.max_critical_tv,
        "correction": doc.rule.correction,
        "deployments": [arm.deployment_id for arm in doc.arms],
        "rule": canonical_json(doc.rule),
        "created_utc": utc_datetime(doc.created_utc),
        **tool_columns(doc.tool),
        **source_columns(source_path, sha256),
    }
    rows = [
        {"check_key": key, **r.model_dump(include=set(SamplingCheckRowModel.to_schema().columns))}
        for r in doc.rows
    ]
    return {
        "sampling_checks": to_frame(SamplingCheckModel, [row]),
        "sampling_check_rows": to_frame(SamplingCheckRowModel, rows),
    }


KIND = file_kind(
    name="sampling_checks",
    table="sampling_checks",
    key_column="check_key",
    found=layout.sampling_check_files,
    frames=placed(check_frames),
    models={"sampling_checks": SamplingCheckModel, "sampling_check_rows": SamplingCheckRowModel},
    sources={"sampling_check_rows": "rows"},
)
