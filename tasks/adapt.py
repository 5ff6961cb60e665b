"""Adaptation confirmation, the plain parts: the randomised schedule of (head, stratum) blocks, running it on
one hot-swap deployment (swap when the block's head is not the one serving, then the block's cells), always
ending with the old head serving again (on failure too), the plain captures the gate compares against, and
the verdict document. The flow (flows/adapt.py) composes these; the statistics are analysis/adaptation.py.

A block is one head serving one stratum's cells (one per load). Each repeat holds every (head, stratum) block
once, in an order drawn from the seed; a repeat's old and new blocks of a stratum are the pair the analysis
compares, so drift over the run (a warming cache, a busier host) falls on both heads in random order rather
than on whichever head ran second.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from artifacts import layout
from artifacts.documents import AdaptationDocument, CampaignRecord
from artifacts.store import read_json, write_json_atomic
from experiments.spec import ExperimentSpec, Variant
from specgauge.checkpoints import drafter_digest
from specgauge.errors import InputError
from specgauge.provenance import host_facts, tool_facts, utc_now
from specgauge.settings import get_settings

Head = Literal["old", "new"]
HEADS: tuple[Head, Head] = ("old", "new")


class AdaptationError(Exception):
    """The confirmation could not go on (the server serves another head than the one swapped in...)."""


@dataclass(frozen=True)
class Block:
    position: int  # order in the schedule, from 0
    repeat: int
    head: Head
    stratum: str


def schedule(strata: Sequence[str], repeats: int, seed: int) -> list[Block]:
    """Every (head, stratum) block once per repeat, in an order drawn from `seed` per repeat. The same
    inputs give the same schedule (recorded in the document), different seeds different orders."""
    if repeats < 1:
        raise InputError(f"repeats: at least 1, got {repeats}")
    if not strata:
        raise InputError("strata: at least one stratum")
    if len(set(strata)) != len(strata):
        raise InputError(f"strata: each stratum once, got {list(strata)}")
    rng = random.Random(seed)
    blocks: list[Block] = []
    for repeat in range(repeats):
        pairs = [(head, stratum) for head in HEADS for stratum in sorted(strata)]
        rng.shuffle(pairs)
        start = len(blocks)
        blocks.extend(Block(start + i, repeat, h, s) for i, (h, s) in enumerate(pairs))
    return blocks


def swaps_needed(blocks: Sequence[Block], start: Head = "old") -> int:
    """Swaps the schedule makes, the swap back to the old head at the end included."""
    serving, count = start, 0
    for block in blocks:
        if block.head != serving:
            serving, count = block.head, count + 1
    return count + (serving != "old")


class Swapper(Protocol):
    """What the schedule needs of a hot-swap deployment (tasks.drafters.swap binds a real one)."""

    def swap(self, head_dir: Path) -> dict[str, Any]:  # a SwapRecord as a dict: at, old/new_sha256, head
        ...

    def serving(self) -> str | None:  # the sha256 of the head the server reports serving
        ...


@dataclass(frozen=True)
class HeadRef:
    label: Head
    path: Path
    sha256: str | None
    drafter_id: str | None = None

    def facts(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "path": str(self.path),
            "sha256": self.sha256,
            "drafter_id": self.drafter_id,
        }


@dataclass
class BlockResult:
    block: Block
    cells: list[tuple[str, str]]  # (cell id, status)
    swap: dict[str, Any] | None
    serving_sha256: str | None

    def facts(self) -> dict[str, Any]:
        return {
            **asdict(self.block),
            "cells": [c for c, _ in self.cells],
            "statuses": [s for _, s in self.cells],
            "swap": self.swap,
            "serving_sha256": self.serving_sha256,
        }


@dataclass
class ScheduleResult:
    blocks: list[BlockResult] = field(default_factory=list)
    swaps: list[dict[str, Any]] = field(default_factory=list)
    swapped_back: bool = False
    final_sha256: str | None = None
    error: str | None = None


def _swap_to(swapper: Swapper, head: HeadRef, result: ScheduleResult) -> dict[str, Any]:
    record = dict(swapper.swap(head.path))
    result.swaps.append(record)
    return record


def _check_serving(swapper: Swapper, head: HeadRef) -> str | None:
    served = swapper.serving()
    if served is not None and head.sha256 is not None and served != head.sha256:
        raise AdaptationError(
            f"the server serves head {served[:12]}..., not the {head.label} head {head.sha256[:12]}... "
            f"({head.path}) that should serve now"
        )
    return served


def run_schedule(
    blocks: Sequence[Block],
    heads: dict[str, HeadRef],
    swapper: Swapper,
    run_cells: Callable[[Block], list[tuple[str, str]]],
    *,
    after: Callable[[Swapper], None] | None = None,
    result: ScheduleResult | None = None,
) -> ScheduleResult:
    """Run the blocks on a deployment that starts with the old head: swap when a block's head is not the
    one serving, check the server reports the expected head, run the block's cells. `after` (the gate's
    capture) runs last, with whatever head it swaps in. Whatever happens (a failed swap, a cell that raised,
    Ctrl-C), the old head is swapped back in before this returns or raises: `swapped_back` and
    `final_sha256` say whether that worked. `result` (optional) is filled as the schedule goes, so a caller
    that catches the error still has the blocks that ran."""
    result = result if result is not None else ScheduleResult()
    serving: list[Head] = ["old"]

    class Tracking:
        """The swapper, keeping track of which head serves (after() swaps through it too)."""

        def swap(self, head_dir: Path) -> dict[str, Any]:
            label = next(h for h, ref in heads.items() if ref.path == head_dir)
            record = _swap_to(swapper, heads[label], result)
            serving[0] = label  # type: ignore[assignment]
            return record

        def serving(self) -> str | None:
            return swapper.serving()

    tracked = Tracking()
    try:
        for block in blocks:
            swap = None
            if block.head != serving[0]:
                swap = tracked.swap(heads[block.head].path)
            served = _check_serving(swapper, heads[block.head])
            cells = run_cells(block)
            result.blocks.append(BlockResult(block, cells, swap, served))
        if after is not None:
            after(tracked)
    except BaseException as exc:
        result.error = f"{type(exc).__name__}: {exc}"
        raise
    finally:
        try:
            if serving[0] != "old":
                tracked.swap(heads["old"].path)
            result.final_sha256 = _check_serving(swapper, heads["old"])
            result.swapped_back = True
        except Exception as exc:  # the deployment is torn down next either way; say so in the record
            note = f"swap back to the old head failed: {type(exc).__name__}: {exc}"
            result.error = f"{result.error}; {note}" if result.error else note
    return result


# --- heads ---------------------------------------------------------------------------------------------------


def resolve_head(
    value: str, *, label: Head, raw_dir: Path | None = None, repo: Path | None = None
) -> HeadRef:
    """A head given as a directory (absolute or relative to the repository) or as a drafter artifact id
    (RAW/drafters/<id>/, written by the train-drafter flow: the head is that directory or its `head/`)."""
    from specgauge.settings import REPO_ROOT

    candidates = [Path(value), (repo or REPO_ROOT) / value]
    drafters_dir = Path(raw_dir or get_settings().raw_dir) / "drafters"
    drafters = drafters_dir / value
    candidates += [drafters / "head", drafters]
    for path in candidates:
        if (path / "config.json").is_file():
            is_artifact = path in (drafters, drafters / "head")
            return HeadRef(
                label=label,
                path=path.resolve(),
                sha256=drafter_digest(path),
                drafter_id=value if is_artifact else None,
            )
    raise InputError(
        f"{label} head {value!r}: neither a head directory (with config.json) nor a drafter artifact "
        f"under {drafters_dir}"
    )


def adaptation_variant(spec: ExperimentSpec, name: str | None) -> Variant:
    """The spec's EAGLE-3 variant to swap heads on: `name`, or the only eagle3 variant with hot_swap."""
    eagle = [v for v in spec.variants if v.method == "eagle3"]
    if name is not None:
        chosen = next((v for v in spec.variants if v.name == name), None)
        if chosen is None:
            raise InputError(f"variant {name!r} is not in spec {spec.name!r}")
    else:
        swappable = [v for v in eagle if getattr(v, "hot_swap", False)] or eagle
        if len(swappable) != 1:
            names = ", ".join(v.name for v in swappable) or "none"
            raise InputError(
                f"spec {spec.name!r}: name the eagle3 variant to adapt (eagle3 variants: {names})"
            )
        chosen = swappable[0]
    if chosen.method != "eagle3":
        raise InputError(
            f"variant {chosen.name!r}: adaptation swaps EAGLE-3 heads, its method is {chosen.method}"
        )
    if hasattr(chosen, "hot_swap") and not chosen.hot_swap:
        chosen = chosen.model_copy(update={"hot_swap": True})
    return chosen


