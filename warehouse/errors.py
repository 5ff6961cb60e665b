"""Warehouse errors, catchable by meaning. Each says which file, artifact or lock is concerned."""

from __future__ import annotations

from collections.abc import Sequence

from specgauge.errors import ArtifactError, SpecgaugeError


class WarehouseError(SpecgaugeError):
    """Something about the DuckDB warehouse itself (missing, locked, schema)."""


class WarehouseMissing(WarehouseError):
    """No warehouse file where one was expected."""


class WarehouseBusy(WarehouseError):
    """Another process writes the warehouse and did not finish in time. Transient: a retry may help."""


class WarehouseDamaged(WarehouseError):
    """The warehouse file is not a valid DuckDB database, or its schema is broken. The raw artifacts are the
    source of truth: `specgauge warehouse rebuild` sets the file aside (kept, renamed) and builds a new one.
    `reason`: what is wrong, in a few words."""

    def __init__(self, message: str, *, reason: str = "") -> None:
        self.reason = reason or message
        super().__init__(message)


class WarehouseFull(WarehouseError):
    """The disk filled up during a warehouse write: the write was rolled back (or, where it had already
    reached the file, the readers' snapshot could not follow it). Free space and run the command again."""


class NotAWarehouse(WarehouseError):
    """A path given as the warehouse names a file that is not a DuckDB database specgauge may write."""


class MigrationError(WarehouseError):
    """A migration file is malformed, failed to apply, or was edited after it was applied."""


class ArtifactChanged(ArtifactError):
    """An immutable raw artifact's content differs from what the warehouse ingested under the same key."""


class ArtifactInvalid(ArtifactError):
    """A raw artifact that cannot be read or fails validation: it is quarantined, never half-loaded.

    `file` is the artifact file concerned (e.g. requests.parquet), `column` the column or JSON field,
    `rows` a few failing row indices (0-based, within that file).
    """

    def __init__(
        self,
        reason: str,
        *,
        file: str | None = None,
        column: str | None = None,
        rows: Sequence[int] = (),
    ) -> None:
        self.reason, self.file, self.column, self.rows = reason, file, column, list(rows)
        where = ": ".join(x for x in (file, f"column {column}" if column else None) if x)
        shown = f" (rows {', '.join(str(r) for r in self.rows)})" if self.rows else ""
        super().__init__(f"{where}: {reason}{shown}" if where else f"{reason}{shown}")
