"""Greedy captures: captures/<capture_id>/meta.json (CaptureMeta) and outputs.parquet (OUTPUT_SCHEMA)."""

from __future__ import annotations

from typing import Any

import polars as pl

from artifacts.documents.base import Document, Flag, Number, Text, Time, Whole
from artifacts.documents.blocks import HostFacts, ToolFacts, VariantFacts
from artifacts.documents.deployments import EngineFacts


class CorpusFacts(Document):
    file: Text | None = None
    sha256: Text | None = None


class CaptureMeta(Document):
    """captures/<capture_id>/meta.json (tasks.capture): greedy outputs of one deployment for the gate.
    Capture ids are unique within a campaign only. Older captures name the variant by its name alone and
    the corpus as `corpus_file` / `corpus_sha256`."""

    format: Whole | None = None
    capture_id: Text
    campaign_id: Text | None = None
    deployment_id: Text | None = None
    variant: VariantFacts | Text | None = None
    corpus: CorpusFacts | None = None
    corpus_file: Text | None = None
    corpus_sha256: Text | None = None
    prompt_ids: list[Any] | None = None
    prompt_sha256: dict[str, Any] | None = None
    sampling: dict[str, Any] | None = None
    max_tokens: Whole | None = None
    greedy: Flag | None = None
    endpoint: Text | None = None
    sequential: Flag | None = None
    requests: dict[str, Any] | None = None
    warnings: list[Any] | None = None
    speculation: dict[str, Any] | None = None
    deployment: EngineFacts | None = None
    tool: ToolFacts | None = None
    host: HostFacts | None = None
    started_utc: Time | None = None
    ended_utc: Time | None = None
    wall_s: Number | None = None

    @property
    def variant_name(self) -> str | None:
        return self.variant if isinstance(self.variant, str) or self.variant is None else self.variant.name


# captures/<capture_id>/outputs.parquet: one row per prompt, in meta's prompt_ids order. `token_ids` null
# when the server gave none (or they did not account for every completion token).
OUTPUT_SCHEMA: dict[str, pl.DataType] = {
    "prompt_id": pl.String(),
    "workload": pl.String(),
    "ok": pl.Boolean(),
    "error": pl.String(),
    "text": pl.String(),
    "token_ids": pl.List(pl.Int64()),
    "finish_reason": pl.String(),
    "prompt_tokens": pl.Int64(),
    "completion_tokens": pl.Int64(),
}
