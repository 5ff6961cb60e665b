"""Gate verdicts (gates/<verdict_id>.json: artifacts.documents.GateVerdictDocument) into `gate_verdicts`
(migration 0002). A verdict is a single immutable file in a folder shared with the campaign's other verdicts:
each is read and hashed on its own (`files` is a function of the ref)."""

from __future__ import annotations

from typing import Any

import pandera.polars as pa
import polars as pl

from artifacts import layout
from artifacts.documents import GateVerdictDocument, utc_datetime
from warehouse.errors import ArtifactInvalid
from warehouse.frames import Files, canonical_json, document, to_frame
from warehouse.kinds.base import check_place, file_kind, placed
from warehouse.kinds.columns import (
    Tool,
    main_table,
    optional_fields,
    placed_columns,
    source_columns,
    tool_columns,
)
from warehouse.models import Strict

OUTCOMES = ["consistent", "diverged", "incomplete"]
CONTROL_KINDS = ["same_deployment", "cross_deployment"]


@main_table("verdict", last=(Tool,))
class GateVerdictModel(pa.DataFrameModel):
    treatment_variant: pl.String = pa.Field(str_length={"min_value": 1})
    treatment_capture_a: pl.String = pa.Field(str_length={"min_value": 1})
    treatment_capture_b: pl.String = pa.Field(str_length={"min_value": 1})
    treatment_deployment_a: pl.String = pa.Field(nullable=True)
    treatment_deployment_b: pl.String = pa.Field(nullable=True)
    control_pairs: pl.List(pl.String) = pa.Field()
    control_kinds: pl.List(pl.String) = pa.Field()
    controls: pl.String = pa.Field()
    n_prompts: pl.Int32 = pa.Field(gt=0)
    outcome: pl.String = pa.Field(isin=OUTCOMES)
    passed: pl.Boolean = pa.Field()
    claim: pl.String = pa.Field(str_length={"min_value": 1})
    failed_checks: pl.List(pl.String) = pa.Field()
    exact_match_rate: pl.Float64 = pa.Field(nullable=True, ge=0, le=1)
    envelope_exact_match_min: pl.Float64 = pa.Field(nullable=True, ge=0, le=1)
    mean_prefix_fraction: pl.Float64 = pa.Field(nullable=True, ge=0, le=1)
    mean_edit_distance: pl.Float64 = pa.Field(nullable=True, ge=0, le=1)
    median_first_divergence: pl.Float64 = pa.Field(nullable=True, ge=0)
    alpha: pl.Float64 = pa.Field(nullable=True, gt=0, lt=1)
    min_prompts: pl.Int32 = pa.Field(nullable=True, ge=0)
    forced: pl.Boolean = pa.Field(nullable=True)
    checks: pl.String = pa.Field()
    envelope: pl.String = pa.Field(nullable=True)
    per_stratum: pl.String = pa.Field(nullable=True)
    created_utc: pl.Datetime = pa.Field(nullable=True)

    @pa.dataframe_check(error="passed: a verdict passes exactly when its outcome is 'consistent'")
    def passed_matches_outcome(cls, data: Any) -> pl.LazyFrame:
        return data.lazyframe.select(pl.col("passed") == (pl.col("outcome") == "consistent"))

    @pa.dataframe_check(error="control_kinds: a verdict needs a cross-deployment control")
    def has_cross_deployment_control(cls, data: Any) -> pl.LazyFrame:
        return data.lazyframe.select(pl.col("control_kinds").list.contains("cross_deployment"))

    Config = Strict


def verdict_frames(
    source_path: str, campaign_id: str, verdict_id: str, files: Files, sha256: str
) -> dict[str, pl.DataFrame]:
    """One verdict file as the gate_verdicts row (pure: no database)."""
    name = f"{verdict_id}.json"
    doc = document(files, name, GateVerdictDocument)
    if doc.verdict_id != verdict_id:
        raise ArtifactInvalid(
            f"{doc.verdict_id!r} does not match its file name ({name})", file=name, column="verdict_id"
        )
    check_place(name, doc, "its campaign directory", campaign_id=campaign_id)
    pairs, kinds = [], []
    for i, control in enumerate(doc.controls):
        if control.kind not in CONTROL_KINDS:
            raise ArtifactInvalid(
                f"unknown control kind {control.kind!r}", file=name, column=f"controls[{i}].kind"
            )
        kinds.append(control.kind)
        pairs.append(f"{control.a.capture_id} vs {control.b.capture_id} ({control.kind})")
    failed = [str(c.get("name")) for c in doc.checks if c.get("passed") is False]
    overall, rule = doc.treatment.overall, doc.rule
    envelope = doc.envelope.exact_match_rate if doc.envelope else None
    row: dict[str, Any] = {
        **placed_columns("verdict", campaign_id, verdict_id),
        "treatment_variant": doc.treatment_variant,
        "treatment_capture_a": doc.treatment.a.capture_id,
        "treatment_capture_b": doc.treatment.b.capture_id,
        "treatment_deployment_a": doc.treatment.a.deployment_id,
        "treatment_deployment_b": doc.treatment.b.deployment_id,
        "control_pairs": pairs,
        "control_kinds": kinds,
        "controls": canonical_json([c.as_written() for c in doc.controls]),
        "n_prompts": doc.n_prompts,
        "outcome": doc.outcome,
        "passed": doc.passed,
        "claim": doc.claim,
        "failed_checks": failed,
        "exact_match_rate": overall.exact_match_rate if overall else None,
        "envelope_exact_match_min": envelope.min if envelope else None,
        **optional_fields(overall, "mean_prefix_fraction", "mean_edit_distance", "median_first_divergence"),
        **optional_fields(rule, "alpha", "min_prompts", "forced"),
        "checks": canonical_json(doc.checks),
        "envelope": None if doc.envelope is None else canonical_json(doc.envelope),
        "per_stratum": None if doc.per_stratum is None else canonical_json(doc.per_stratum),
        "created_utc": utc_datetime(doc.created_utc),
        **tool_columns(doc.tool),
        **source_columns(source_path, sha256),
    }
    return {"gate_verdicts": to_frame(GateVerdictModel, [row])}


KIND = file_kind(
    name="gate",
    table="gate_verdicts",
    key_column="verdict_key",
    found=layout.verdict_files,
    frames=placed(verdict_frames),
    models={"gate_verdicts": GateVerdictModel},
)
