"""The benefit rule (analysis.decision) on planted data, each condition at its edge: the interval's minimum
effect, the other workloads' guardrail, the success rate, the gate, the campaign's validity, and the rule
parameters a spec sets."""

from __future__ import annotations

from typing import Any

import polars as pl
import pytest

from analysis.data import AnalysisSettings, CampaignData
from analysis.decision import decide, rule_text
from experiments.spec import DecisionSpec

LOAD = {"load_mode": "closed", "load_label": "c1", "concurrency": 1, "rate": None}
VARIANT = {"variant": "ngram-k3", "method": "ngram", "k": 3}


def gain_row(workload: str, estimate: float, low: float | None, high: float | None) -> dict[str, Any]:
    return {
        **VARIANT,
        "workload": workload,
        **LOAD,
        "metric": "throughput",
        "estimate": estimate,
        "ci_low": low,
        "ci_high": high,
        "n_repeats": 3 if low is not None else 1,
        "interval": "n=3, t on log-ratios 95%" if low is not None else "n=1, no interval",
        "interval_excludes_one": None if low is None else (low > 1 or high < 1),
    }


def campaign(
    *,
    success: dict[str, tuple[int, int]] | None = None,
    gate: bool | None = True,
    decision: dict[str, Any] | None = None,
) -> CampaignData:
    """Cells with the given (ok, total) per workload, and a gate verdict for the variant (None: none)."""
    success = success or {"code": (100, 100), "chat": (100, 100)}
    cells = pl.DataFrame(
        [
            {**VARIANT, "workload": w, **LOAD, "requests_ok": ok, "requests_total": total}
            for w, (ok, total) in success.items()
        ],
        schema_overrides={"rate": pl.Float64, "k": pl.Int32, "concurrency": pl.Int32},
    )
    gates = (
        pl.DataFrame(
            [{"treatment_variant": "ngram-k3", "passed": gate, "verdict_id": "v1", "outcome": "pass"}]
        )
        if gate is not None
        else pl.DataFrame()
    )
    spec = {"decision": decision} if decision else {}
    return CampaignData(
        campaign_id="planted",
        campaign={"spec": spec},
        cells=cells,
        speedup=pl.DataFrame(),
        acceptance=pl.DataFrame(),
        positions=pl.DataFrame(),
        capacity=pl.DataFrame(),
        gates=gates,
        deployments=pl.DataFrame(),
        waste=pl.DataFrame(),
    )


def speedups(*rows: dict[str, Any]) -> pl.DataFrame:
    return pl.DataFrame(
        list(rows), schema_overrides={"rate": pl.Float64, "k": pl.Int32, "concurrency": pl.Int32}
    )


def code_decision(data: CampaignData, gains: pl.DataFrame, **kwargs: Any) -> dict[str, Any]:
    decisions = decide(data, gains, AnalysisSettings(), **kwargs)
    return decisions.filter(pl.col("workload") == "code").row(0, named=True)


CHAT_FINE = gain_row("chat", 1.00, 0.97, 1.03)


@pytest.mark.parametrize(("low", "wins"), [(1.101, True), (1.099, False)])
def test_the_interval_must_clear_the_minimum_effect(low: float, wins: bool) -> None:
    decision = code_decision(campaign(), speedups(gain_row("code", 1.3, low, 1.5), CHAT_FINE))
    assert decision["wins"] is wins, decision["reason"]
    if not wins:
        assert "not above 1.10" in decision["reason"]


def test_an_interval_above_one_but_below_the_minimum_effect_is_no_recommendation() -> None:
    decision = code_decision(campaign(), speedups(gain_row("code", 1.06, 1.02, 1.10), CHAT_FINE))
    assert decision["interval_excludes_one"] is True and decision["wins"] is False


