"""The decision rule, stated once and applied to every speculative variant, workload and load.

A variant WINS a workload and load only when all three hold:
  1. the interval of its gain excludes 1 on the winning side (the gain is a ratio against plain, so the
     whole interval lies above 1; with one repeat there is no interval, so it cannot win);
  2. its success rate (successful / measured requests, pooled over the repeats' cells) is at least 99%;
  3. its greedy-correctness gate passed (the latest verdict in v_gate for the variant).
The gain is the output-throughput speedup by default (AnalysisSettings.gain_metric).
"""

from __future__ import annotations

import polars as pl

from analysis.data import AnalysisSettings, CampaignData
from analysis.speedup import CELL_KEY_SCHEMA, GAIN_INTERVAL_SCHEMA, LOAD_KEYS, VARIANT_KEYS, gain

RULE = (
    "A variant wins a workload and load only when (1) the {confidence:.0%} bootstrap interval of its "
    "{metric} speedup over independently launched repeats lies entirely above 1 (one repeat gives no "
    "interval, hence no win), (2) its success rate is at least {success:.0%}, and (3) its greedy-correctness "
    "gate passed (latest verdict)."
)

DECISION_SCHEMA = {
    **CELL_KEY_SCHEMA,
    "gain_metric": pl.String,
    **GAIN_INTERVAL_SCHEMA,
    "success_rate": pl.Float64,
    "success_ok": pl.Boolean,
    "gate_passed": pl.Boolean,
    "gate_verdict_id": pl.String,
    "gate_outcome": pl.String,
    "wins": pl.Boolean,
    "reason": pl.String,
}


def rule_text(settings: AnalysisSettings) -> str:
    return RULE.format(
        confidence=settings.confidence, metric=settings.gain_metric, success=settings.min_success_rate
    )


def success_rates(data: CampaignData) -> pl.DataFrame:
    """Pooled success rate per variant, workload and load over the repeats' cells (latest ok attempts)."""
    return data.cells.group_by([*VARIANT_KEYS, *LOAD_KEYS]).agg(
        (pl.col("requests_ok").sum() / pl.col("requests_total").sum()).alias("success_rate")
    )


def gate_status(data: CampaignData) -> dict[str, dict]:
    """variant -> its latest verdict (passed, verdict_id, outcome)."""
    if data.gates.is_empty():
        return {}
    return {
        row["treatment_variant"]: {
            "passed": row["passed"],
            "verdict_id": row["verdict_id"],
            "outcome": row["outcome"],
        }
        for row in data.gates.iter_rows(named=True)
    }


def decide(
    data: CampaignData, speedups: pl.DataFrame, settings: AnalysisSettings | None = None
) -> pl.DataFrame:
    """Apply the rule to every speculative variant x workload x load with cells in the campaign."""
    settings = settings or AnalysisSettings()
    gains = gain(speedups, settings.gain_metric)
    success = success_rates(data)
    gates = gate_status(data)
    cells = success.filter(pl.col("method") != "none")
    joined = cells.join(gains, on=[*VARIANT_KEYS, *LOAD_KEYS], how="left", nulls_equal=True)
    rows = []
    for row in joined.iter_rows(named=True):
        gate = gates.get(row["variant"])
        success_rate = row["success_rate"]
        success_ok = success_rate is not None and success_rate >= settings.min_success_rate
        reasons = []
        if row["estimate"] is None:
            reasons.append("no paired plain cell")
        elif row["ci_low"] is None:
            reasons.append(f"{row['interval']}: needs at least 2 repeats")
        elif not row["ci_low"] > 1.0:
            side = "below 1" if row["ci_high"] < 1.0 else "includes 1"
            reasons.append(f"interval [{row['ci_low']:.3g}, {row['ci_high']:.3g}] {side}")
        if not success_ok:
            shown = "unknown" if success_rate is None else f"{success_rate:.1%}"
            reasons.append(f"success rate {shown} < {settings.min_success_rate:.0%}")
        if gate is None:
            reasons.append("no correctness verdict")
        elif not gate["passed"]:
            reasons.append(f"correctness gate failed ({gate['outcome']})")
        wins = not reasons
        rows.append(
            {
                **{k: row[k] for k in (*VARIANT_KEYS, *LOAD_KEYS)},
                "gain_metric": settings.gain_metric,
                **{column: row[column] for column in GAIN_INTERVAL_SCHEMA},
                "success_rate": success_rate,
                "success_ok": success_ok,
                "gate_passed": None if gate is None else bool(gate["passed"]),
                "gate_verdict_id": None if gate is None else gate["verdict_id"],
                "gate_outcome": None if gate is None else gate["outcome"],
                "wins": wins,
                "reason": (
                    f"wins: {settings.gain_metric} speedup {row['estimate']:.3g} "
                    f"[{row['ci_low']:.3g}, {row['ci_high']:.3g}], success {success_rate:.1%}, gate passed"
                    if wins
                    else "; ".join(reasons)
                ),
            }
        )
    return pl.DataFrame(rows, schema=DECISION_SCHEMA).sort(
        "workload", "load_mode", "concurrency", "rate", "method", "k", "variant", nulls_last=True
    )
