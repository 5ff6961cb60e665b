"""Gate verdicts (gates/<verdict_id>.json: artifacts.documents.GateVerdictDocument) into `gate_verdicts`
(migration 0002). A verdict is a single immutable file in a folder shared with the campaign's other verdicts:
each is read and hashed on its own (`files` is a function of the ref)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandera.polars as pa
import polars as pl

from artifacts import layout
from artifacts.documents import GateVerdictDocument, utc_datetime
from warehouse.errors import ArtifactInvalid
from warehouse.frames import Files, canonical_json, document, table_schema
from warehouse.kinds.base import ArtifactKind, ArtifactRef, file_refs
from warehouse.models import Strict

OUTCOMES = ["consistent", "diverged", "incomplete"]
CONTROL_KINDS = ["same_deployment", "cross_deployment"]


class GateVerdictModel(pa.DataFrameModel):
    verdict_key: pl.String = pa.Field(unique=True)
    verdict_id: pl.String = pa.Field(str_length={"min_value": 1})
    campaign_id: pl.String = pa.Field(str_length={"min_value": 1})
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
    specgauge_version: pl.String = pa.Field(nullable=True)
    git_revision: pl.String = pa.Field(nullable=True)
    source_path: pl.String = pa.Field()
    sha256: pl.String = pa.Field(str_length={"min_value": 64, "max_value": 64})

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
    if doc.campaign_id != campaign_id:
        raise ArtifactInvalid(
            f"{doc.campaign_id!r} does not match its campaign directory ({campaign_id!r})",
            file=name,
            column="campaign_id",
        )
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
        "verdict_key": f"{campaign_id}/{verdict_id}",
        "verdict_id": verdict_id,
        "campaign_id": campaign_id,
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
        "mean_prefix_fraction": overall.mean_prefix_fraction if overall else None,
        "mean_edit_distance": overall.mean_edit_distance if overall else None,
        "median_first_divergence": overall.median_first_divergence if overall else None,
        "alpha": rule.alpha if rule else None,
        "min_prompts": rule.min_prompts if rule else None,
        "forced": rule.forced if rule else None,
        "checks": canonical_json(doc.checks),
        "envelope": None if doc.envelope is None else canonical_json(doc.envelope),
        "per_stratum": None if doc.per_stratum is None else canonical_json(doc.per_stratum),
        "created_utc": utc_datetime(doc.created_utc),
        "specgauge_version": doc.tool.specgauge_version if doc.tool else None,
        "git_revision": doc.tool.git_revision if doc.tool else None,
        "source_path": source_path,
        "sha256": sha256,
    }
    return {"gate_verdicts": pl.DataFrame([row], schema=table_schema(GateVerdictModel), orient="row")}


def _discover(campaign_dir: Path, prefix: str) -> Iterator[ArtifactRef]:
    # a verdict being written has a temporary '.' name: layout.verdict_files leaves it out
    return file_refs("gate", layout.verdict_files(campaign_dir), campaign_dir, prefix)


KIND = ArtifactKind(
    name="gate",
    table="gate_verdicts",
    key_column="verdict_key",
    discover=_discover,
    frames=lambda ref, files, sha: verdict_frames(ref.source_path, ref.campaign_id, ref.name, files, sha),
    models={"gate_verdicts": GateVerdictModel},
    files=lambda ref: (f"{ref.name}.json",),  # the gates folder holds every verdict of the campaign
)
