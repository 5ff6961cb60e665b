"""Gate verdicts (RAW/<campaign>/gates/<verdict_id>.json) into the table gate_verdicts (migration 0002).

Registered with warehouse.ingest (`register_kind`, listed in its KIND_MODULES), so `ingest_raw` and
`specgauge ingest` pick verdicts up with the same hashing, validation, quarantine, ingest log and one
transaction per artifact as every other kind. A verdict is a single immutable file in a folder shared with
the campaign's other verdicts: each is read and hashed on its own (`files` is a function of the ref).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import pandera.polars as pa
import polars as pl

from warehouse import raw
from warehouse.errors import ArtifactInvalid
from warehouse.ingest import ArtifactKind, ArtifactRef, Outcome, ingest_artifacts, register_kind
from warehouse.models import MODELS, Strict

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


MODELS["gate_verdicts"] = GateVerdictModel


def verdict_frames(
    source_path: str, campaign_id: str, verdict_id: str, files: raw.Files, sha256: str
) -> dict[str, pl.DataFrame]:
    """One verdict file as the gate_verdicts row (pure: no database)."""
    name = f"{verdict_id}.json"
    doc = raw.Doc(raw.load_json(files, name), name)
    if doc.text("verdict_id", required=True) != verdict_id:
        raise ArtifactInvalid(
            f"{doc.get('verdict_id')!r} does not match its file name ({name})", file=name, column="verdict_id"
        )
    if doc.text("campaign_id", required=True) != campaign_id:
        raise ArtifactInvalid(
            f"{doc.get('campaign_id')!r} does not match its campaign directory ({campaign_id!r})",
            file=name,
            column="campaign_id",
        )
    controls = doc.get("controls", required=True)
    if not isinstance(controls, list) or not controls:
        raise ArtifactInvalid("expected a non-empty list of control pairs", file=name, column="controls")
    pairs, kinds = [], []
    for i, control in enumerate(controls):
        c = raw.Doc(control if isinstance(control, dict) else None, name, f"controls[{i}].")
        kind = c.text("kind", required=True)
        if kind not in CONTROL_KINDS:
            raise ArtifactInvalid(f"unknown control kind {kind!r}", file=name, column=c.field("kind"))
        kinds.append(kind)
        pairs.append(
            f"{c.text('a.capture_id', required=True)} vs {c.text('b.capture_id', required=True)} ({kind})"
        )
    checks = doc.get("checks", required=True)
    if not isinstance(checks, list):
        raise ArtifactInvalid("expected a list", file=name, column="checks")
    failed = [str(c.get("name")) for c in checks if isinstance(c, dict) and c.get("passed") is False]
    envelope = doc.sub("envelope")
    passed = doc.flag("passed")
    if passed is None:
        raise ArtifactInvalid("required field missing", file=name, column="passed")
    row = {
        "verdict_key": f"{campaign_id}/{verdict_id}",
        "verdict_id": verdict_id,
        "campaign_id": campaign_id,
        "treatment_variant": doc.text("treatment_variant", required=True),
        "treatment_capture_a": doc.text("treatment.a.capture_id", required=True),
        "treatment_capture_b": doc.text("treatment.b.capture_id", required=True),
        "treatment_deployment_a": doc.text("treatment.a.deployment_id"),
        "treatment_deployment_b": doc.text("treatment.b.deployment_id"),
        "control_pairs": pairs,
        "control_kinds": kinds,
        "controls": raw.canonical_json(controls),
        "n_prompts": doc.number("n_prompts", required=True, integer=True),
        "outcome": doc.text("outcome", required=True),
        "passed": passed,
        "claim": doc.text("claim", required=True),
        "failed_checks": failed,
        "exact_match_rate": doc.number("treatment.overall.exact_match_rate"),
        "envelope_exact_match_min": envelope.number("exact_match_rate.min"),
        "mean_prefix_fraction": doc.number("treatment.overall.mean_prefix_fraction"),
        "mean_edit_distance": doc.number("treatment.overall.mean_edit_distance"),
        "median_first_divergence": doc.number("treatment.overall.median_first_divergence"),
        "alpha": doc.number("rule.alpha"),
        "min_prompts": doc.number("rule.min_prompts", integer=True),
        "forced": doc.flag("rule.forced"),
        "checks": raw.canonical_json(checks),
        "envelope": doc.json("envelope"),
        "per_stratum": doc.json("per_stratum"),
        "created_utc": doc.time("created_utc"),
        "specgauge_version": doc.text("tool.specgauge_version"),
        "git_revision": doc.text("tool.git_revision"),
        "source_path": source_path,
        "sha256": sha256,
    }
    return {"gate_verdicts": pl.DataFrame([row], schema=_SCHEMA, orient="row")}


_SCHEMA: dict[str, pl.DataType] = {
    name: column.dtype.type for name, column in GateVerdictModel.to_schema().columns.items()
}


def _discover_gates(campaign_dir: Path, prefix: str) -> Iterator[ArtifactRef]:
    gates = campaign_dir / "gates"
    if not gates.is_dir():
        return
    for path in sorted(gates.glob("*.json")):
        if path.name.startswith("."):
            continue  # a verdict being written (write_json_atomic's temporary name)
        yield ArtifactRef(
            "gate",
            f"{campaign_dir.name}/{path.stem}",
            gates,
            f"{prefix}/gates/{path.name}",
            campaign_dir.name,
            path.stem,
        )


GATE = register_kind(
    ArtifactKind(
        name="gate",
        table="gate_verdicts",
        key_column="verdict_key",
        discover=_discover_gates,
        frames=lambda ref, files, sha: verdict_frames(ref.source_path, ref.campaign_id, ref.name, files, sha),
        files=lambda ref: (f"{ref.name}.json",),  # the gates folder holds every verdict of the campaign
        order=60,  # after captures
    )
)


def ingest_gates(con: duckdb.DuckDBPyConnection, campaign_dir: Path) -> list[Outcome]:
    """Every verdict of one campaign (RAW/<campaign_id>) through a writer connection (warehouse.db.writer)."""
    campaign_dir = Path(campaign_dir)
    return ingest_artifacts(con, GATE, list(_discover_gates(campaign_dir, campaign_dir.name)))


def ingest_verdict(con: duckdb.DuckDBPyConnection, path: Path) -> Outcome:
    """One verdict file, RAW/<campaign_id>/gates/<verdict_id>.json, through a writer connection."""
    path = Path(path)
    campaign_dir = path.parent.parent
    ref = ArtifactRef(
        "gate",
        f"{campaign_dir.name}/{path.stem}",
        path.parent,
        f"{campaign_dir.name}/gates/{path.name}",
        campaign_dir.name,
        path.stem,
    )
    return ingest_artifacts(con, GATE, [ref])[0]
