"""A campaign's progress in the Prefect UI: a progress artifact (cells done of total) updated as cells
finish, and one table artifact per cell with its headline figures or why it failed."""

from __future__ import annotations

from typing import Any

from prefect.artifacts import create_progress_artifact, create_table_artifact, update_progress_artifact

from specgauge.progress import Reporter
from tasks.outcome import artifact_key


class ArtifactProgress(Reporter):
    """Cells done of total, as the campaign run's progress artifact (key `<campaign>-progress`)."""

    def __init__(self) -> None:
        self.campaign_id = ""
        self.total = 0
        self.done = 0
        self.not_ok: list[str] = []
        self.artifact_id: Any = None

    def campaign(self, cells: int, deployments: int, campaign_id: str = "") -> None:
        self.campaign_id, self.total = campaign_id, cells
        self.artifact_id = create_progress_artifact(
            progress=0.0,
            key=artifact_key(self.campaign_id) + "-progress",
            description=self._description(deployments),
        )

    def cell_done(self, cell_id: str, status: str) -> None:
        self.done += 1
        if status != "ok":
            self.not_ok.append(cell_id)
        if self.artifact_id is not None and self.total:
            update_progress_artifact(
                self.artifact_id, progress=100.0 * self.done / self.total, description=self._description()
            )

    def _description(self, deployments: int | None = None) -> str:
        head = f"campaign {self.campaign_id}: {self.done} of {self.total} cells done"
        if deployments is not None:
            head += f" ({deployments} deployments)"
        if self.not_ok:
            head += f"; not ok: {', '.join(self.not_ok[-5:])}" + (" ..." if len(self.not_ok) > 5 else "")
        return head


def cell_artifact(campaign_id: str, cell_id: str, row: dict[str, Any], line: str) -> None:
    """One cell's headline figures as a table artifact; its description is the run log's line for the cell
    (the figures, or the one-line reason it failed)."""
    create_table_artifact(key=artifact_key(f"{campaign_id}-{cell_id}"), table=[row], description=line)
