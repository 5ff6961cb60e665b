"""Where a truncated draft model lives: a variant's `draft_model` cut to its first `draft_layers` decoder
layers (experiments.spec.Variant.draft_layers) is built once by tasks/drafters/truncate.py into
SPECGAUGE_HOME/cache/drafters/truncated/<slot>/ and served from there.

The slot is named by the draft as the spec writes it and the layer count, so that a variant knows the
path it serves without hashing the source (a large draft is many GB): what the slot holds is tied to the
source's content by its config (`specgauge_truncation.source_sha256`, specgauge.checkpoints'
drafter_digest), which the builder checks before every campaign and rebuilds on a mismatch. Its own
identity, recorded for each deployment, is drafter_digest of the truncated folder, like any drafter's."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

# The config block the builder writes; its source_sha256 ties the slot to the source's content.
TRUNCATION_KEY = "specgauge_truncation"


def truncated_dir(draft_model: str, layers: int, home: Path | None = None) -> Path:
    """The slot of `draft_model` (as the spec writes it) cut to `layers` decoder layers."""
    if home is None:
        from specgauge.settings import get_settings

        home = get_settings().home
    key = hashlib.sha256(f"{draft_model}\0{layers}".encode()).hexdigest()[:16]
    stem = re.sub(r"[^A-Za-z0-9._-]+", "-", Path(draft_model.rstrip("/")).name)[:48] or "draft"
    return Path(home) / "cache" / "drafters" / "truncated" / f"{stem}-{layers}l-{key}"
