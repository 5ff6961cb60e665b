"""`specgauge import seed`: the reference study's results translated into a raw campaign
(tasks.imports.reference_study), then loaded by the normal ingest (warehouse.ingest), both under the
campaign's writer lock so that a second import of the same tree waits, then finds every cell written."""

from dataclasses import dataclass
from pathlib import Path

from artifacts import layout
from artifacts.store import campaign_writer
from specgauge.errors import ArtifactError
from specgauge.locks import WaitCallback
from tasks.imports.reference_study import (
    ReferenceTranslation,
    campaign_id_for,
    read_reference,
    write_reference,
)
from warehouse.ingest import IngestReport, ingest_raw


@dataclass
class SeedImport(ReferenceTranslation):
    """What one `import_seed` did: the translation, and the ingest's report (None when nothing was
    importable)."""

    ingest: IngestReport | None = None

    @property
    def exit_code(self) -> int:
        """0: imported, nothing damaged; 1: something damaged or quarantined (the rest imported);
        2: nothing importable found."""
        code = super().exit_code
        if code == 0 and self.ingest is not None and not self.ingest.ok:
            return 1
        return code


def import_seed(
    results_dir: Path,
    raw_dir: Path,
    warehouse: Path | None,
    campaign: str | None = None,
    *,
    lock_timeout_s: float | None = None,
    on_wait: WaitCallback | None = None,
) -> SeedImport:
    """Translate the reference results under `results_dir` into RAW/seed-<name>/ under `raw_dir`, then
    ingest that campaign into `warehouse` (None: the settings' warehouse). Returns what was written, what
    was already there and what was skipped (damaged files flagged). Raises ArtifactError when the folder
    is missing or the campaign id belongs to a campaign that was not imported, InputError when a name from
    the data cannot be a folder name. Another import of the same campaign running: waits for it (up to
    `lock_timeout_s`, None: as long as it takes; `on_wait` hears why), as for the warehouse's lock."""
    results_dir = Path(results_dir)
    if not results_dir.is_dir():
        raise ArtifactError(f"{results_dir}: no such results folder")
    campaign_id = campaign_id_for(results_dir, campaign)
    directory = layout.campaign_dir(Path(raw_dir), campaign_id)
    result = SeedImport(results_dir=results_dir, campaign_id=campaign_id, campaign_dir=directory)
    cells = read_reference(result)
    if not cells:
        return result
    with campaign_writer(directory, timeout_s=lock_timeout_s, on_wait=on_wait):
        write_reference(result, cells)
        result.ingest = ingest_raw(directory, warehouse, lock_timeout_s=lock_timeout_s, on_wait=on_wait)
    return result
