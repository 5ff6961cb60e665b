"""Shallow drafters: a draft model cut to its first N decoder layers (a variant's `draft_layers`), built once
before a campaign launches and served like any draft.

`ensure_truncated(draft_model, layers)` finds or builds the checkpoint in its slot
(specgauge.truncation.truncated_dir): the source's digest (specgauge.checkpoints.drafter_digest) is
written into the truncated config (`specgauge_truncation`), so a slot whose source has changed since is
rebuilt, and a slot that matches is reused without running anything. The build runs
tasks/drafters/truncate_worker.py under a Python with torch (the engine's venv: the application's has
none), which also loads the result with transformers and runs it, so a checkpoint that cannot load is
refused before an engine starts. The slot is written through a temporary folder and renamed: an
interrupted build leaves nothing a later run would take for finished.

`prepare_truncated(spec)` does it for every variant of a spec (called by the prelaunch checks, so
`campaign run`, `decide` and the flows all build before they launch).
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from artifacts.store import atomic_dir
from experiments.spec import ExperimentSpec
from specgauge.checkpoints import drafter_digest
from specgauge.errors import InputError
from specgauge.truncation import TRUNCATION_KEY, truncated_dir
from specgauge.worker_python import run_script
from tasks.drafters.training_data import worker_python

WORKER = Path(__file__).resolve().with_name("truncate_worker.py")


@dataclass(frozen=True)
class TruncatedDrafter:
    path: Path  # the slot the engine serves
    layers: int
    source_layers: int
    source_sha256: str  # drafter_digest of the full draft
    sha256: str  # drafter_digest of the truncated one: what a deployment serving it records
    built: bool  # False: found in its slot, nothing run


def _source_dir(draft_model: str) -> Path:
    from tasks.launch.local import resolve_local

    directory = Path(resolve_local(draft_model))
    if not (directory / "config.json").is_file():
        raise InputError(
            f"{draft_model} is not a local checkpoint folder with a config.json: only a local draft "
            "can be truncated"
        )
    return directory


def source_layers(directory: Path) -> int:
    config_path = directory / "config.json"
    try:
        layers = json.loads(config_path.read_text(encoding="utf-8")).get("num_hidden_layers")
    except (OSError, ValueError) as exc:
        raise InputError(f"{config_path}: unreadable: {exc}") from None
    if not isinstance(layers, int) or isinstance(layers, bool) or layers < 1:
        raise InputError(f"{config_path}: num_hidden_layers: must be a positive integer, got {layers!r}")
    return layers


def _matching(slot: Path, source_sha: str, layers: int) -> bool:
    """Whether the slot holds a finished truncation of this source's content at this depth."""
    try:
        config = json.loads((slot / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    block = config.get(TRUNCATION_KEY) or {}
    return block.get("source_sha256") == source_sha and config.get("num_hidden_layers") == layers


def _run_worker(request: dict[str, Any]) -> dict[str, Any]:
    python = worker_python()
    done = run_script(python, WORKER, json.dumps(request))
    if done.returncode != 0:
        raise InputError(
            f"truncating {request['source']} to {request['layers']} layers failed ({python} {WORKER}, "
            f"exit {done.returncode}): {done.stderr.strip()[-800:]}"
        )
    return json.loads(done.stdout)


def ensure_truncated(draft_model: str, layers: int, home: Path | None = None) -> TruncatedDrafter:
    """The truncated checkpoint of `draft_model` (as the spec writes it) at `layers` layers, built when its
    slot is missing or holds another source's truncation. InputError names what is wrong."""
    source = _source_dir(draft_model)
    total = source_layers(source)
    if not 1 <= layers < total:
        raise InputError(
            f"{layers} layers: the draft {draft_model} has {total} (num_hidden_layers); keep 1..{total - 1}"
        )
    source_sha = drafter_digest(source)
    slot = truncated_dir(draft_model, layers, home)
    if _matching(slot, source_sha, layers):
        return TruncatedDrafter(slot, layers, total, source_sha, drafter_digest(slot), built=False)
    if slot.exists():  # a stale slot (its source changed): replaced whole
        shutil.rmtree(slot)
    slot.parent.mkdir(parents=True, exist_ok=True)
    truncation = {
        "source": draft_model,
        "source_sha256": source_sha,
        "source_layers": total,
        "layers": layers,
    }
    with atomic_dir(slot) as tmp:
        _run_worker(
            {
                "op": "truncate",
                "source": str(source),
                "out": str(tmp),
                "layers": layers,
                "truncation_key": TRUNCATION_KEY,
                "truncation": truncation,
                "threads": 1,
            }
        )
        (tmp / "README.md").write_text(
            f"# {draft_model}, first {layers} of {total} decoder layers\n\nBuilt by specgauge "
            f"(tasks/drafters/truncate.py) from the draft whose drafter digest is {source_sha}: the dropped "
            "layers' weights removed, config num_hidden_layers changed, everything else as in the source.\n",
            encoding="utf-8",
        )
    return TruncatedDrafter(slot, layers, total, source_sha, drafter_digest(slot), built=True)


def prepare_truncated(spec: ExperimentSpec, source: str = "spec") -> list[TruncatedDrafter]:
    """Each distinct (draft_model, draft_layers) of the spec's variants, found or built; refused as
    `SOURCE: variants[i].draft_layers: message`."""
    done: dict[tuple[str, int], TruncatedDrafter] = {}
    for i, variant in enumerate(spec.variants):
        if variant.draft_layers is None or not variant.draft_model:
            continue
        key = (variant.draft_model, variant.draft_layers)
        if key in done:
            continue
        if spec.launcher.kind != "local":
            raise InputError(
                f"{source}: variants[{i}].draft_layers: a truncated draft is built on this machine, "
                f"so only the local launcher serves one (launcher {spec.launcher.kind!r})"
            )
        try:
            done[key] = ensure_truncated(*key)
        except InputError as exc:
            raise InputError(f"{source}: variants[{i}].draft_layers: {exc}") from None
    return list(done.values())
