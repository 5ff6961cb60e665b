"""Writing raw artifacts: each written once, atomically, never overwritten.

A directory artifact is assembled under a temporary name ('.tmp-...') beside its final place and renamed
into place, so a reader sees either nothing or the whole artifact; a single-file artifact (a gate verdict,
a run record) is hard-linked into place from a temporary file. Documents are written from their models
(artifacts.documents) and read back through them.

A temporary's name carries its writer's pid (`.tmp-<name>-p<pid>-<hex>`): what a killed writer left is
removed by the next writer of that campaign (`campaign_writer`, under the campaign's lock), and a live
writer's temporary never is. The last guard against names from data: an artifact whose own name is not one
plain name (layout.part_problem) is refused here too.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import psutil
from pydantic import BaseModel

from artifacts import layout
from specgauge.errors import ArtifactError
from specgauge.locks import WaitCallback, WriterBusy, one_writer

log = logging.getLogger("specgauge.artifacts")

Document = TypeVar("Document", bound=BaseModel)

TEMPORARY_PREFIX = ".tmp-"
_WRITER_PID = re.compile(r"-p(?P<pid>\d+)-[0-9a-f]{8}$")


def _temporary_beside(final: Path) -> Path:
    """A fresh temporary name beside `final` (same filesystem, so the last step is atomic); refuses an
    existing `final`: raw artifacts are never overwritten."""
    problem = layout.part_problem(final.name)
    if problem or final.name in ("", ".", ".."):
        raise ArtifactError(f"artifact {final}: its name {problem or 'is not a name'}: refused")
    if final.exists():
        raise ArtifactError(f"artifact {final} exists: raw artifacts are never overwritten")
    final.parent.mkdir(parents=True, exist_ok=True)
    return final.parent / f"{TEMPORARY_PREFIX}{final.name}-p{os.getpid()}-{uuid.uuid4().hex[:8]}"


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


# ---------------------------------------------------------------------------------- one writer per campaign


def temporary_writer(name: str) -> int | None:
    """The pid of the process that made a temporary (None for a name without one: written before temporaries
    carried their writer's pid)."""
    match = _WRITER_PID.search(name)
    return int(match["pid"]) if match else None


def leftover_temporaries(directory: Path) -> list[Path]:
    """Temporaries under a campaign folder whose writer is gone (killed, crashed), outermost only. A
    temporary of a live process is not one (psutil.pid_exists; this process's own count as live)."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    found: list[Path] = []
    for root, dirs, files in os.walk(directory):
        for name in [*dirs, *files]:
            if not name.startswith(TEMPORARY_PREFIX):
                continue
            pid = temporary_writer(name)
            if pid is None or not psutil.pid_exists(pid):
                found.append(Path(root) / name)
        dirs[:] = [d for d in dirs if not d.startswith(".")]  # never into a temporary
    return sorted(found)


def clean_temporaries(directory: Path) -> list[Path]:
    """Remove what killed writers left under a campaign folder (half-written cells, deployments, documents);
    returns what was removed. Call it holding the campaign's lock (`campaign_writer`)."""
    removed = []
    for path in leftover_temporaries(directory):
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
        if not path.exists():
            removed.append(path)
    if removed:
        log.warning(
            "removed %d half-written artifact(s) a killed writer left under %s: %s",
            len(removed),
            directory,
            ", ".join(str(p.relative_to(directory)) for p in removed[:10])
            + (" ..." if len(removed) > 10 else ""),
        )
    return removed


class CampaignBusy(WriterBusy):
    """Another live process writes the same campaign (a second `campaign run`, or an import of the same
    tree into the same home)."""


@contextmanager
def campaign_writer(
    directory: Path, *, timeout_s: float | None = 0, on_wait: WaitCallback | None = None
) -> Iterator[Path]:
    """Be the one writer of the campaign folder `directory` (the lock `RAW/.<campaign_id>.writer.lock`, the
    holder's note beside it); then remove what killed writers left in the folder. `timeout_s=0` (default) refuses at once
    with CampaignBusy naming the holder; otherwise wait up to `timeout_s` (None: as long as it takes).
    Re-entrant within one process (the CLI and the flow it runs both take it)."""
    directory = Path(directory)
    with one_writer(
        layout.writer_lock_file(directory),
        layout.writer_note_file(directory),
        what=f"campaign {directory.name} ({directory})",
        timeout_s=timeout_s,
        on_wait=on_wait,
        busy=CampaignBusy,
    ):
        clean_temporaries(directory)
        yield directory
