"""Simulation results into the warehouse tables `tree_sim_runs`, `tree_sim`, `tree_sim_validation`
(migration 0009_tree_sim.sql), and back out for the report.

A simulation is keyed by (campaign_id, settings_key): re-running the same settings on the same campaign
deletes that key's rows in all three tables and inserts the new ones in one transaction, so a reader sees the
previous simulation or the new one, never a mix (as analysis/store.py does for the analysis tables). The
caller holds the warehouse writer (warehouse.db.writer).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

import duckdb
import polars as pl

RUNS_TABLE = "tree_sim_runs"
PROJECTIONS_TABLE = "tree_sim"
VALIDATION_TABLE = "tree_sim_validation"
TABLES = (RUNS_TABLE, PROJECTIONS_TABLE, VALIDATION_TABLE)


def settings_key(settings: dict[str, Any]) -> str:
    """A stable key of the simulation's settings (what makes a re-run the same simulation)."""
    return hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()[:16]


def store_simulation(
    con: duckdb.DuckDBPyConnection,
    campaign_id: str,
    key: str,
    simulation_id: str,
    run: dict[str, Any],
    projections: pl.DataFrame,
    validation: pl.DataFrame,
) -> dict[str, int]:
    """Replace (campaign_id, key)'s rows with these, in one transaction. Returns rows written per table."""
    ids = [pl.lit(campaign_id).alias("campaign_id"), pl.lit(key).alias("settings_key")]
    ids.append(pl.lit(simulation_id).alias("simulation_id"))
    frames = {
        RUNS_TABLE: pl.DataFrame([run]).with_columns(*ids),
        PROJECTIONS_TABLE: projections.with_columns(*ids),
        VALIDATION_TABLE: validation.with_columns(*ids),
    }
    written: dict[str, int] = {}
    con.execute("BEGIN TRANSACTION")
    try:
        for table in TABLES:
            con.execute(f"DELETE FROM {table} WHERE campaign_id = ? AND settings_key = ?", [campaign_id, key])
        for table, frame in frames.items():
            written[table] = _insert(con, table, frame)
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise
    return written


def _insert(con: duckdb.DuckDBPyConnection, table: str, frame: pl.DataFrame) -> int:
    """Append the frame's rows to `table`, column by name; the rows written."""
    if not frame.is_empty():
        con.register("tree_sim_frame", frame)
        con.execute(f"INSERT INTO {table} BY NAME SELECT * FROM tree_sim_frame")
        con.unregister("tree_sim_frame")
    return frame.height


@dataclass(frozen=True)
class TreeSim:
    """A campaign's latest simulation as the report reads it."""

    run: dict[str, Any]
    projections: pl.DataFrame
    validation: pl.DataFrame


def load_tree_sim(con: duckdb.DuckDBPyConnection, campaign_id: str) -> TreeSim | None:
    """The campaign's latest simulation (None when it has none, or the warehouse predates the tables)."""
    known = con.execute(
        "SELECT count(*) FROM information_schema.tables WHERE table_name = ?", [RUNS_TABLE]
    ).fetchall()
    if not known[0][0]:
        return None
    runs = con.sql(
        f"SELECT * FROM {RUNS_TABLE} WHERE campaign_id = ? ORDER BY created_utc DESC, simulation_id DESC "
        "LIMIT 1",
        params=[campaign_id],
    ).pl()
    if runs.is_empty():
        return None
    run = runs.row(0, named=True)
    ids = [campaign_id, run["simulation_id"]]
    where = "WHERE campaign_id = ? AND simulation_id = ?"
    projections = con.sql(
        f"SELECT * FROM {PROJECTIONS_TABLE} {where} ORDER BY stratum, concurrency, shape", params=ids
    ).pl()
    validation = con.sql(f"SELECT * FROM {VALIDATION_TABLE} {where} ORDER BY capture_id", params=ids).pl()
    if projections.is_empty() and validation.is_empty():
        return None
    return TreeSim(run, projections, validation)
