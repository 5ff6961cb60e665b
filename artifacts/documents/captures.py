"""Greedy captures: captures/<capture_id>/meta.json (CaptureMeta) and outputs.parquet (OUTPUT_SCHEMA), and
their reader (`load_capture`: the gate, the simulator and the trainer read captures through it)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from artifacts import layout
from artifacts.documents.base import Document, Flag, Number, Text, Time, Whole
from artifacts.documents.blocks import HostFacts, ToolFacts, VariantFacts
from artifacts.documents.deployments import EngineFacts
from artifacts.store import read_json
from specgauge.errors import ArtifactError


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


# --- reading ---------------------------------------------------------------------------------------------

META_REQUIRED = ("capture_id", "campaign_id", "deployment_id", "variant", "prompt_ids", "sampling")


@dataclass(frozen=True)
class Output:
    """One prompt's captured output (a row of outputs.parquet)."""

    prompt_id: str
    workload: str
    ok: bool
    error: str | None
    text: str | None
    token_ids: tuple[int, ...] | None
    finish_reason: str | None
    prompt_tokens: int | None
    completion_tokens: int | None


@dataclass(frozen=True)
class Capture:
    """A capture artifact loaded from its directory."""

    path: Path
    meta: dict[str, Any]
    outputs: tuple[Output, ...]

    @property
    def capture_id(self) -> str:
        return str(self.meta["capture_id"])

    @property
    def campaign_id(self) -> str:
        return str(self.meta["campaign_id"])

    @property
    def deployment_id(self) -> str:
        return str(self.meta["deployment_id"])

    @property
    def variant_name(self) -> str:
        variant = self.meta.get("variant") or {}
        return str(variant.get("name", "?"))

    @property
    def sampling(self) -> dict[str, Any]:
        return dict(self.meta["sampling"])

    @property
    def prompt_ids(self) -> list[str]:
        return [o.prompt_id for o in self.outputs]

    def by_id(self) -> dict[str, Output]:
        return {o.prompt_id: o for o in self.outputs}

    def ref(self) -> dict[str, Any]:
        """How a verdict or comparison names this capture."""
        return {
            "capture_id": self.capture_id,
            "campaign_id": self.campaign_id,
            "deployment_id": self.deployment_id,
            "variant": self.variant_name,
            "path": str(self.path),
        }


def load_capture(path: Path | str) -> Capture:
    """Read a capture directory; ArtifactError names the file and what is wrong with it."""
    path = Path(path)
    meta_path, outputs_path = path / layout.META, path / layout.OUTPUTS
    for needed in (meta_path, outputs_path):
        if not needed.is_file():
            raise ArtifactError(f"{needed}: missing: {path} is not a complete capture directory")
    try:
        meta = read_json(meta_path)
    except (OSError, json.JSONDecodeError) as exc:
        raise ArtifactError(f"{meta_path}: unreadable: {exc}") from None
    if not isinstance(meta, dict):
        raise ArtifactError(f"{meta_path}: expected a JSON object, got {type(meta).__name__}")
    missing = [k for k in META_REQUIRED if k not in meta]
    if missing:
        raise ArtifactError(f"{meta_path}: missing field(s) {', '.join(missing)}")
    try:
        frame = pl.read_parquet(outputs_path)
    except Exception as exc:  # polars raises several kinds for a damaged file
        raise ArtifactError(f"{outputs_path}: unreadable parquet: {exc}") from None
    absent = [c for c in OUTPUT_SCHEMA if c not in frame.columns]
    if absent:
        raise ArtifactError(f"{outputs_path}: missing column(s) {', '.join(absent)}")
    frame = frame.select(list(OUTPUT_SCHEMA)).cast(OUTPUT_SCHEMA)  # type: ignore[arg-type]
    outputs: list[Output] = []
    seen: set[str] = set()
    for row_no, row in enumerate(frame.iter_rows(named=True)):
        pid = row["prompt_id"]
        if pid is None or pid in seen:
            raise ArtifactError(f"{outputs_path}: row {row_no}: prompt_id {pid!r} is missing or repeated")
        seen.add(pid)
        ids = row["token_ids"]
        outputs.append(
            Output(
                prompt_id=pid,
                workload=row["workload"] or "",
                ok=bool(row["ok"]),
                error=row["error"],
                text=row["text"],
                token_ids=None if ids is None else tuple(int(t) for t in ids),
                finish_reason=row["finish_reason"],
                prompt_tokens=row["prompt_tokens"],
                completion_tokens=row["completion_tokens"],
            )
        )
    if [o.prompt_id for o in outputs] != list(meta["prompt_ids"]):
        raise ArtifactError(
            f"{outputs_path}: prompt ids do not match meta.json's prompt_ids (the artifact is inconsistent)"
        )
    return Capture(path=path, meta=meta, outputs=tuple(outputs))
