"""Saved /metrics snapshots read from files (the `metrics-delta` and `profile analyze --counters` inputs).

A real snapshot is kilobytes to a few megabytes; a path such as /dev/zero or a huge file must not take the
machine's memory, so at most MAX_SNAPSHOT_BYTES are read and anything longer is refused."""

from __future__ import annotations

from pathlib import Path

from specgauge.errors import MetricsError

MAX_SNAPSHOT_BYTES = 64 * 1024 * 1024  # 64 MiB: far above any vLLM /metrics text


def read_snapshot(path: Path | str, limit: int = MAX_SNAPSHOT_BYTES) -> str:
    """The text of a saved /metrics snapshot; MetricsError naming the file when it cannot be read, is not
    UTF-8 text, or is longer than `limit` bytes (read no further than that)."""
    path = Path(path)
    try:
        with open(path, "rb") as fh:
            data = fh.read(limit + 1)
    except OSError as exc:
        raise MetricsError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if len(data) > limit:
        raise MetricsError(
            f"{path}: larger than {limit // (1024 * 1024)} MiB (read no further): not a /metrics snapshot"
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise MetricsError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
