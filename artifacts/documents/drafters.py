"""Drafter heads: RAW/drafters/<drafter_id>/card.json (DrafterCard: how a head was made) and its training
curve, curve.parquet (CURVE_SCHEMA)."""

from __future__ import annotations

from typing import Any, Literal

import polars as pl
from pydantic import Field

from artifacts.documents.base import Document, Number, Text, Time, Whole


class DrafterSide(Document):
    """One side (train or held out) of a head's training data."""

    examples: Whole
    prompt_tokens: Whole
    output_tokens: Whole
    strata: dict[str, int] = Field(default_factory=dict)  # examples per stratum


class DrafterData(Document):
    """What went into a head (tasks.drafters.training_data.data_summary): `sha256` over every example's
    id, content hash and side, so two heads trained on the same examples name the same data."""

    sha256: Text
    train: DrafterSide
    held_out: DrafterSide
    sources: dict[str, int] = Field(
        default_factory=dict
    )  # examples per source kind (capture, a JSONL's name)
    files: dict[str, str] = Field(default_factory=dict)  # each input file or capture -> its sha256


class DrafterLosses(Document):
    """The training's outcome on the held-out examples (the trainer's own offline check: the simulated
    acceptance length is what a greedy chain of `ttt_steps` would accept, from teacher-forced agreement)."""

    kept_step: Whole  # -1: no step beat the starting head, which is kept as it was
    final_train_loss: Number | None = None
    initial_held_out_mal: Number | None = None  # the parent's (or the untrained head's)
    kept_held_out_mal: Number | None = None
    initial_held_out: dict[str, Any] | None = None  # soft CE and top-1 per draft step, MAL per stratum
    kept_held_out: dict[str, Any] | None = None


class DrafterCard(Document):
    """RAW/drafters/<drafter_id>/card.json: how a head was made, written once when it is done
    (tasks.drafters.training). The head itself is head/ beside it, its curve curve.parquet."""

    drafter_id: Text
    created_utc: Time
    method: Text  # eagle3
    mode: Literal["finetune", "scratch"]
    target_path: Text
    target_sha256: Text  # specgauge.checkpoints.drafter_digest of the target's weights and config
    parent_path: Text | None = None
    parent_sha256: Text | None = None
    aux_layers: list[int]
    data: DrafterData
    hyperparameters: dict[str, Any]
    inputs_sha256: Text  # target, parent, data and hyperparameters: the id is made from it
    head_sha256: Text  # drafter_digest of head/: what deployments record as drafter_sha256
    losses: DrafterLosses
    runner: Text  # local, slurm
    device: Text | None = None
    torch_version: Text | None = None
    train_seconds: Number | None = None
    command: Text | None = None  # how to re-run it


CURVE_SCHEMA: dict[str, pl.DataType] = {
    "step": pl.Int64(),  # -1: the starting head, before any step
    "loss": pl.Float64(),  # the step's training loss (TTT, weighted over draft steps)
    "lr": pl.Float64(),
    "seconds": pl.Float64(),  # since training started
    "held_out_mal": pl.Float64(),  # simulated acceptance length on the held-out examples (evaluated steps)
    "held_out_top1": pl.List(pl.Float64()),  # top-1 agreement with the target per draft step
    "held_out_soft_ce": pl.List(pl.Float64()),
}
