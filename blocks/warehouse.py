"""The warehouse block: where a team's DuckDB warehouse and raw artifacts live."""

from __future__ import annotations

from pathlib import Path

from prefect.blocks.core import Block
from pydantic import Field


class WarehouseBlock(Block):
    """Paths of the DuckDB warehouse and of the raw artifacts it is built from."""

    _block_type_name = "specgauge warehouse"
    _block_type_slug = "specgauge-warehouse"
    _description = "specgauge's DuckDB warehouse file and raw-artifact directory."

    path: str = Field(description="DuckDB file of the warehouse.")
    raw_dir: str = Field(
        description="Directory of immutable raw artifacts (the warehouse's source of truth)."
    )

    def warehouse_path(self) -> Path:
        return Path(self.path).expanduser()

    def raw_path(self) -> Path:
        return Path(self.raw_dir).expanduser()
