"""deployment.json (artifacts.documents.DeploymentFacts) into `deployments`; the engine settings that say
whether two deployments were launched the same way (also read by the cells kind)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pandera.polars as pa
import polars as pl

from artifacts import ids, layout
from artifacts.documents import DeploymentFacts, EngineFacts, VariantFacts, utc_datetime
from specgauge.argv import without_options
from specgauge.redact import redact_args, redact_data, redact_text, redact_url
from warehouse.errors import ArtifactInvalid
from warehouse.frames import Files, Part, canonical_json, document, short_hash
from warehouse.kinds.base import directory_kind, placed
from warehouse.kinds.columns import main_table, source_columns
from warehouse.kinds.provenance import provenance_columns
from warehouse.models import METHODS, Exact

# Engine arguments that differ between deployments of one configuration, or that define the variant:
# left out of engine_settings, which must match for a speculative cell to be compared with a plain one.
_PER_DEPLOYMENT_FLAGS = (
    "--host",
    "--port",
    "--served-model-name",
    "--speculative-config",
    "--per-request-spec-decode-metrics",  # a speculative variant's measurement flag (tasks/launch/command.py)
    "--api-key",
)


@main_table()
class DeploymentModel(pa.DataFrameModel):
    deployment_id: pl.String = pa.Field(str_length={"min_value": 1}, unique=True)
    campaign_id: pl.String = pa.Field(str_length={"min_value": 1})
    variant: pl.String = pa.Field(str_length={"min_value": 1})
    method: pl.String = pa.Field(isin=METHODS)
    k: pl.Int32 = pa.Field(nullable=True, gt=0)
    variant_config: pl.String = pa.Field()
    slot: pl.String = pa.Field(str_length={"min_value": 1})
    repeat: pl.Int32 = pa.Field(nullable=True, ge=0)
    control: pl.Int32 = pa.Field(nullable=True, ge=1)
    launch: pl.Int32 = pa.Field(nullable=True, ge=1)
    launcher: pl.String = pa.Field(str_length={"min_value": 1})
    served_model_name: pl.String = pa.Field(nullable=True)
    base_url: pl.String = pa.Field(nullable=True)
    engine_command: pl.List(pl.String) = pa.Field(nullable=True)
    engine_settings: pl.String = pa.Field(nullable=True)
    engine_key: pl.String = pa.Field(nullable=True)
    engine_version: pl.String = pa.Field(nullable=True)
    kv_cache_tokens: pl.Int64 = pa.Field(nullable=True, gt=0)
    drafter_sha256: pl.String = pa.Field(nullable=True, str_length={"min_value": 64, "max_value": 64})
    target_digest: pl.String = pa.Field(nullable=True, str_length={"min_value": 64, "max_value": 64})
    env_digest: pl.String = pa.Field(nullable=True, str_length={"min_value": 64, "max_value": 64})
    overlays_digest: pl.String = pa.Field(nullable=True, str_length={"min_value": 64, "max_value": 64})
    hardware: pl.String = pa.Field(nullable=True)
    max_model_len: pl.Int32 = pa.Field(nullable=True, gt=0)
    status: pl.String = pa.Field(isin=["starting", "ready", "failed", "stopped"])
    started_utc: pl.Datetime = pa.Field(nullable=True)
    ready_s: pl.Float64 = pa.Field(nullable=True, ge=0)
    stopped_utc: pl.Datetime = pa.Field(nullable=True)
    teardown: pl.String = pa.Field(nullable=True)
    job_id: pl.String = pa.Field(nullable=True)
    pid: pl.Int64 = pa.Field(nullable=True)
    extra: pl.String = pa.Field(nullable=True)

    Config = Exact


def engine_settings(
    command: Sequence[str] | None,
    launcher: str | None,
    extra: Mapping[str, Any] | None,
    variant_extra_args: Sequence[str] = (),
) -> dict[str, Any]:
    """What must be equal for two deployments to be 'launched the same way': the engine arguments minus
    what differs per deployment (host, port, served name) or defines the variant (speculative config,
    the variant's own extra args), plus the launcher kind and its KV-cache size."""
    # redacted (documents written before redaction still hold secrets): equal settings whatever the key
    args = list(redact_args(command or ())[0])
    variant_extra_args = redact_args(variant_extra_args)[0]
    start = next((i for i, a in enumerate(args) if a.startswith("--")), len(args))
    args = args[start:]
    if variant_extra_args and args[-len(variant_extra_args) :] == list(variant_extra_args):
        args = args[: -len(variant_extra_args)]
    return {
        "args": without_options(args, _PER_DEPLOYMENT_FLAGS, joined=True),
        "launcher": launcher,
        "kv_cache_gib": (extra or {}).get("kv_cache_gib"),
    }


def settings_of(engine: EngineFacts | DeploymentFacts | None, variant: VariantFacts) -> dict[str, Any]:
    """engine_settings of a deployment as a document records it."""
    if engine is None:
        return engine_settings(None, None, None, variant.extra_args or ())
    return engine_settings(engine.command, engine.launcher, engine.extra, variant.extra_args or ())


def mask_secrets(command: Sequence[str] | None) -> list[str] | None:
    """The engine command as stored: secret values redacted (specgauge.redact)."""
    return None if command is None else list(redact_args(command)[0])


def deployment_frames(
    source_path: str, campaign_id: str, deployment_id: str, files: Files, sha256: str
) -> dict[str, Part]:
    name = layout.DEPLOYMENT_FILE
    facts = document(files, name, DeploymentFacts)
    if facts.id != deployment_id:
        raise ArtifactInvalid(
            f"id {facts.id!r} does not match its directory {deployment_id!r}", file=name, column="id"
        )
    parsed = ids.parse_deployment_id(deployment_id)
    settings = settings_of(facts, facts.variant)
    row = {
        "deployment_id": deployment_id,
        "campaign_id": campaign_id,
        "variant": facts.variant.name,
        "method": facts.variant.method or "none",
        "k": facts.variant.k,
        "variant_config": canonical_json(facts.variant),
        "slot": parsed.slot,
        "repeat": parsed.repeat,
        "control": parsed.control,
        "launch": parsed.launch,
        "launcher": facts.launcher,
        "served_model_name": facts.served_model_name,
        "base_url": redact_url(facts.base_url) if facts.base_url else None,
        "engine_command": mask_secrets(facts.command),
        "engine_settings": canonical_json(settings),
        "engine_key": short_hash(settings),
        "engine_version": facts.engine_version,
        "kv_cache_tokens": facts.kv_cache_tokens,
        "drafter_sha256": facts.drafter.sha256 if facts.drafter else None,
        **provenance_columns(facts.provenance),  # migration 0018
        "max_model_len": facts.max_model_len,
        "status": facts.status,
        "started_utc": utc_datetime(facts.started_at or None),
        "ready_s": facts.ready_s,
        "stopped_utc": utc_datetime(facts.stopped_at),
        "teardown": redact_text(facts.teardown) if facts.teardown else None,
        "job_id": None if facts.job_id is None else str(facts.job_id),
        "pid": facts.pid,
        "extra": None if facts.extra is None else canonical_json(redact_data(facts.extra)),
        **source_columns(source_path, sha256),
    }
    return {"deployments": [row]}


KIND = directory_kind(
    name="deployment",
    table="deployments",
    key_column="deployment_id",
    folder=layout.deployments_dir,
    frames=placed(deployment_frames),
    models={"deployments": DeploymentModel},
    sources={"deployments": layout.DEPLOYMENT_FILE},
    immutable=False,  # deployment.json is rewritten at ready and at teardown
    files=(layout.DEPLOYMENT_FILE,),  # not engine.log, which grows
    campaign_keyed=False,  # launch ids are unique across campaigns: the key is the id alone
)
