"""Analysis results into the warehouse tables `analysis_*` (migration 0004_analysis.sql).

Every row carries campaign_id and analysis_id. Re-analysing a campaign replaces all of its rows in every
analysis table within one transaction, so a reader sees either the previous analysis or the new one, never a
mix; the caller holds the warehouse writer (warehouse.db.writer), which takes the writer lock.
"""

from __future__ import annotations

from typing import Any

import duckdb
import polars as pl

# table name -> the key of the results dict that fills it
ANALYSIS_TABLES = {
    "analysis_speedup": "speedup",
    "analysis_decisions": "decisions",
    "analysis_fits": "fits",
    "analysis_depth": "depth",
    "analysis_choice": "choice",
    "analysis_capacity": "capacity",
    "analysis_crossover": "crossover",
    "analysis_validity": "validity",
    "analysis_confounds": "confounds",
    "analysis_acceptance": "acceptance",
}
RUNS_TABLE = "analysis_runs"


def store_results(
    con: duckdb.DuckDBPyConnection,
    campaign_id: str,
    analysis_id: str,
    run: dict[str, Any],
    tables: dict[str, pl.DataFrame],
) -> dict[str, int]:
    """Replace the campaign's analysis rows with these, in one transaction. Returns rows written per table."""
    written: dict[str, int] = {}
    con.execute("BEGIN TRANSACTION")
    try:
        for table in (RUNS_TABLE, *ANALYSIS_TABLES):
            con.execute(f"DELETE FROM {table} WHERE campaign_id = ?", [campaign_id])
        run_frame = pl.DataFrame([{"campaign_id": campaign_id, "analysis_id": analysis_id, **run}])
        con.register("analysis_frame", run_frame)
        con.execute(f"INSERT INTO {RUNS_TABLE} BY NAME SELECT * FROM analysis_frame")
        written[RUNS_TABLE] = 1
        for table, key in ANALYSIS_TABLES.items():
            frame = tables[key]
            if frame.is_empty():
                written[table] = 0
                continue
            frame = frame.with_columns(
                pl.lit(campaign_id).alias("campaign_id"), pl.lit(analysis_id).alias("analysis_id")
            )
            con.register("analysis_frame", frame)
            con.execute(f"INSERT INTO {table} BY NAME SELECT * FROM analysis_frame")
            written[table] = frame.height
        con.unregister("analysis_frame")
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise
    return written
