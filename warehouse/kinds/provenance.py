"""Provenance in the warehouse (migration 0018): the four columns every deployment row gets from its
deployment.json's `provenance` (artifacts.documents.ProvenanceFacts), and the `environments` kind: each
engine package lock (RAW/<campaign>/environments/<sha256>.txt, tasks.launch.provenance) once per hash.

An environment is keyed by its hash alone, not by campaign: the same lock found in a second campaign is the
same bytes (its name is their sha256), so the ingest engine skips it as already ingested."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandera.polars as pa
import polars as pl

from artifacts import layout
from artifacts.documents import ProvenanceFacts
from warehouse.errors import ArtifactInvalid
from warehouse.frames import Files, canonical_json, to_frame
from warehouse.kinds.base import ArtifactKind, ArtifactRef, file_refs
from warehouse.kinds.columns import SHA256_LENGTH, main_table, source_columns
from warehouse.models import Strict

_SHA256_NAME = frozenset("0123456789abcdef")


def provenance_columns(provenance: ProvenanceFacts | None) -> dict[str, Any]:
    """target_digest, env_digest, overlays_digest and hardware of one deployment; NULL where the document
    records the fact as absent (or is older than provenance)."""
    if provenance is None:
        return dict.fromkeys(("target_digest", "env_digest", "overlays_digest", "hardware"))
    hardware = provenance.hardware
    identity = None
    if hardware.absent is None:  # what the host is; not why a GPU list is missing, nor a GPU's index
        gpus = [{k: v for k, v in gpu.items() if k != "index"} for gpu in hardware.gpus or []]
        identity = canonical_json(
            {
                "cpu_model": hardware.cpu_model,
                "cpus": hardware.cpus,
                "cpu_cores": hardware.cpu_cores,
                "gpus": gpus if hardware.gpus is not None else None,
            }
        )
    return {
        "target_digest": provenance.target.sha256,
        "env_digest": provenance.environment.sha256,
        "overlays_digest": provenance.overlays.sha256,
        "hardware": identity,
    }


@main_table()
class EnvironmentModel(pa.DataFrameModel):
    env_digest: pl.String = pa.Field(unique=True, str_length=SHA256_LENGTH)
    packages: pl.Int32 = pa.Field(ge=0)
    freeze_text: pl.String = pa.Field()

    Config = Strict


def environment_frames(ref: ArtifactRef, files: Files, sha256: str) -> dict[str, pl.DataFrame]:
    """One package lock as its `environments` row; its name must be the sha256 of its bytes."""
    name = f"{ref.name}.txt"
    raw = files[name]
    if hashlib.sha256(raw).hexdigest() != ref.name:
        raise ArtifactInvalid("its sha256 is not its name: the file changed after it was written", file=name)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ArtifactInvalid(f"not UTF-8 text ({exc.reason})", file=name) from None
    row = {
        "env_digest": ref.name,
        "packages": sum(1 for line in text.splitlines() if line.strip() and not line.startswith("#")),
        "freeze_text": text,
        **source_columns(ref.source_path, sha256),
    }
    return {"environments": to_frame(EnvironmentModel, [row])}


def _discover(campaign_dir: Path, prefix: str) -> Iterator[ArtifactRef]:
    """RAW/<campaign>/environments/<sha256>.txt, keyed by the hash alone."""
    folder = campaign_dir / layout.ENVIRONMENTS
    if not folder.is_dir():
        return
    locks = (
        path
        for path in sorted(folder.glob("*.txt"))
        if not layout.is_temporary(path.name) and len(path.stem) == 64 and set(path.stem) <= _SHA256_NAME
    )
    yield from file_refs("environments", locks, campaign_dir, prefix, campaign_keyed=False)


KIND = ArtifactKind(
    name="environments",
    table="environments",
    key_column="env_digest",
    discover=_discover,
    frames=environment_frames,
    models={"environments": EnvironmentModel},
    sources={"environments": layout.ENVIRONMENTS},
    files=lambda ref: (f"{ref.name}.txt",),
)
