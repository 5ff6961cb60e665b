"""What the analysis reads from the warehouse: one campaign's rows, as polars frames, read once.

Every question module is a plain function of `CampaignData` (and `AnalysisSettings`), so tests and the flow
call them the same way. `load_campaign(con, campaign_id)` runs the SQL over the warehouse views (v_cells,
v_speedup, v_acceptance_positions, v_capacity, v_gate, v_profile_waste) and the tables behind them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import duckdb
import polars as pl

from analysis.history import launch_history
from analysis.stats import LaunchVariance
from experiments.spec import Variant
from specgauge.errors import InputError

GAIN_METRICS = ("throughput", "ttft_p50", "ttft_p95", "tpot_p50", "tpot_p95")
"""Speedups of Q1, as v_speedup names them `<metric>_speedup`; every one is > 1 when the variant is faster."""


class CampaignNotFound(InputError):
    """The warehouse has no such campaign (or none at all)."""


@dataclass(frozen=True)
class AnalysisSettings:
    """The knobs of one analysis run; recorded with its results (analysis_runs)."""

    confidence: float = 0.95
    gain_metric: str = "throughput"  # the decision rule's gain: output-throughput speedup

    def __post_init__(self) -> None:
        if not 0 < self.confidence < 1:
            raise InputError(f"confidence must be between 0 and 1, got {self.confidence}")
        if self.gain_metric not in GAIN_METRICS:
            raise InputError(
                f"gain_metric must be one of {', '.join(GAIN_METRICS)}, got {self.gain_metric!r}"
            )


@dataclass
class CampaignData:
    campaign_id: str
    campaign: dict[str, Any]  # the campaigns row, spec parsed
    cells: pl.DataFrame  # v_cells
    speedup: pl.DataFrame  # v_speedup
    acceptance: pl.DataFrame  # v_acceptance
    positions: pl.DataFrame  # v_acceptance_positions
    capacity: pl.DataFrame  # v_capacity
    gates: pl.DataFrame  # v_gate, latest verdict per variant
    deployments: pl.DataFrame
    waste: pl.DataFrame  # v_profile_waste, latest window per key (may be empty)
    notes: list[str] = field(default_factory=list)
    searches: pl.DataFrame = field(default_factory=pl.DataFrame)  # capacity_searches (may be empty)
    aa: pl.DataFrame = field(
        default_factory=pl.DataFrame
    )  # v_aa: the A/A control against plain (may be empty)
    client_calibration: dict[str, Any] | None = None  # the campaign's latest client_calibrations row
    # measured, ok requests of speculative cells that carry their own acceptance (vLLM's per-request block)
    request_acceptance: pl.DataFrame = field(default_factory=pl.DataFrame)
    # plain's launch-to-launch variance pooled from earlier campaigns launched the same way (analysis.history);
    # None without such history or with `analysis.pool_history: false`
    history: LaunchVariance | None = None
    # every ok cell (the A/A arm's too): who else used the host's CPU while it measured (tasks/metrics/host_load),
    # and the load it reached (achieved_concurrency against a closed-loop cell's C)
    host_load: pl.DataFrame = field(default_factory=pl.DataFrame)
    # v_gpu_telemetry: per cell and GPU, or absent and why (tasks/metrics/gpu_telemetry.py; empty: older warehouse)
    gpu_telemetry: pl.DataFrame = field(default_factory=pl.DataFrame)

    @property
    def spec(self) -> dict[str, Any]:
        return self.campaign.get("spec") or {}

    @property
    def slo(self) -> tuple[float | None, float | None]:
        slo = self.spec.get("slo") or {}
        ttft = self.campaign.get("slo_ttft_p99_s") or slo.get("ttft_p99_s")
        tpot = self.campaign.get("slo_tpot_p99_s") or slo.get("tpot_p99_s")
        return ttft, tpot

    @property
    def rates(self) -> list[float]:
        return list((self.spec.get("load") or {}).get("rates") or [])

    @property
    def repeats(self) -> int:
        if self.cells.is_empty():
            return 0
        return int(self.cells["repeat"].n_unique())

    @cached_property
    def setting_labels(self) -> dict[str, str]:
        """variant -> the sampling and layout it is served with, for a campaign that sweeps them ('' else).
        Variants are compared only within one setting (v_speedup pairs on sampling_key and engine_key)."""
        return {
            entry["name"]: Variant.model_validate(entry).setting_label
            for entry in self.spec.get("variants") or []
        }

    def setting_of(self, variant: str) -> str:
        return self.setting_labels.get(variant, "")

    def variants(self) -> pl.DataFrame:
        """One row per measured variant: name, method, k (plain first, then by method and depth)."""
        if self.cells.is_empty():
            return pl.DataFrame(schema={"variant": pl.String, "method": pl.String, "k": pl.Int32})
        return (
            self.cells.select("variant", "method", "k")
            .unique()
            .with_columns((pl.col("method") != "none").alias("_spec"))
            .sort("_spec", "method", "k", "variant", nulls_last=False)
            .drop("_spec")
        )


def _frame(con: duckdb.DuckDBPyConnection, sql: str, params: list[Any] | dict[str, Any]) -> pl.DataFrame:
    relation = con.sql(sql, params=params)
    assert relation is not None  # a SELECT always gives a relation
    return relation.pl()


def _has_relation(con: duckdb.DuckDBPyConnection, name: str) -> bool:
    rows = con.execute(
        "SELECT count(*) FROM information_schema.tables WHERE table_name = ?", [name]
    ).fetchall()
    return bool(rows[0][0])


def _frame_if_present(
    con: duckdb.DuckDBPyConnection, relation: str, sql: str, params: list[Any] | dict[str, Any]
) -> pl.DataFrame:
    """`_frame`, or an empty frame where the warehouse predates `relation` (an older schema)."""
    return _frame(con, sql, params) if _has_relation(con, relation) else pl.DataFrame()


def latest_campaign_id(con: duckdb.DuckDBPyConnection) -> str:
    """The campaign run most recently (last run, else creation time)."""
    if not _has_relation(con, "campaigns"):
        raise CampaignNotFound("the warehouse has no campaigns table: run `specgauge ingest` first")
    rows = con.execute(
        "SELECT campaign_id FROM campaigns ORDER BY coalesce(last_run_utc, created_utc) DESC, campaign_id DESC "
        "LIMIT 1"
    ).fetchall()
    if not rows:
        raise CampaignNotFound("the warehouse holds no campaign yet: run a campaign and `specgauge ingest`")
    return str(rows[0][0])


def resolve_campaign_id(con: duckdb.DuckDBPyConnection, campaign_id: str | None) -> str:
    if campaign_id is None:
        return latest_campaign_id(con)
    rows = con.execute("SELECT count(*) FROM campaigns WHERE campaign_id = ?", [campaign_id]).fetchall()
    if not rows[0][0]:
        known = [r[0] for r in con.execute("SELECT campaign_id FROM campaigns ORDER BY 1").fetchall()]
        raise CampaignNotFound(
            f"no campaign {campaign_id!r} in the warehouse (it has: {', '.join(known) or 'none'})"
        )
    return campaign_id


def load_campaign(con: duckdb.DuckDBPyConnection, campaign_id: str | None = None) -> CampaignData:
    """Read everything the analysis needs about one campaign (default: the latest)."""
    cid = resolve_campaign_id(con, campaign_id)
    campaign_frame = _frame(con, "SELECT * FROM campaigns WHERE campaign_id = ?", [cid])
    campaign = campaign_frame.row(0, named=True)
    for key in ("spec", "host"):
        if isinstance(campaign.get(key), str):
            campaign[key] = json.loads(campaign[key])
    # The A/A control is a plain arm that is never a baseline: analyses see it only through `aa` (v_aa).
    cells = _frame(
        con, "SELECT * FROM v_cells WHERE campaign_id = ? AND NOT aa_control ORDER BY cell_id", [cid]
    )
    controls = [
        r[0]
        for r in con.execute(
            "SELECT DISTINCT variant FROM v_cells WHERE campaign_id = ? AND aa_control", [cid]
        ).fetchall()
    ]
    speedup = _frame(
        con,
        "SELECT * FROM v_speedup WHERE campaign_id = ? AND server_valid IS NOT FALSE ORDER BY cell_id",
        [cid],
    )
    acceptance = _frame(con, "SELECT * FROM v_acceptance WHERE campaign_id = ? ORDER BY cell_id", [cid])
    positions = _frame(
        con, "SELECT * FROM v_acceptance_positions WHERE campaign_id = ? ORDER BY cell_id, position", [cid]
    )
    capacity = _frame(
        con,
        "SELECT * FROM v_capacity WHERE campaign_id = ? AND NOT list_contains(?, variant) "
        "ORDER BY variant, workload, load_label",
        [cid, controls],
    )
    gates = _frame_if_present(
        con,
        "v_gate",
        "SELECT * FROM v_gate WHERE campaign_id = ? AND verdict_rank = 1 ORDER BY treatment_variant",
        [cid],
    )
    deployments = _frame(
        con,
        "SELECT deployment_id, variant, method, k, slot, repeat, control, launch, launcher, engine_version, "
        "engine_command, kv_cache_tokens, max_model_len, status, ready_s, job_id, started_utc, "
        "json_extract_string(extra, '$.effective_config') AS effective_config, "
        "json_extract_string(extra, '$.node') AS node "
        "FROM deployments WHERE campaign_id = ? AND NOT list_contains(?, variant) ORDER BY deployment_id",
        [cid, controls],
    )
    waste = _frame_if_present(
        con,
        "v_profile_waste",
        "SELECT * FROM v_profile_waste WHERE campaign_id = ? AND window_rank = 1 "
        "ORDER BY variant, workload, load_label",
        [cid],
    )
    searches = _frame_if_present(
        con,
        "capacity_searches",
        "SELECT * FROM capacity_searches WHERE campaign_id = ? ORDER BY search_id",
        [cid],
    )
    aa = _frame(
        con,
        "SELECT * FROM v_aa WHERE campaign_id = ? AND server_valid IS NOT FALSE ORDER BY cell_id",
        [cid],
    )
    calibrations = _frame_if_present(
        con,
        "client_calibrations",
        "SELECT * FROM client_calibrations WHERE campaign_id = ? ORDER BY started_utc DESC LIMIT 1",
        [cid],
    )
    request_acceptance = _frame(
        con,
        "SELECT c.variant, c.method, c.k, c.repeat, c.deployment_id, c.workload, c.load_label, r.prompt_id, "
        "r.spec_steps, r.spec_draft_tokens, r.spec_accepted_tokens "
        "FROM v_cells c JOIN requests r USING (cell_key) "
        "WHERE c.campaign_id = ? AND NOT c.aa_control AND c.method <> 'none' AND c.server_valid IS NOT FALSE "
        "AND r.phase = 'measured' AND r.ok AND r.spec_steps > 0 ORDER BY c.cell_id, r.request_index",
        [cid],
    )
    host_load = _frame(
        con,
        "SELECT cell_id, variant, workload, load_label, host_cpus, host_busy_share, host_ours_share, "
        "host_other_share, host_steal_share, load_mode, concurrency, achieved_concurrency "
        "FROM v_cells WHERE campaign_id = ? ORDER BY cell_id",
        [cid],
    )
    pool = bool(((campaign.get("spec") or {}).get("analysis") or {}).get("pool_history", True))
    history = launch_history(con, campaign) if pool else None
    return CampaignData(
        campaign_id=cid,
        campaign=campaign,
        cells=cells,
        speedup=speedup,
        acceptance=acceptance,
        positions=positions,
        capacity=capacity,
        gates=gates,
        deployments=deployments,
        waste=waste,
        searches=searches,
        aa=aa,
        client_calibration=calibrations.row(0, named=True) if not calibrations.is_empty() else None,
        request_acceptance=request_acceptance,
        history=history,
        host_load=host_load,
        gpu_telemetry=_frame_if_present(
            con,
            "v_gpu_telemetry",
            "SELECT * FROM v_gpu_telemetry WHERE campaign_id = ? ORDER BY cell_id, gpu_index",
            [cid],
        ),
    )


LATENCY_QUANTILES = (0.05, 0.25, 0.5, 0.75, 0.95, 0.99)


def latency_quantiles(con: duckdb.DuckDBPyConnection, campaign_id: str) -> pl.DataFrame:
    """Per variant, workload and load: quantiles of every successful measured request's TTFT, TPOT and E2E,
    and of the two inter-token latencies, pooled over repeats (for the distribution charts).

    `chunk_gap`: the time between consecutive token-bearing chunks (one chunk may carry several tokens under
    speculation). `itl_per_token`: each gap divided by its chunk's token count, counted once per token.
    """
    quantiles = ", ".join(f"quantile_cont(v, {q}) AS q{round(q * 100):02d}" for q in LATENCY_QUANTILES)
    sql = f"""
    WITH measured AS (
        SELECT c.variant, c.method, c.k, c.workload, c.load_mode, c.load_label, c.concurrency, c.rate,
               r.ttft_s, r.tpot_s, r.e2e_s, r.chunk_offsets_s, r.chunk_tokens
        FROM v_cells c JOIN requests r USING (cell_key)
        WHERE c.campaign_id = $cid AND r.phase = 'measured' AND r.ok
    ), gaps AS (
        SELECT variant, method, k, workload, load_mode, load_label, concurrency, rate,
               chunk_offsets_s[i + 1] - chunk_offsets_s[i] AS gap, chunk_tokens[i + 1] AS tokens
        FROM (SELECT *, unnest(range(1, len(chunk_offsets_s))) AS i FROM measured
              WHERE len(chunk_offsets_s) > 1)
    ), samples AS (
        SELECT variant, method, k, workload, load_mode, load_label, concurrency, rate, 'ttft' AS metric,
               ttft_s AS v FROM measured WHERE ttft_s IS NOT NULL
        UNION ALL
        SELECT variant, method, k, workload, load_mode, load_label, concurrency, rate, 'tpot', tpot_s
        FROM measured WHERE tpot_s IS NOT NULL
        UNION ALL
        SELECT variant, method, k, workload, load_mode, load_label, concurrency, rate, 'e2e', e2e_s
        FROM measured WHERE e2e_s IS NOT NULL
        UNION ALL
        SELECT variant, method, k, workload, load_mode, load_label, concurrency, rate, 'chunk_gap', gap
        FROM gaps
        UNION ALL
        SELECT variant, method, k, workload, load_mode, load_label, concurrency, rate, 'itl_per_token',
               gap / tokens
        FROM (SELECT *, unnest(range(coalesce(tokens, 1))) FROM gaps WHERE coalesce(tokens, 1) > 0)
    )
    SELECT variant, method, k, workload, load_mode, load_label, concurrency, rate, metric, count(*) AS n,
           avg(v) AS mean, {quantiles}
    FROM samples
    GROUP BY ALL
    ORDER BY ALL
    """
    return _frame(con, sql, {"cid": campaign_id})
