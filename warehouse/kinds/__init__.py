"""The artifact kinds the warehouse ingests, one module each: where the kind's artifacts are (discovery),
how its files become rows (frames), what those rows must satisfy (its tables' pandera models), and how it is
keyed and hashed (its ArtifactKind, `KIND`; a module of related kinds names each: decisions.py has
DECISIONS_KIND and PROMOTIONS_KIND). The ingest engine (warehouse.ingest) walks KINDS in this order.

What kinds share has one home: base.py (finding artifacts: `file_kind`, `directory_kind`; holding a
document to its place: `check_place`) and columns.py (the column sets main tables share: `main_table`).

A new table: a module here (copy the closest one), its `KIND` in KINDS, and a migration creating the table
(warehouse/migrations/NNNN_name.sql).
"""

from __future__ import annotations

from pandera.polars import DataFrameModel

from warehouse.kinds import (
    adaptations,
    calibration,
    campaigns,
    capacity,
    captures,
    cells,
    decisions,
    deployments,
    drafters,
    gates,
    gpu_telemetry,
    profiles,
    provenance,
    sampling_checks,
)
from warehouse.kinds.base import ArtifactKind, ArtifactRef

__all__ = ["KINDS", "MODELS", "ArtifactKind", "ArtifactRef"]

KINDS: tuple[ArtifactKind, ...] = (
    campaigns.KIND,
    deployments.KIND,
    provenance.KIND,  # RAW/<campaign>/environments/: the engines' package locks
    cells.KIND,
    gpu_telemetry.KIND,  # after cells: the same cell directories
    captures.KIND,
    profiles.KIND,
    gates.KIND,  # after captures
    capacity.KIND,
    calibration.KIND,
    adaptations.KIND,  # after cells: an adaptation names its cells
    decisions.DECISIONS_KIND,  # after cells: a decision's verification is ordinary cells
    decisions.PROMOTIONS_KIND,  # after decisions: a promotion answers one
    sampling_checks.KIND,
    drafters.KIND,  # RAW/drafters/, beside the campaigns
)

# Every table's model, by table.
MODELS: dict[str, type[DataFrameModel]] = {t: m for kind in KINDS for t, m in kind.models.items()}
