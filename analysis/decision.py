"""The benefit rule (the reference study's protocol), stated once and applied to every speculative variant,
workload and load.

A variant is RECOMMENDED (`wins`) for a workload and load only when all of these hold:
  1. the interval of its gain lies above 1 + min_effect (the gain is a ratio against plain: a speedup worth
     its operating cost, 10% by default; with one repeat there is no interval, so it cannot win);
  2. no other workload of the campaign regresses at that load: the variant's gain estimate on every other
     workload at the same load is at least 1 - guardrail (5% by default; a recommendation that speeds up
     code while slowing chat by 8% is not one);
  3. its success rate (successful / measured requests, pooled over the repeats' cells) is at least 99%;
  4. its greedy-correctness gate passed (the latest verdict in v_gate for the variant);
  5. the campaign is valid (analysis.validity: its A/A gap and repeat spread within their limits).
Rule parameters come from the spec's `decision` section (experiments.spec.DecisionSpec). The gain is the
output-throughput speedup by default (AnalysisSettings.gain_metric). A pair whose engines ran with different
settings beyond speculation (`confounded`, analysis.validity) is still judged, and the reason says so.
"""

from __future__ import annotations

import polars as pl

from analysis.data import AnalysisSettings, CampaignData
from analysis.speedup import CELL_KEY_SCHEMA, GAIN_INTERVAL_SCHEMA, LOAD_KEYS, VARIANT_KEYS, gain
from analysis.stats import percent
from experiments.spec import DecisionSpec

RULE = (
    "A variant is recommended for a workload and load only when (1) the {confidence} t interval of its "
    "{metric} speedup over independently launched repeats lies above {threshold:.2f} (1 + minimum effect "
    "{min_effect:.0%}; one repeat gives no interval, hence no recommendation), (2) no other workload at that "
    "load regresses by more than {harm:.0%} (its speedup estimate below {floor:.2f}), (3) its success rate "
    "is at least {success:.0%}, (4) its greedy-correctness gate passed (latest verdict), and (5) the campaign is "
    "valid (A/A gap and repeat spread within their limits)."
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
    # added by migration 0008 (the benefit rule), hence last
    "min_effect": pl.Float64,
    "guardrail_ok": pl.Boolean,
    "worst_other_workload": pl.String,
    "campaign_valid": pl.Boolean,
    "confounded": pl.Boolean,
}


def decision_rule(data: CampaignData) -> DecisionSpec:
    """The spec's rule parameters (defaults for campaigns written before the `decision` section)."""
    return DecisionSpec.model_validate(data.spec.get("decision") or {})


def rule_text(settings: AnalysisSettings, rule: DecisionSpec | None = None) -> str:
    """The benefit rule in words: a gain interval above 1 + min_effect, no other workload worse by more than
    the guardrail, a minimum success rate."""
    rule = rule or DecisionSpec()
    return RULE.format(
        confidence=percent(settings.confidence),
        metric=settings.gain_metric,
        threshold=1 + rule.min_effect,
        min_effect=rule.min_effect,
        harm=rule.guardrail,
        floor=1 - rule.guardrail,
        success=rule.min_success_rate,
    )


def gain_shortfall(
    estimate: float | None,
    low: float | None,
    high: float | None,
    interval: str | None,
    threshold: float,
    no_estimate: str,
) -> str | None:
    """Why a gain fails criterion 1, its interval above `threshold` (None: it passes); `no_estimate` is the
    reason without an estimate. A zero-width "interval" (all repeats equal, one repeat) is no evidence: never
    decide from it."""
    if estimate is None:
        return no_estimate
    if low is None or high is None or not high > low:
        return f"{interval}: no interval, so no decision"
    if not low > threshold:
        where = "below 1" if high < 1.0 else f"not above {threshold:.2f}"
        return f"interval [{low:.3g}, {high:.3g}] {where}"
    return None


def success_shortfall(rate: float | None, minimum: float) -> str:
    """Criterion 3's reason: a success rate (None: unknown) below the minimum."""
    shown = "unknown" if rate is None else f"{rate:.1%}"
    return f"success rate {shown} < {minimum:.0%}"


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


OTHER_LOAD_KEYS = ("load_mode", "load_label", "concurrency", "rate")


