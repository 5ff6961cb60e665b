"""Reading a user's file without trusting its size: at most a limit, then a clear refusal.

A path such as /dev/zero, or a huge file given by mistake, must not take the machine's memory; each reader
states its own limit (far above any real input of its kind) and its own error type.
"""

from __future__ import annotations

from pathlib import Path

from specgauge.errors import SpecgaugeError


def read_bounded_text(path: Path | str, limit: int, error: type[SpecgaugeError], kind: str) -> str:
    """The file's UTF-8 text, reading no more than `limit` + 1 bytes; `error` naming the file when it cannot
    be read, is longer than `limit`, or is not UTF-8 (`kind` says what the file should have been)."""
    path = Path(path)
    try:
        with open(path, "rb") as fh:
            data = fh.read(limit + 1)
    except OSError as exc:
        raise error(f"{path}: cannot read: {exc.strerror or exc}") from None
    if len(data) > limit:
        size = f"{limit >> 20} MiB" if limit >= 1 << 20 and limit % (1 << 20) == 0 else f"{limit >> 10} KiB"
        raise error(f"{path}: larger than {size} (read no further): not {kind}")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
