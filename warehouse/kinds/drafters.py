"""Drafter heads (RAW/drafters/<drafter_id>/: card.json, artifacts.documents.DrafterCard, and
curve.parquet, CURVE_SCHEMA; written once by tasks.drafters.training) into `drafters`, one row each
(migration 0011). They live beside the campaigns, not inside one: the ingest engine walks every folder of
RAW, and this kind answers only for RAW/drafters/."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pandera.polars as pa
import polars as pl

from artifacts import ids, layout
from artifacts.documents import DrafterCard, utc_datetime
from warehouse.errors import ArtifactInvalid
from warehouse.frames import Files, canonical_json, document, load_parquet, to_frame
from warehouse.kinds.base import ArtifactKind, ArtifactRef, check_place
from warehouse.kinds.columns import main_table, source_columns
from warehouse.models import Strict


@main_table()
class DrafterModel(pa.DataFrameModel):
    drafter_id: pl.String = pa.Field(unique=True, str_length={"min_value": 1})
    created_utc: pl.Datetime = pa.Field(nullable=True)
    method: pl.String = pa.Field(isin=["eagle3"])
    mode: pl.String = pa.Field(isin=["finetune", "scratch"])
    target_path: pl.String = pa.Field()
    target_sha256: pl.String = pa.Field(str_length={"min_value": 64, "max_value": 64})
    parent_path: pl.String = pa.Field(nullable=True)
    parent_sha256: pl.String = pa.Field(nullable=True)
    head_sha256: pl.String = pa.Field(str_length={"min_value": 64, "max_value": 64})
    inputs_sha256: pl.String = pa.Field(str_length={"min_value": 64, "max_value": 64})
    aux_layers: pl.String = pa.Field()
    data_sha256: pl.String = pa.Field(str_length={"min_value": 64, "max_value": 64})
    train_examples: pl.Int32 = pa.Field(gt=0)
    train_prompt_tokens: pl.Int64 = pa.Field(ge=0)
    train_output_tokens: pl.Int64 = pa.Field(ge=0)
    held_out_examples: pl.Int32 = pa.Field(ge=0)
    strata: pl.String = pa.Field()
    data_sources: pl.String = pa.Field()
    hyperparameters: pl.String = pa.Field()
    steps: pl.Int32 = pa.Field(gt=0)
    lr: pl.Float64 = pa.Field(gt=0)
    kept_step: pl.Int32 = pa.Field(ge=-1)
    final_train_loss: pl.Float64 = pa.Field(nullable=True)
    initial_held_out_mal: pl.Float64 = pa.Field(nullable=True, ge=1)
    kept_held_out_mal: pl.Float64 = pa.Field(nullable=True, ge=1)
    curve_points: pl.Int32 = pa.Field(ge=1)
    runner: pl.String = pa.Field()
    device: pl.String = pa.Field(nullable=True)
    train_seconds: pl.Float64 = pa.Field(nullable=True, ge=0)

    Config = Strict


def drafter_frames(ref: ArtifactRef, files: Files, sha256: str) -> dict[str, pl.DataFrame]:
    """One drafter artifact as its `drafters` row (pure: no database). A drafter is no campaign's: its
    place is its directory's name alone."""
    card = document(files, layout.CARD, DrafterCard)
    check_place(layout.CARD, card, drafter_id=ref.name)
    curve = load_parquet(files, layout.CURVE, ["step", "loss"])
    hp = card.hyperparameters
    for name in ("steps", "lr"):
        if not isinstance(hp.get(name), int | float):
            raise ArtifactInvalid(
                "missing or not a number", file=layout.CARD, column=f"hyperparameters.{name}"
            )
    row = {
        "drafter_id": ref.name,
        "created_utc": utc_datetime(card.created_utc),
        "method": card.method,
        "mode": card.mode,
        "target_path": card.target_path,
        "target_sha256": card.target_sha256,
        "parent_path": card.parent_path,
        "parent_sha256": card.parent_sha256,
        "head_sha256": card.head_sha256,
        "inputs_sha256": card.inputs_sha256,
        "aux_layers": canonical_json(card.aux_layers),
        "data_sha256": card.data.sha256,
        "train_examples": card.data.train.examples,
        "train_prompt_tokens": card.data.train.prompt_tokens,
        "train_output_tokens": card.data.train.output_tokens,
        "held_out_examples": card.data.held_out.examples,
        "strata": canonical_json(card.data.train.strata),
        "data_sources": canonical_json(card.data.sources),
        "hyperparameters": canonical_json(hp),
        "steps": int(hp["steps"]),
        "lr": float(hp["lr"]),
        "kept_step": card.losses.kept_step,
        "final_train_loss": card.losses.final_train_loss,
        "initial_held_out_mal": card.losses.initial_held_out_mal,
        "kept_held_out_mal": card.losses.kept_held_out_mal,
        "curve_points": curve.height,
        "runner": card.runner,
        "device": card.device,
        "train_seconds": card.train_seconds,
        **source_columns(ref.source_path, sha256),
    }
    return {"drafters": to_frame(DrafterModel, [row])}


def _discover(folder: Path, prefix: str) -> Iterator[ArtifactRef]:
    """RAW/drafters/<drafter_id>/ (the ingest engine hands every folder of RAW to every kind)."""
    if folder.name != layout.DRAFTERS:
        return
    for d in layout.subdirs(folder):
        if ids.is_drafter_id(d.name) and (d / layout.CARD).is_file():
            yield ArtifactRef("drafters", d.name, d, f"{prefix}/{d.name}", layout.DRAFTERS, d.name)


KIND = ArtifactKind(
    name="drafters",
    table="drafters",
    key_column="drafter_id",
    discover=_discover,
    frames=drafter_frames,
    models={"drafters": DrafterModel},
    files=layout.DRAFTER_FILES,
)
