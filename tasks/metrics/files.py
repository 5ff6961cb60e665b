"""Saved /metrics snapshots read from files (the `metrics-delta` and `profile analyze --counters` inputs).

A real snapshot is kilobytes to a few megabytes; a path such as /dev/zero or a huge file must not take the
machine's memory, so at most MAX_SNAPSHOT_BYTES are read and anything longer is refused."""

from __future__ import annotations

from pathlib import Path

from specgauge.errors import MetricsError
from specgauge.files import read_bounded_text

MAX_SNAPSHOT_BYTES = 64 * 1024 * 1024  # 64 MiB: far above any vLLM /metrics text


def read_snapshot(path: Path | str, limit: int = MAX_SNAPSHOT_BYTES) -> str:
    """The text of a saved /metrics snapshot; MetricsError naming the file when it cannot be read, is not
    UTF-8 text, or is longer than `limit` bytes (read no further than that)."""
    return read_bounded_text(path, limit, MetricsError, "a /metrics snapshot")
