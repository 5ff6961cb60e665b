"""Adaptive repeats (analysis/adaptive_repeats.py, issue 21): the rule's decisions on planted ratios, reading a raw
campaign directory as the warehouse would pair it, the vectorised rule agreeing with the scalar one, and a
small version of benchmarks/adaptive_repeats.py: the rule keeps coverage >= 93% where the naive rule does not.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import duckdb
import numpy as np
import pytest
from analysis_fixtures import PlantedBuilder, profile
from pydantic import ValidationError
from warehouse_fixtures import make_spec

from analysis.adaptive_repeats import (
    AdaptiveRepeats,
    Comparison,
    Observations,
    campaign_observations,
    repeat_decision,
    report_confidence,
    stopping_repeats,
)
from analysis.stats import ratio_interval

CHAT = Comparison("draft-k3", "chat", "c1")
CODE = Comparison("ngram-k3", "code", "c4")
RULE = AdaptiveRepeats(min=3, max=6, target_halfwidth=0.05)


def observed(ratios: dict[Comparison, list[float]]) -> Observations:
    repeats = max(len(values) for values in ratios.values())
    return Observations(
        metric="throughput",
        repeats=tuple(range(repeats)),
        ratios={c: dict(enumerate(values)) for c, values in ratios.items()},
    )


NARROW = [1.30, 1.31, 1.29, 1.30]  # log-ratio sd under 1%: a 97.5% halfwidth of a few percent at 3 repeats
WIDE = [1.0, 1.4, 0.8, 1.2]


def test_the_rule_stops_when_every_interval_is_narrow() -> None:
    decision = repeat_decision(observed({CHAT: NARROW[:3], CODE: [0.9, 0.905, 0.895]}), RULE)
    assert decision.stop and decision.repeats_done == 3
    assert decision.confidence == pytest.approx(0.975)
    assert decision.widest_halfwidth is not None and decision.widest_halfwidth <= RULE.target_halfwidth
    assert "within the target" in decision.reason


def test_the_rule_continues_while_one_interval_is_wide_and_names_it() -> None:
    decision = repeat_decision(observed({CHAT: NARROW, CODE: WIDE}), RULE)
    assert not decision.stop and decision.repeats_done == 4
    assert decision.widest == CODE and decision.widest_halfwidth > RULE.target_halfwidth  # type: ignore[operator]
    assert "1 of 2" in decision.reason and "ngram-k3 code c4" in decision.reason


def test_the_rule_stops_at_max_however_wide() -> None:
    decision = repeat_decision(observed({CHAT: [*WIDE, 1.1, 0.9]}), RULE)
    assert decision.stop and decision.repeats_done == RULE.max and "maximum" in decision.reason
    assert decision.widest_halfwidth > RULE.target_halfwidth  # type: ignore[operator]


def test_the_rule_never_stops_before_min() -> None:
    narrow_early = observed({CHAT: [1.3, 1.3 * 1.0001]})
    decision = repeat_decision(narrow_early, AdaptiveRepeats(min=3, max=6, target_halfwidth=0.5))
    assert not decision.stop and "2 of at least 3" in decision.reason
    assert decision.widest_halfwidth is not None and decision.widest_halfwidth < 0.5  # narrow, yet too early
    assert repeat_decision(observed({CHAT: [1.3, 1.3001, 1.2999]}), RULE).stop


def test_a_comparison_without_two_pairs_keeps_the_campaign_going() -> None:
    observations = Observations("throughput", (0, 1, 2), {CHAT: dict(enumerate(NARROW[:3])), CODE: {0: 1.1}})
    decision = repeat_decision(observations, RULE)
    assert not decision.stop and decision.widest == CODE and math.isinf(decision.widest_halfwidth or 0)
    assert "fewer than 2 pairs" in decision.reason


def test_the_halfwidth_is_the_analysis_interval_at_the_corrected_level() -> None:
    """The rule judges analysis.stats.ratio_interval (what the report prints) at interval_confidence."""
    ratios = [1.2, 1.35, 1.1, 1.28]
    decision = repeat_decision(observed({CHAT: ratios}), RULE)
    interval = ratio_interval(ratios, confidence=0.975)
    assert decision.widths[0].halfwidth == pytest.approx(math.log(interval.high / interval.estimate))
    assert decision.widths[0].estimate == pytest.approx(interval.estimate)
    assert RULE.interval_confidence(0.9) == pytest.approx(0.95)


def test_the_settings_are_checked() -> None:
    with pytest.raises(ValidationError, match="at least min"):
        AdaptiveRepeats(min=5, max=4, target_halfwidth=0.1)
    with pytest.raises(ValidationError, match="greater than or equal to 3"):
        AdaptiveRepeats(min=2, max=4, target_halfwidth=0.1)
    with pytest.raises(ValidationError, match="greater than 0"):
        AdaptiveRepeats(min=3, max=4, target_halfwidth=0)
    with pytest.raises(ValidationError, match="Extra inputs"):
        AdaptiveRepeats.model_validate({"min": 3, "max": 4, "target_halfwidth": 0.1, "confidence": 0.9})


# ---------------------------------------------------------------------------------- a raw campaign directory

SPEEDUP = {"draft-k3": 1.5, "ngram-k3": 1.2}
NOISE = [1.00, 1.04, 0.97]  # the speculative launch's own variation per repeat
DRIFT = [1.00, 1.10, 0.92]  # a repeat block's drift, shared by every arm of the block


@dataclass
class FailingBuilder(PlantedBuilder):
    failing: str = ""  # the cell id whose first attempt fails

    def write_cell(self, slot, cell, **kwargs):  # type: ignore[no-untyped-def, override]
        if cell.cell_id == self.failing and "status" not in kwargs:
            kwargs["status"] = "failed"
        return super().write_cell(slot, cell, **kwargs)


def test_campaign_observations_pair_cells_as_the_warehouse_does(tmp_path: Path) -> None:
    """Read from disk alone, the per-repeat speedups equal v_speedup's after ingest: latest ok attempts, the
    A/A arm never a baseline, a failed cell leaving its pair out but its comparison in."""

    def plant(variant: str, repeat: int, workload: str, load: str):
        tpot = 0.02 * DRIFT[repeat]
        if variant in SPEEDUP:
            return profile(tpot / SPEEDUP[variant] * NOISE[repeat], 0.5)
        return profile(tpot * (1.3 if variant == "plain-aa" else 1.0), None)

    spec = make_spec(
        "adaptive",
        repeats=3,
        requests=24,  # request-level noise in a cell's median under 10%
        concurrencies=(1, 4),
        strata=("chat", "code"),
        variants=[
            {"name": "plain", "method": "none"},
            {"name": "plain-aa", "method": "none", "aa_control": True},
            {"name": "ngram-k3", "method": "ngram", "k": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 4},
            {"name": "draft-k3", "method": "draft_model", "k": 3, "draft_model": "models/tiny-draft"},
        ],
    )
    builder = FailingBuilder(tmp_path / "raw", spec=spec, plant=plant, failing="ngram-k3.r2.code.c4")
    builder.write_all(captures=False)  # that cell's only attempt fails
    # a re-run's failed attempt after an ok one: the ok one still counts
    draft_r1 = builder.slot("draft-k3", 1)
    builder.write_cell(
        draft_r1, next(c for c in draft_r1.cells if c.cell_id.endswith("chat.c1")), status="failed"
    )
    assert len(list((builder.campaign_dir / "cells").glob("draft-k3.r1.chat.c1.a*"))) == 2

    observations = campaign_observations(builder.campaign_dir, metric="tpot_p50")
    assert observations.repeats == (0, 1, 2)
    assert len(observations.ratios) == 2 * 2 * 2  # variants x workloads x loads; no plain, no A/A arm
    failed = Comparison("ngram-k3", "code", "c4")
    assert sorted(observations.ratios[failed]) == [0, 1]  # the failed cell's pair is out, its comparison in
    for comparison, by_repeat in observations.ratios.items():
        for repeat, ratio in by_repeat.items():  # drift cancels; the A/A arm (30% slower) is no baseline
            assert ratio == pytest.approx(SPEEDUP[comparison.variant] / NOISE[repeat], rel=0.1)

    first_two = observations.restricted_to([0, 1])  # the rule's view after two blocks
    assert first_two.repeats_done == 2 and all(set(by) <= {0, 1} for by in first_two.ratios.values())
    assert not repeat_decision(first_two, AdaptiveRepeats(min=3, max=6, target_halfwidth=1.0)).stop

    from warehouse.ingest import ingest_raw

    report = ingest_raw(builder.raw_dir, tmp_path / "w.duckdb")
    assert report.ok, (report.quarantined, report.errors)
    with duckdb.connect(str(tmp_path / "w.duckdb"), read_only=True) as con:
        for metric in ("throughput", "tpot_p50"):
            rows = con.execute(
                f"SELECT variant, workload, load_label, repeat, {metric}_speedup FROM v_speedup"
            ).fetchall()
            read = campaign_observations(builder.campaign_dir, metric=metric)
            assert sum(len(v) for v in read.ratios.values()) == len(rows) == 23
            for variant, workload, load, repeat, ratio in rows:
                assert read.ratios[Comparison(variant, workload, load)][repeat] == pytest.approx(
                    ratio, rel=1e-12
                )


def test_an_empty_or_missing_directory_has_no_observations(tmp_path: Path) -> None:
    observations = campaign_observations(tmp_path / "nothing")
    assert observations.repeats == () and not observations.ratios
    with pytest.raises(ValueError, match="metric must be one of"):
        campaign_observations(tmp_path, metric="e2e_p50")


# ------------------------------------------------------------------------------------------- the simulation


def test_the_vectorised_rule_agrees_with_repeat_decision() -> None:
    """benchmarks/adaptive_repeats.py simulates with stopping_repeats; it must be the rule itself."""
    rng = np.random.default_rng(7)
    rule = AdaptiveRepeats(min=3, max=7, target_halfwidth=0.12)
    logs = np.log(1.2) + rng.normal(0.0, 0.08, (60, 2, rule.max))
    used, means, halves = stopping_repeats(logs, rule, rule.interval_confidence())
    comparisons = [CHAT, CODE]
    assert 3 < used.mean() < 7  # the cases cover early and late stops
    for campaign in range(len(logs)):
        for done in range(1, rule.max + 1):
            ratios = {c: dict(enumerate(np.exp(logs[campaign, i, :done]))) for i, c in enumerate(comparisons)}
            decision = repeat_decision(Observations("throughput", tuple(range(done)), ratios), rule)
            if decision.stop:
                break
        assert done == used[campaign]
        for i, width in enumerate(decision.widths):
            assert width.halfwidth == pytest.approx(halves[campaign, i])
            assert math.log(width.estimate or 0) == pytest.approx(means[campaign, i])


def simulated_coverage(confidence_of: str, trials: int = 4000) -> float:
    """One comparison, sigma 0.1, target 0.07, min 3, max 10: where sequential looks bias the naive interval
    most (benchmarks/adaptive_repeats.py)."""
    rule = AdaptiveRepeats(min=3, max=10, target_halfwidth=0.07)
    rng = np.random.default_rng(2112)
    truth = math.log(1.3)
    logs = truth + rng.normal(0.0, 0.1, (trials, 1, rule.max))
    level = rule.interval_confidence(0.95) if confidence_of == "rule" else 0.95
    used, means, halves = stopping_repeats(logs, rule, level)
    assert (used >= rule.min).all() and (used < rule.max).mean() > 0.2  # it does stop early, often
    return float((np.abs(means - truth) <= halves).mean())


def test_the_rule_keeps_coverage_at_or_above_93_percent_and_the_naive_rule_does_not() -> None:
    trials = 4000
    floor = 0.93 - 2 * math.sqrt(0.93 * 0.07 / trials)  # 93% less two binomial standard errors
    assert simulated_coverage("rule", trials) >= floor
    naive = simulated_coverage("naive", trials)
    assert naive < floor, f"the naive rule covered {naive:.1%}: the check would not catch the bias"


def test_any_settings_with_min_max_and_target_serve_as_the_rule() -> None:
    """The spec keeps its own model of the three fields (experiments.spec); the rule reads them as they are."""

    @dataclass(frozen=True)
    class SpecRule:
        min: int
        max: int
        target_halfwidth: float

    observations = observed({CHAT: NARROW[:3], CODE: [0.9, 0.905, 0.895]})
    for target, stop in ((0.001, False), (1.0, True)):
        ours = repeat_decision(observations, AdaptiveRepeats(min=3, max=6, target_halfwidth=target))
        theirs = repeat_decision(observations, SpecRule(3, 6, target))
        assert ours == theirs and ours.stop is stop


def test_an_adaptive_campaign_is_reported_at_the_rule_s_confidence() -> None:
    adaptive = {"name": "x", "repeats": {"min": 3, "max": 6, "target_halfwidth": 0.1}}
    assert report_confidence(adaptive) == pytest.approx(0.975)
    assert report_confidence(adaptive, 0.9) == pytest.approx(0.95)
    assert report_confidence({"name": "x", "repeats": 4}) == 0.95
    assert report_confidence({}) == 0.95
