"""Raw artifacts: one directory per cell (or capture, profile, verdict), written once, atomically.

The directory is assembled under a temporary name beside its final place and renamed into place, so a
reader sees either nothing or the whole artifact; an existing artifact is never overwritten. Layout:

    RAW/<campaign_id>/campaign.json
    RAW/<campaign_id>/deployments/<deployment_id>/deployment.json, engine.log, command.txt
    RAW/<campaign_id>/cells/<cell_id>.a<attempt>/meta.json, summary.json, requests.parquet,
                                                 gauges.parquet, metrics_before.txt, metrics_after.txt
    RAW/<campaign_id>/captures/<capture_id>/meta.json, outputs.parquet
    RAW/<campaign_id>/gates/<verdict_id>.json
    RAW/<campaign_id>/profiles/<profile_id>/...
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from specgauge.errors import ArtifactError

CELL_FILES = (
    "meta.json",
    "summary.json",
    "requests.parquet",
    "gauges.parquet",
    "metrics_before.txt",
    "metrics_after.txt",
)


@contextmanager
def atomic_dir(final: Path) -> Iterator[Path]:
    """Yield a temporary directory; on success rename it to `final`, on failure remove it."""
    final = Path(final)
    if final.exists():
        raise ArtifactError(f"artifact {final} exists: raw artifacts are never overwritten")
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.parent / f".tmp-{final.name}-{uuid.uuid4().hex[:8]}"
    try:
        tmp.mkdir()
    except OSError as exc:
        raise ArtifactError(f"could not write artifact {final}: {exc}") from exc
    try:
        try:
            yield tmp
        except ArtifactError:
            raise
        except Exception as exc:  # a write failed (disk full, quota, ...): say which artifact, keep nothing
            raise ArtifactError(
                f"could not write artifact {final}: {exc}; nothing was kept (its temporary directory "
                "was removed)"
            ) from exc
        for path in tmp.iterdir():
            _fsync(path)
        try:
            os.rename(tmp, final)  # atomic; fails if final appeared meanwhile (non-empty)
        except OSError as exc:
            raise ArtifactError(f"could not move artifact into {final}: {exc}") from exc
        _fsync(final.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _fsync(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")


def write_json_atomic(final: Path, data: Any) -> None:
    """A single-file artifact (e.g. a gate verdict), never overwritten."""
    final = Path(final)
    if final.exists():
        raise ArtifactError(f"artifact {final} exists: raw artifacts are never overwritten")
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.parent / f".tmp-{final.name}-{uuid.uuid4().hex[:8]}"
    try:
        write_json(tmp, data)
        _fsync(tmp)
        os.link(tmp, final)  # fails if final exists: no overwrite even under a race
    except FileExistsError:
        raise ArtifactError(f"artifact {final} exists: raw artifacts are never overwritten") from None
    except OSError as exc:  # disk full, quota, ...: no half-written file stays behind
        raise ArtifactError(f"could not write artifact {final}: {exc}; nothing was kept") from exc
    finally:
        tmp.unlink(missing_ok=True)


def read_json(path: Path) -> Any:
    return json.loads(Path(path).read_text())


def cell_attempts(cells_dir: Path, cell_id: str) -> list[Path]:
    """Existing attempts of one cell, oldest first."""
    if not cells_dir.exists():
        return []
    found = [
        p for p in cells_dir.glob(f"{cell_id}.a*") if p.is_dir() and p.name[len(cell_id) + 2 :].isdigit()
    ]
    return sorted(found, key=lambda p: int(p.name[len(cell_id) + 2 :]))


def cell_is_complete_ok(path: Path) -> bool:
    """A cell that needs no re-run: every file present and its summary says ok."""
    if not all((path / name).exists() for name in CELL_FILES):
        return False
    try:
        return read_json(path / "summary.json").get("status") == "ok"
    except (OSError, json.JSONDecodeError):
        return False


def next_cell_dir(cells_dir: Path, cell_id: str) -> Path:
    attempts = cell_attempts(cells_dir, cell_id)
    last = int(attempts[-1].name[len(cell_id) + 2 :]) if attempts else 0
    return cells_dir / f"{cell_id}.a{last + 1}"
