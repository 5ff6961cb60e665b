"""Replaying shapes over a capture: build the proposers the shapes need, run them, collect the rows.

`build_proposers` is the one place that turns proposer names into proposers for a capture: n-gram with
the campaign's prompt_lookup_min/max, suffix, and the two model drafters, whose rank tables it asks the
model worker for (once per capture, as wide and deep as the shapes need).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from analysis.simulate import models
from analysis.simulate.captures import CaptureInput, resolve_model_dir
from analysis.simulate.proposers import (
    NgramProposer,
    Proposer,
    RankedProposer,
    RankTable,
    StepRanks,
    SuffixProposer,
    TokenRanks,
)
from analysis.simulate.replay import RESULT_SCHEMA, ReplayResult, Request, replay
from analysis.simulate.shapes import Shape
from experiments.methods import NGRAM_LOOKUP_MAX, NGRAM_LOOKUP_MIN

DEFAULT_DRAFT = "models/tiny-draft"
DEFAULT_EAGLE = "models/tiny-eagle3"


@dataclass(frozen=True)
class DrafterSettings:
    """What the proposers are built with (the campaign's served values by default; see `from_campaign`)."""

    ngram_min: int = NGRAM_LOOKUP_MIN
    ngram_max: int = NGRAM_LOOKUP_MAX
    draft_model: str = DEFAULT_DRAFT
    eagle_head: str = DEFAULT_EAGLE
    dtype: str = "bfloat16"  # what vLLM ran the embedded models in (config dtype, --dtype auto)

    @classmethod
    def from_campaign(cls, inputs: Sequence[CaptureInput], dtype: str = "bfloat16") -> DrafterSettings:
        """The campaign's own drafter facts: its n-gram bounds, its draft model and EAGLE-3 head."""
        found: dict[str, object] = {}
        for item in inputs:
            v = item.variant
            if v.get("method") == "ngram":
                found.setdefault("ngram_min", v.get("prompt_lookup_min") or NGRAM_LOOKUP_MIN)
                found.setdefault("ngram_max", v.get("prompt_lookup_max") or NGRAM_LOOKUP_MAX)
            if v.get("draft_model"):
                found.setdefault("draft_model", v["draft_model"])
            if v.get("eagle_head"):
                found.setdefault("eagle_head", v["eagle_head"])
        return cls(dtype=dtype, **found)  # type: ignore[arg-type]


def build_proposers(
    requests: Sequence[Request],
    names: set[str],
    settings: DrafterSettings,
    *,
    target_dir: Path,
    max_model_len: int,
    top: int,
    steps: int,
) -> dict[str, Proposer]:
    """The named proposers for these requests (of one target); model rank tables hold `top` candidates
    and `steps` depths and come from one model-worker call per drafter for all distinct requests."""
    unique = list(dict.fromkeys(requests))
    prompts = [list(r.prompt) for r in unique]
    # Ranks cover the tail too, so that the last step's drafts past the output are known.
    outputs = [list(r.output + r.tail) for r in unique]
    proposers: dict[str, Proposer] = {}
    if "ngram" in names:
        proposers["ngram"] = NgramProposer(settings.ngram_min, settings.ngram_max, max_model_len)
    if "suffix" in names:
        proposers["suffix"] = SuffixProposer()
    if "draft" in names:
        draft_dir = resolve_model_dir(settings.draft_model, DEFAULT_DRAFT)
        ranks = models.draft_ranks(draft_dir, prompts, outputs, top, settings.dtype)
        tables: dict[Request, RankTable] = {
            r: TokenRanks(tuple(tuple(x) for x in table)) for r, table in zip(unique, ranks, strict=True)
        }
        proposers["draft"] = RankedProposer("draft", tables)
    if "eagle3" in names:
        head_dir = resolve_model_dir(settings.eagle_head, DEFAULT_EAGLE)
        ranks = models.eagle_ranks(target_dir, head_dir, prompts, outputs, top, steps, settings.dtype)
        tables = {
            r: StepRanks(tuple(tuple(tuple(x) for x in row) for row in table))
            for r, table in zip(unique, ranks, strict=True)
        }
        proposers["eagle3"] = RankedProposer("eagle3", tables)
    return proposers


def needs(shapes: Sequence[Shape]) -> tuple[set[str], int, int]:
    """The proposers, rank width and depth a set of shapes needs."""
    names = {name for shape in shapes for name in shape.proposers}
    top = max((shape.max_branching for shape in shapes), default=1)
    steps = max((shape.max_depth for shape in shapes), default=1)
    return names, top, steps


def proposers_for(
    requests: Sequence[Request], shapes: Sequence[Shape], settings: DrafterSettings, item: CaptureInput
) -> dict[str, Proposer]:
    """The proposers `shapes` need over `requests`, built for the target and context length of `item`."""
    names, top, steps = needs(shapes)
    return build_proposers(
        requests,
        names,
        settings,
        target_dir=item.target_dir,
        max_model_len=item.max_model_len,
        top=top,
        steps=steps,
    )


def simulate_shapes(
    item: CaptureInput,
    shapes: Sequence[Shape],
    settings: DrafterSettings,
    proposers: Mapping[str, Proposer] | None = None,
) -> list[ReplayResult]:
    """Replay every shape over one capture's requests (building the proposers unless given)."""
    if proposers is None:
        proposers = proposers_for(item.requests, shapes, settings, item)
    return [replay(item.requests, shape.drafter(proposers), shape.label, shape.max_depth) for shape in shapes]


def projection_frame(item: CaptureInput, results: Sequence[ReplayResult]) -> pl.DataFrame:
    """Rows per shape and stratum (replay.RESULT_SCHEMA), with the capture they were replayed on."""
    frames = [result.rows() for result in results]
    frame = pl.concat(frames) if frames else pl.DataFrame(schema=RESULT_SCHEMA)
    return frame.with_columns(pl.lit(item.capture.capture_id).alias("capture_id")).select(
        "capture_id", *RESULT_SCHEMA
    )


def outputs_capture(inputs: Sequence[CaptureInput], prefer: str | None = None) -> CaptureInput:
    """The capture whose outputs projections replay: `prefer` by id, else the first plain one, else the first."""
    if prefer is not None:
        for item in inputs:
            if item.capture.capture_id == prefer:
                return item
        raise KeyError(prefer)
    plain = [item for item in inputs if item.method in ("none", "plain")]
    return (plain or list(inputs))[0]