@pytest.mark.parametrize(("chat", "wins"), [(0.951, True), (0.949, False)])
def test_another_workload_regressing_past_the_guardrail_blocks_it(chat: float, wins: bool) -> None:
    decision = code_decision(
        campaign(), speedups(gain_row("code", 1.3, 1.2, 1.4), gain_row("chat", chat, 0.9, 1.0))
    )
    assert decision["wins"] is wins, decision["reason"]
    assert decision["guardrail_ok"] is wins
    if not wins:
        assert "chat regresses at this load (0.949 < 0.95)" in decision["reason"]


@pytest.mark.parametrize(("ok", "wins"), [(99, True), (98, False)])
def test_success_rate_at_its_edge(ok: int, wins: bool) -> None:
    data = campaign(success={"code": (ok, 100), "chat": (100, 100)})
    decision = code_decision(data, speedups(gain_row("code", 1.3, 1.2, 1.4), CHAT_FINE))
    assert decision["wins"] is wins, decision["reason"]


@pytest.mark.parametrize(
    ("gate", "reason"), [(False, "correctness gate failed"), (None, "no correctness verdict")]
)
def test_no_recommendation_without_a_passed_gate(gate: bool | None, reason: str) -> None:
    decision = code_decision(campaign(gate=gate), speedups(gain_row("code", 1.3, 1.2, 1.4), CHAT_FINE))
    assert decision["wins"] is False and reason in decision["reason"]


@pytest.mark.parametrize(("valid", "wins"), [(True, True), (None, True), (False, False)])
def test_an_invalid_campaign_recommends_nothing(valid: bool | None, wins: bool) -> None:
    decision = code_decision(
        campaign(), speedups(gain_row("code", 1.3, 1.2, 1.4), CHAT_FINE), campaign_valid=valid
    )
    assert decision["wins"] is wins and decision["campaign_valid"] is valid
    if not wins:
        assert "the campaign is invalid" in decision["reason"]


def test_one_repeat_gives_no_recommendation() -> None:
    decision = code_decision(campaign(), speedups(gain_row("code", 1.5, None, None), CHAT_FINE))
    assert decision["wins"] is False and "no interval, so no decision" in decision["reason"]


def test_a_zero_width_interval_gives_no_decision() -> None:
    """Greedy acceptance repeats exactly: an "interval" [1.5, 1.5] is no evidence, however far above 1.1."""
    decision = code_decision(campaign(), speedups(gain_row("code", 1.5, 1.5, 1.5), CHAT_FINE))
    assert decision["wins"] is False and "no interval, so no decision" in decision["reason"]


def test_the_spec_sets_the_rule_parameters_and_the_rule_text_states_them() -> None:
    gains = speedups(gain_row("code", 1.3, 1.15, 1.4), gain_row("chat", 0.93, 0.9, 0.96))
    assert code_decision(campaign(), gains)["wins"] is False  # defaults: chat 0.93 < 0.95
    loose = campaign(decision={"min_effect": 0.1, "guardrail": 0.08, "min_success_rate": 0.99})
    assert code_decision(loose, gains)["wins"] is True
    strict = campaign(decision={"min_effect": 0.2, "guardrail": 0.08})
    decision = code_decision(strict, gains)
    assert decision["wins"] is False and "not above 1.20" in decision["reason"]
    assert decision["min_effect"] == 0.2
    text = rule_text(AnalysisSettings(), DecisionSpec(min_effect=0.2, guardrail=0.08))
    assert "above 1.20" in text and "more than 8%" in text and "below 0.92" in text


def test_a_confounded_pair_is_judged_and_named() -> None:
    data = campaign()
    data.speedup = pl.DataFrame(
        {"variant": ["ngram-k3", "ngram-k3", "other"], "confounded": [False, True, None]}
    )
    decision = code_decision(data, speedups(gain_row("code", 1.3, 1.2, 1.4), CHAT_FINE))
    assert decision["confounded"] is True and decision["wins"] is True
    assert "engine settings differ from plain's beyond speculation" in decision["reason"]