# --- identity and records ------------------------------------------------------------------------------------


def inputs_digest(inputs: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(inputs, sort_keys=True, default=str).encode()).hexdigest()


def record_adaptation_campaign(
    directory: Path,
    campaign_id: str,
    spec: ExperimentSpec,
    *,
    name: str,
    spec_sha256: str,
    label: str | None,
    slot: str,
    variant: str,
    blocks: Sequence[Block],
    cells: Sequence[str],
    captures: Sequence[str],
) -> Path:
    """campaign.json of the confirmation (once): the warehouse files its cells, verdict and gate under it."""
    path = layout.campaign_file(directory)
    if path.exists():
        return directory
    record = CampaignRecord.model_validate(
        {
            "campaign_id": campaign_id,
            "name": name,
            "label": label,
            "spec_sha256": spec_sha256,
            "spec": {
                **spec.model_dump(mode="json"),
                "repeats": max((b.repeat for b in blocks), default=0) + 1,
            },
            "variant_order": [
                [f"{b.head}:{b.stratum}" for b in blocks if b.repeat == r] for r in _repeats(blocks)
            ],
            "deployments": [
                {
                    "slot": slot,
                    "variant": variant,
                    "repeat": 0,
                    "role": "arm",
                    "position": 0,
                    "cells": list(cells),
                    "captures": list(captures),
                }
            ],
            "created_utc": utc_now(),
            "tool": tool_facts(),
            "host": host_facts(),
        }
    )
    write_json_atomic(path, record)
    return directory


