"""Writing raw artifacts: each written once, atomically, never overwritten.

A directory artifact is assembled under a temporary name ('.tmp-...') beside its final place and renamed
into place, so a reader sees either nothing or the whole artifact; a single-file artifact (a gate verdict,
a run record) is hard-linked into place from a temporary file. Documents are written from their models
(artifacts.documents) and read back through them.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel

from specgauge.errors import ArtifactError

Document = TypeVar("Document", bound=BaseModel)


def _temporary_beside(final: Path) -> Path:
    """A fresh temporary name beside `final` (same filesystem, so the last step is atomic); refuses an
    existing `final`: raw artifacts are never overwritten."""
    if final.exists():
        raise ArtifactError(f"artifact {final} exists: raw artifacts are never overwritten")
    final.parent.mkdir(parents=True, exist_ok=True)
    return final.parent / f".tmp-{final.name}-{uuid.uuid4().hex[:8]}"


@contextmanager
def atomic_dir(final: Path) -> Iterator[Path]:
    """Yield a temporary directory; on success rename it to `final`, on failure remove it."""
    final = Path(final)
    tmp = _temporary_beside(final)
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


def _plain(data: Any) -> Any:
    return data.model_dump(mode="json") if isinstance(data, BaseModel) else data


def write_json(path: Path, data: Any) -> None:
    """A JSON document (a model is written as its JSON dump, nulls included)."""
    Path(path).write_text(json.dumps(_plain(data), indent=2, sort_keys=False, default=str) + "\n")


def write_json_atomic(final: Path, data: Any) -> None:
    """A single-file artifact (e.g. a gate verdict), never overwritten."""
    final = Path(final)
    tmp = _temporary_beside(final)
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


def read_document(path: Path, model: type[Document]) -> Document:
    """A document read through its model. Raises OSError, ValueError (bad JSON) or pydantic's
    ValidationError (a ValueError too) for a file that is not one."""
    return model.model_validate_json(Path(path).read_bytes())
