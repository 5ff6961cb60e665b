"""Launch-to-launch variance pooled from the warehouse's history (issue 30).

Two launches give a t interval with one degree of freedom (t = 12.7 at 95%): too wide to decide anything. The
warehouse holds every past campaign, and each one that launched plain more than once per cell (repeats, the
A/A control) measured how far two identical launches differ. This module estimates that spread, sigma^2 =
the variance of log(output throughput) across launches of one cell, from past campaigns launched the same
way: the same launcher, host class and target model, and the same engine settings, CPU runtime included
(tasks/launch/cpu_runtime.py: a campaign launched with unbound libgomp threads spread 10-24% between
launches, one bound with Intel OpenMP far less; their spreads never pool).

Per past campaign: every plain launch of a cell (the reference plain variant and its A/A control, all
repeats) is one value; the campaign's variance is the mean over its cells of their sample variances of the
logs, with (launches per cell - 1) degrees of freedom. Not the sum over cells: a campaign's cells share its
launches (a slow launch is slow at every load), so its cells are not independent estimates. Campaigns pool
by their degrees of freedom (analysis.stats.pooled_variance's rule, applied to campaigns).

The pooled figure enters an interval only through analysis.stats.pooled_ratio_interval, whose label says
so ("launch variance pooled from 14 campaigns (2026-11-30..2026-12-04)"); `analysis.pool_history: false`
in a spec turns it off. What it assumes, and what happens to coverage when today's machine is noisier than
its history, is in docs/analysis.md ("Interval coverage").
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

import duckdb

from analysis.stats import LaunchVariance
from experiments.spec import runtime_label

MIN_HISTORY_DF = 2
"""Below this many pooled degrees of freedom history is not used (it would barely narrow anything)."""


@dataclass(frozen=True)
class LaunchClass:
    """What a past campaign must share with this one for its launch spread to count."""

    launcher: str
    host_class: str
    model: str
    runtime: str = ""

    def label(self) -> str:
        runtime = f", {self.runtime}" if self.runtime else ""
        return f"launcher {self.launcher}, host {self.host_class}, model {self.model}{runtime}"


def host_class(spec: dict[str, Any], host: dict[str, Any] | None) -> str:
    """Cluster launchers: the partition (nodes of a partition are one class); local: the host's name and
    core count (the machine itself)."""
    launcher = spec.get("launcher") or {}
    if launcher.get("partition"):
        return f"partition {launcher['partition']}"
    host = host or {}
    return f"{host.get('hostname', '?')}/{host.get('cpus', '?')} cpus"


def launch_class(campaign: dict[str, Any]) -> LaunchClass:
    """The class of a campaigns row (spec and host parsed or as JSON text)."""
    spec = _json(campaign.get("spec"))
    host = _json(campaign.get("host"))
    launcher = spec.get("launcher") or {}
    kind = str(launcher.get("kind", "local"))
    return LaunchClass(
        launcher=kind,
        host_class=host_class(spec, host),
        model=str((spec.get("target") or {}).get("model", "?")),
        runtime=runtime_label(launcher) if kind == "local" else "",
    )


def _json(value: Any) -> dict[str, Any]:
    if isinstance(value, str):
        return json.loads(value)
    return value or {}


def launch_spreads(con: duckdb.DuckDBPyConnection, campaign_ids: list[str]) -> dict[str, tuple[float, int]]:
    """Per campaign (one query for all): (variance of log plain throughput across launches of a cell, averaged
    over its cells; launches per cell - 1). Campaigns where no plain cell was launched twice are absent."""
    rows = con.execute(
        """
        WITH cell_groups AS (
            SELECT campaign_id, var_samp(ln(output_throughput_tok_s)) AS v, count(*) AS launches
            FROM v_cells
            WHERE list_contains(?, campaign_id) AND method = 'none' AND output_throughput_tok_s > 0
              AND server_valid IS NOT FALSE
            GROUP BY campaign_id, workload, load_label, engine_key, sampling_key
            HAVING count(*) >= 2
        )
        SELECT campaign_id, avg(v), min(launches) - 1 FROM cell_groups GROUP BY campaign_id
        """,
        [campaign_ids],
    ).fetchall()
    return {cid: (float(v), int(df)) for cid, v, df in rows if v is not None and math.isfinite(v) and df >= 1}


def launch_history(
    con: duckdb.DuckDBPyConnection, campaign: dict[str, Any], *, min_df: int = MIN_HISTORY_DF
) -> LaunchVariance | None:
    """The launch variance pooled over earlier campaigns of the same LaunchClass as `campaign` (a campaigns
    row), or None when they hold fewer than `min_df` degrees of freedom. Only campaigns created before this
    one count: an analysis re-run later gives the same interval."""
    mine = launch_class(campaign)
    candidates = con.execute(
        "SELECT campaign_id, spec, host, created_utc FROM campaigns WHERE campaign_id <> ? AND created_utc < ? "
        "ORDER BY created_utc",
        [campaign["campaign_id"], campaign["created_utc"]],
    ).fetchall()
    alike = {
        cid: created
        for cid, spec, host, created in candidates
        if launch_class({"spec": spec, "host": host}) == mine
    }
    spreads = launch_spreads(con, list(alike)) if alike else {}
    variances = [spreads[cid][0] for cid in spreads]
    dfs = [spreads[cid][1] for cid in spreads]
    dates = [alike[cid].date().isoformat() for cid in spreads]
    df = sum(dfs)
    if df < min_df:
        return None
    variance = sum(v * d for v, d in zip(variances, dfs, strict=True)) / df
    return LaunchVariance(
        variance=variance,
        df=df,
        campaigns=len(dfs),
        first=min(dates),
        last=max(dates),
        source=f"plain repeats and A/A pairs ({mine.label()})",
    )