def _repeats(blocks: Sequence[Block]) -> list[int]:
    return sorted({b.repeat for b in blocks})


def write_adaptation(directory: Path, document: dict[str, Any]) -> Path:
    """The verdict as RAW/<campaign>/adaptations/<adaptation_id>.json, written once (validated first)."""
    doc = AdaptationDocument.model_validate({**document, "tool": tool_facts(), "host": host_facts()})
    path = layout.adaptation_file(directory, doc.adaptation_id)
    write_json_atomic(path, doc)
    return path


def earlier_adaptation(directory: Path, adaptation_id: str) -> dict[str, Any] | None:
    """The confirmation's document when a finished run wrote it already (a re-run returns it)."""
    path = layout.adaptation_file(directory, adaptation_id)
    return {**read_json(path), "path": str(path)} if path.exists() else None  # "path": as a fresh run's


# --- the gate's plain captures -------------------------------------------------------------------------------


@dataclass(frozen=True)
class PlainCaptures:
    """The plain side of the gate: `base` (compared with the new head's capture) and control pairs of plain
    captures (`(base, again)` on one deployment, `(base, other)` across deployments)."""

    base: Path
    controls: tuple[tuple[Path, Path], ...]
    campaign_id: str


def served_model(meta: dict[str, Any]) -> str | None:
    """The target a capture's deployment served: the engine command's `--model` (or `serve MODEL`)."""
    command = list((meta.get("deployment") or {}).get("command") or [])
    for i, arg in enumerate(command[:-1]):
        if arg in ("--model", "serve"):
            return command[i + 1]
        if arg.startswith("--model="):
            return arg.split("=", 1)[1]
    return None


def plain_captures_of(raw_campaign_dir: Path, *, target_model: str, max_tokens: int | None) -> PlainCaptures:
    """Reuse an earlier campaign's plain captures for the gate: its plain variant's first capture is the
    base, every other plain capture of that variant a control (the `.again` capture: same deployment; other
    repeats and control launches: cross deployment). Refused (InputError) when the campaign served another
    target or capped captures at another max_tokens, or has no cross-deployment control; prompts and
    sampling are checked by the gate itself (tasks.gate.compare)."""
    captures = layout.subdirs(layout.captures_dir(raw_campaign_dir))
    plain: list[tuple[Path, dict[str, Any]]] = []
    for path in captures:
        if not layout.capture_complete(path):
            continue
        meta = read_json(path / layout.META)
        variant = meta.get("variant") or {}
        if (
            isinstance(variant, dict)
            and (variant.get("method") or "none") == "none"
            and not variant.get("aa_control")
        ):
            plain.append((path, meta))
    if not plain:
        raise InputError(f"{raw_campaign_dir}: no plain captures to gate against")
    models = {str(served_model(m)) for _, m in plain}
    if models != {target_model}:
        raise InputError(
            f"{raw_campaign_dir}: its plain captures served {sorted(models)}, this deployment serves "
            f"{target_model!r}: the gate compares one target's outputs"
        )
    caps = {m.get("max_tokens") for _, m in plain}
    if max_tokens is not None and caps != {max_tokens}:
        raise InputError(
            f"{raw_campaign_dir}: plain captures capped at {sorted(map(str, caps))}, not {max_tokens}"
        )
    by_name = {p.name: (p, m) for p, m in plain}
    base_name = next((n for n in sorted(by_name) if n.endswith(".r0")), sorted(by_name)[0])
    base, base_meta = by_name[base_name]
    controls = tuple((base, p) for n, (p, _) in sorted(by_name.items()) if n != base_name)
    if not any(m.get("deployment_id") != base_meta.get("deployment_id") for n, (_, m) in by_name.items()):
        raise InputError(
            f"{raw_campaign_dir}: its plain captures all come from one deployment; the gate needs a "
            "cross-deployment control"
        )
    return PlainCaptures(base=base, controls=controls, campaign_id=raw_campaign_dir.name)