def worst_other_workloads(gains: pl.DataFrame) -> dict[tuple, tuple[str, float]]:
    """(variant, load..., workload) -> the lowest gain estimate among the variant's OTHER workloads at that
    load, with that workload's name (absent: no other workload measured there)."""
    out: dict[tuple, tuple[str, float]] = {}
    if gains.is_empty():
        return out
    keys = ["variant", *OTHER_LOAD_KEYS]
    for key, group in gains.group_by(keys, maintain_order=True):
        rows = [
            (r["workload"], r["estimate"]) for r in group.iter_rows(named=True) if r["estimate"] is not None
        ]
        for workload, _ in rows:
            others = [(w, e) for w, e in rows if w != workload]
            if others:
                out[(*key, workload)] = min(others, key=lambda pair: pair[1])
    return out


def confounded_pairs(data: CampaignData) -> dict[str, bool]:
    """variant -> whether any of its cells ran with engine settings that differ from plain's beyond
    speculation (v_speedup.confounded; absent: unknown)."""
    if data.speedup.is_empty() or "confounded" not in data.speedup.columns:
        return {}
    known = data.speedup.filter(pl.col("confounded").is_not_null())
    flags = known.group_by("variant").agg(pl.col("confounded").any())
    return {str(variant): bool(flag) for variant, flag in flags.iter_rows()}


def decide(
    data: CampaignData,
    speedups: pl.DataFrame,
    settings: AnalysisSettings | None = None,
    *,
    campaign_valid: bool | None = None,
) -> pl.DataFrame:
    """Apply the rule to every speculative variant x workload x load with cells in the campaign.
    `campaign_valid`: analysis.validity's verdict (None: not judged, which does not block)."""
    settings = settings or AnalysisSettings()
    rule = decision_rule(data)
    gains = gain(speedups, settings.gain_metric)
    success = success_rates(data)
    gates = gate_status(data)
    worst = worst_other_workloads(gains)
    confounded = confounded_pairs(data)
    threshold, floor = 1.0 + rule.min_effect, 1.0 - rule.guardrail
    cells = success.filter(pl.col("method") != "none")
    joined = cells.join(gains, on=[*VARIANT_KEYS, *LOAD_KEYS], how="left", nulls_equal=True)
    rows = []
    for row in joined.iter_rows(named=True):
        gate = gates.get(row["variant"])
        success_rate = row["success_rate"]
        success_ok = success_rate is not None and success_rate >= rule.min_success_rate
        other = worst.get((row["variant"], *(row[k] for k in OTHER_LOAD_KEYS), row["workload"]))
        guardrail_ok = other is None or other[1] >= floor
        shortfall = gain_shortfall(
            row["estimate"], row["ci_low"], row["ci_high"], row["interval"], threshold, "no paired plain cell"
        )
        reasons = [shortfall] if shortfall else []
        if not guardrail_ok:
            reasons.append(f"{other[0]} regresses at this load ({other[1]:.3g} < {floor:.2f})")
        if not success_ok:
            reasons.append(success_shortfall(success_rate, rule.min_success_rate))
        if gate is None:
            reasons.append("no correctness verdict")
        elif not gate["passed"]:
            reasons.append(f"correctness gate failed ({gate['outcome']})")
        if campaign_valid is False:
            reasons.append("the campaign is invalid (see Validity)")
        wins = not reasons
        flag = confounded.get(row["variant"])
        note = "; engine settings differ from plain's beyond speculation (see Validity)" if flag else ""
        rows.append(
            {
                **{k: row[k] for k in (*VARIANT_KEYS, *LOAD_KEYS)},
                "gain_metric": settings.gain_metric,
                **{column: row[column] for column in GAIN_INTERVAL_SCHEMA},
                "min_effect": rule.min_effect,
                "success_rate": success_rate,
                "success_ok": success_ok,
                "guardrail_ok": guardrail_ok,
                "worst_other_workload": None if other is None else f"{other[0]} {other[1]:.3g}",
                "gate_passed": None if gate is None else bool(gate["passed"]),
                "gate_verdict_id": None if gate is None else gate["verdict_id"],
                "gate_outcome": None if gate is None else gate["outcome"],
                "campaign_valid": campaign_valid,
                "confounded": flag,
                "wins": wins,
                "reason": (
                    f"wins: {settings.gain_metric} speedup {row['estimate']:.3g} "
                    f"[{row['ci_low']:.3g}, {row['ci_high']:.3g}] above {threshold:.2f}, no other workload "
                    f"below {floor:.2f}, success {success_rate:.1%}, gate passed"
                    if wins
                    else "; ".join(reasons)
                )
                + note,
            }
        )
    return pl.DataFrame(rows, schema=DECISION_SCHEMA).sort(
        "workload", "load_mode", "concurrency", "rate", "method", "k", "variant", nulls_last=True
    )
