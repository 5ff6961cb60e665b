"""Which drafter a deployment served: a content hash of its weights and config, and its training card.

Two campaigns with different heads (or draft models) under the same path must never be pooled; the hash
says whether they were the same drafter, the card says how it was made."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from specgauge.errors import InputError
from specgauge.provenance import sha256_file

# What makes the drafter what it is: its weights and the config the engine builds it from.
_IDENTITY_GLOBS = ("*.safetensors", "config.json")
# How it was made: kept beside it, recorded but not part of its identity (a card edit is not a new head).
CARD_FILES = ("README.md", "training.json")
_CHUNK = 1 << 20


class IncompleteDrafter(InputError, FileNotFoundError):
    """A drafter folder without its config.json or weights: bad input to the CLI (one `error:` line, exit 2),
    still a FileNotFoundError for the callers that skip such a folder."""


def drafter_files(path: Path | str) -> list[Path]:
    """The files whose content is the drafter's identity, in a stable (name) order."""
    directory = Path(path)
    files = {f for pattern in _IDENTITY_GLOBS for f in directory.glob(pattern) if f.is_file()}
    return sorted(files, key=lambda f: f.name)


def drafter_digest(path: Path | str) -> str:
    """sha256 over the drafter's safetensors files and config.json, streamed (a 70B draft need not fit in
    memory). Each file enters as its name, its size and its bytes, so moving bytes between files or
    renaming one changes the digest; the directory's own location does not."""
    directory = Path(path)
    files = drafter_files(directory)
    if not any(f.suffix == ".safetensors" for f in files) or not (directory / "config.json").is_file():
        raise IncompleteDrafter(
            f"{directory}: a drafter needs config.json and at least one .safetensors file (no weights here)"
        )
    digest = hashlib.sha256()
    for file in files:
        digest.update(f"{file.name}\0{file.stat().st_size}\0".encode())
        with open(file, "rb") as fh:
            while chunk := fh.read(_CHUNK):
                digest.update(chunk)
    return digest.hexdigest()


def training_card(path: Path | str) -> dict[str, Any] | None:
    """The card files present (name -> sha256), and the scalar facts of training.json (its loss history
    stays in the file). None when the drafter has no card."""
    directory = Path(path)
    present = [directory / name for name in CARD_FILES if (directory / name).is_file()]
    if not present:
        return None
    card: dict[str, Any] = {"files": {f.name: sha256_file(f) for f in present}}
    training = directory / "training.json"
    if training.is_file():
        try:
            data = json.loads(training.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            data = None
        if isinstance(data, dict):
            card["training"] = {k: v for k, v in data.items() if isinstance(v, str | int | float | bool)}
    return card


def drafter_record(method: str, path: str, local_dir: Path | str | None) -> dict[str, Any]:
    """`{method, path, sha256, card}` for a deployment's facts. `path` as the spec gave it; `local_dir` the
    directory it resolves to here, or None where it is not readable from here (a hub id, a cluster path):
    then the hash and card are None and the engine's host is the only one that could tell."""
    record: dict[str, Any] = {"method": method, "path": path, "sha256": None, "card": None}
    if local_dir is not None and Path(local_dir).is_dir():
        try:
            record["sha256"] = drafter_digest(local_dir)
        except FileNotFoundError:
            pass  # not a checkpoint directory: nothing to hash; the engine will say what is wrong
        record["card"] = training_card(local_dir)
    return record
