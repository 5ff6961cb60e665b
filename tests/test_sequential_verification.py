"""Verification that launches until it decides (analysis/sequential_verification.py, issue 41 item 4): the stop
rule on planted per-load observations, the depths it judges each load by, the spec form and the cap, the
verification spec that carries the rule, a raw campaign read mid-run, the decision that says how many
launches it took, and the benchmark's vectorised path agreeing with the product's rule."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import numpy as np
import pytest
from analysis_fixtures import PlantedBuilder, profile
from pydantic import ValidationError
from warehouse_fixtures import make_spec

from analysis.adaptive_repeats import Comparison, Observations, campaign_observations
from analysis.sequential_verification import (
    claimed_depths,
    look_confidence,
    report_confidence,
    should_stop,
    spec_decision,
    verification_decision,
)
from artifacts.documents.decisions import CONFIRMED, INCONCLUSIVE, REFUTED
from experiments.spec import DecisionSpec, UntilDecided, parse_spec

REPO = Path(__file__).resolve().parents[1]
C1 = Comparison("recommended", "chat", "c1")  # the schedule drafts here (k=3)
C4 = Comparison("recommended", "chat", "c4")  # and is off here (k=0)
DEPTHS = {C1: 3, C4: 0}
RULE = UntilDecided(until="decided", min=2, max=6)
FAST = [1.50, 1.52, 1.49, 1.51]  # far above 1.10, tight: confirmed from 3 launches at 98.75%
SLOW_OFF = [0.80, 0.81, 0.79, 0.80]  # the off range well below 0.95: refuted
HOLDS = [0.90, 1.10, 1.00, 0.95]  # holds 0.95 and 1: inconclusive


def observed(ratios: dict[Comparison, list[float]]) -> Observations:
    repeats = max(len(values) for values in ratios.values())
    return Observations(
        "throughput", tuple(range(repeats)), {c: dict(enumerate(v)) for c, v in ratios.items()}
    )


def decide(ratios: dict[Comparison, list[float]], rule: UntilDecided = RULE):
    return verification_decision(observed(ratios), rule, DEPTHS, min_effect=0.10, tolerance=0.05)


def test_it_stops_once_every_load_is_decided() -> None:
    decision = decide({C1: FAST[:3], C4: SLOW_OFF[:3]})
    assert decision.stop and decision.repeats_done == 3 and decision.undecided == ()
    assert [v.outcome for v in decision.verdicts] == [CONFIRMED, REFUTED]
    assert decision.confidence == pytest.approx(look_confidence(RULE, 0.95)) == pytest.approx(0.9875)
    assert "every load decided (2)" in decision.reason
    assert decision.record()["outcomes"] == {"recommended chat c1": CONFIRMED, "recommended chat c4": REFUTED}


def test_it_launches_another_block_while_one_load_is_inconclusive_and_names_it() -> None:
    decision = decide({C1: FAST, C4: HOLDS})
    assert not decision.stop and decision.undecided == (C4,)
    assert [v.outcome for v in decision.verdicts] == [CONFIRMED, INCONCLUSIVE]
    assert (
        "1 of 2 loads undecided (recommended chat c4)" in decision.reason
        and "another block" in decision.reason
    )


def test_it_stops_at_max_launches_undecided_and_says_so() -> None:
    decision = decide({C1: [*FAST, 1.5, 1.5], C4: [*HOLDS, 1.0, 0.9]})
    assert decision.stop and decision.repeats_done == 6 and decision.undecided == (C4,)
    assert "the maximum (6) is spent" in decision.reason and "undecided" in decision.reason


def test_it_never_stops_before_the_first_launches_nor_on_a_load_without_an_interval() -> None:
    three = UntilDecided(until="decided", min=3, max=6)
    early = decide({C1: FAST[:2], C4: SLOW_OFF[:2]}, three)
    assert not early.stop and "2 of at least 3 launches" in early.reason
    one = decide({C1: FAST[:3], C4: SLOW_OFF[:1]})  # a failed cell left C=4 with one pair: no interval
    assert not one.stop and one.undecided == (C4,) and "not enough repeats" in one.verdicts[1].reason
    assert not decide({C1: FAST[:3], C4: []}).stop  # no pair at all yet


@pytest.mark.parametrize(
    ("outcomes", "done", "stop"),
    [
        ([CONFIRMED, REFUTED], 3, True),
        ([CONFIRMED, INCONCLUSIVE], 3, False),
        ([INCONCLUSIVE], 6, True),
        ([CONFIRMED], 1, False),
        ([], 2, True),  # nothing watched: nothing to wait for
    ],
)
def test_the_stop_rule_itself(outcomes: list[str], done: int, stop: bool) -> None:
    assert should_stop(outcomes, done, RULE) is stop


def test_each_load_is_judged_by_the_depth_the_variant_runs_there() -> None:
    spec = parse_spec(
        {
            **make_spec("v", concurrencies=(1, 4)).model_dump(mode="json", exclude_none=True),
            "variants": [
                {"name": "plain", "method": "none"},
                {
                    "name": "fixed-k3",
                    "method": "ngram",
                    "k": 3,
                    "prompt_lookup_min": 1,
                    "prompt_lookup_max": 4,
                },
                {
                    "name": "recommended",
                    "method": "ngram",
                    "k": 3,
                    "prompt_lookup_min": 1,
                    "prompt_lookup_max": 4,
                    "k_schedule": [[1, 2, 3], [3, 256, 0]],
                },
            ],
        }
    )
    fixed = Comparison("fixed-k3", "chat", "c4")
    opened = Comparison("recommended", "chat", "rate2")
    assert claimed_depths(spec.variants, [C1, C4, fixed, opened], ("recommended",)) == {C1: 3, C4: 0}
    assert claimed_depths(spec.variants, [C4, fixed])[fixed] == 3  # nothing named: every variant watched


def test_the_looks_split_alpha_over_the_looks_after_the_first() -> None:
    assert look_confidence(RULE) == pytest.approx(1 - 0.05 / 4)  # looks at 2..6 launches
    assert look_confidence(UntilDecided(until="decided", min=3, max=6)) == pytest.approx(1 - 0.05 / 3)
    assert look_confidence(UntilDecided(until="decided", min=2, max=3)) == pytest.approx(0.95)
    assert report_confidence({"repeats": {"until": "decided", "min": 2, "max": 6}}) == pytest.approx(0.9875)
    assert report_confidence({"repeats": {"min": 3, "max": 6, "target_halfwidth": 0.1}}) == pytest.approx(
        0.975
    )
    assert report_confidence({"repeats": 4}) == pytest.approx(0.95)


def test_the_spec_form_and_the_cap() -> None:
    spec = make_spec("v", repeats=2).model_dump(mode="json", exclude_none=True)
    decided = parse_spec({**spec, "repeats": {"until": "decided", "min": 2, "max": 5}})
    assert isinstance(decided.adaptive_repeats, UntilDecided) and decided.max_repeats == 5
    with pytest.raises(Exception, match="at least min"):
        parse_spec({**spec, "repeats": {"until": "decided", "min": 4, "max": 3}})
    with pytest.raises(Exception, match="greater than or equal to 2"):
        parse_spec({**spec, "repeats": {"until": "decided", "min": 1, "max": 3}})
    with pytest.raises(ValidationError, match=r"max_launches \(3\) must be at least verify_repeats \(4\)"):
        DecisionSpec(verify_repeats=4, max_launches=3)
    assert DecisionSpec().max_launches == 6


def test_the_cap_at_its_default_keeps_the_sweeps_campaign_id() -> None:
    from experiments.plan import campaign_id_for

    spec = make_spec("v").model_dump(mode="json", exclude_none=True)
    ids = [
        campaign_id_for(parse_spec({**spec, "decision": decision}))
        for decision in (
            {"verify_repeats": 4},
            {"verify_repeats": 4, "max_launches": 6},
            {"verify_repeats": 4, "max_launches": 8},
        )
    ]
    assert ids[0] == ids[1] != ids[2]


# ---------------------------------------------------------------------------------- planted campaigns
PLAIN = {"name": "plain", "method": "none"}
EAGLE = {"name": "eagle3-k3", "method": "eagle3", "k": 3, "eagle_head": "models/tiny-eagle3"}


def plant_sweep(variant: str, repeat: int, workload: str, load: str):
    if variant == "plain":
        return profile(0.020, None)
    return profile(0.020 / {"c1": 1.5, "c4": 0.8}[load], 0.5, tokens_per_chunk=2.5)


def plant_verification(variant: str, repeat: int, workload: str, load: str):
    """Plain drifts a little from launch to launch; the schedule is 1.8x faster at C=1 and off (plain's speed
    less 30%) at C=4, so both loads decide within a few launches."""
    wobble = 1 + 0.02 * ((repeat * 7) % 3 - 1)
    if variant in ("plain", "plain-aa"):  # the verification's A/A arm serves like plain
        return profile(0.020 * wobble, None)
    slower = 1 + 0.05 * repeat  # a spread t(1) cannot decide on, t(2) can
    return profile(0.020 * wobble / (1.8 if load == "c1" else 0.7) * slower, 0.5, tokens_per_chunk=2.5)


def sweep_plan(home: Path, decision: DecisionSpec | None = None):
    from analysis.verification import plan_verification

    spec = make_spec("sweep", repeats=1, concurrencies=(1, 4), requests=4, warmup=0, variants=[PLAIN, EAGLE])
    if decision is not None:
        spec = spec.model_copy(update={"decision": decision})
    db = PlantedBuilder(home / "raw", spec=spec, plant=plant_sweep).build(home / "warehouse.duckdb")
    return plan_verification(None, None, db)


def test_the_verification_spec_carries_the_rule_from_the_decision_section(home: Path) -> None:
    plan = sweep_plan(home)
    assert plan.spec is not None
    assert plan.spec["repeats"] == {"until": "decided", "min": 2, "max": 6, "variants": ["recommended"]}
    assert isinstance(parse_spec(plan.spec).adaptive_repeats, UntilDecided)
    fixed = sweep_plan(home / "fixed", DecisionSpec(verify_repeats=3, max_launches=3))
    assert fixed.spec is not None and fixed.spec["repeats"] == 3  # no room to look: a fixed count


def test_a_verification_read_mid_run_stops_once_decided_and_the_decision_says_how_many_launches(
    home: Path, tmp_path: Path
) -> None:
    from analysis.data import load_campaign
    from analysis.verification import decision_of
    from warehouse.db import reader
    from warehouse.ingest import ingest_raw

    plan = sweep_plan(home)
    assert plan.spec is not None
    verification = parse_spec(plan.spec)
    rule = verification.adaptive_repeats
    assert isinstance(rule, UntilDecided)
    builder = PlantedBuilder(tmp_path / "raw", spec=verification, plant=plant_verification)
    builder.write_campaign()
    ran = 3  # the rule stopped here (checked below): the blocks after it were never launched
    for slot in builder.plan.deployments:
        if slot.repeat < ran:
            builder.write_deployment(slot)
            for cell in slot.cells:
                builder.write_cell(slot, cell)
            for capture_id in slot.captures:
                builder.write_capture(slot, capture_id)
    builder.write_run()
    observations = campaign_observations(builder.campaign_dir)
    assert not spec_decision(observations.restricted_to([0, 1]), verification, rule).stop  # t(1): too wide
    decision = spec_decision(observations.restricted_to([0, 1, 2]), verification, rule)
    assert decision.stop, decision.reason
    assert {v.comparison.load: v.outcome for v in decision.verdicts} == {"c1": CONFIRMED, "c4": REFUTED}
    builder.write_gates()
    assert ingest_raw(builder.raw_dir, tmp_path / "v.duckdb").ok
    with reader(tmp_path / "v.duckdb") as con:
        doc = decision_of(plan, load_campaign(con))
    assert (doc.launches, doc.max_launches) == (3, 6)
    assert doc.confidence == pytest.approx(0.9875)  # judged at the level the rule stopped on
    assert [load.outcome for load in doc.loads] == [CONFIRMED, REFUTED]
    assert "3 launches per arm of at most 6" in doc.summary


def test_the_benchmark_applies_the_products_rule_campaign_by_campaign() -> None:
    """The script's vectorised intervals + judge + should_stop give the same stop and verdict as
    verification_decision on the same simulated launches."""
    path = REPO / "benchmarks" / "sequential_verification.py"
    module_spec = importlib.util.spec_from_file_location("sequential_verification_bench", path)
    assert module_spec is not None and module_spec.loader is not None
    bench = importlib.util.module_from_spec(module_spec)
    sys.modules[module_spec.name] = bench
    module_spec.loader.exec_module(bench)
    rng = np.random.default_rng(3)
    loads = [(3, 1.10), (0, 0.95)]
    logs = bench.launches([t for _, t in loads], 0.05, 60, rng)
    level = look_confidence(RULE, 0.95)
    expected = bench.run(loads, logs, bench.Bounds(2, 6), level)
    comparisons = [Comparison("recommended", "chat", f"c{i}") for i in range(len(loads))]
    depths = {c: k for c, (k, _) in zip(comparisons, loads, strict=True)}
    launches, covered = 0, 0
    for trial in range(logs.shape[0]):
        for n in range(2, 7):
            ratios = {c: list(np.exp(logs[trial, j, :n])) for j, c in enumerate(comparisons)}
            decision = decide_with(ratios, depths)
            if decision.stop:
                break
        launches += n
        first = decision.verdicts[0]
        covered += first.low is not None and first.low <= 1.10 <= (first.high or math.inf)
    assert launches / logs.shape[0] == pytest.approx(expected.launches)
    assert covered / logs.shape[0] == pytest.approx(expected.coverage)


def decide_with(ratios: dict[Comparison, list[float]], depths: dict[Comparison, int]):
    return verification_decision(observed(ratios), RULE, depths, min_effect=0.10, tolerance=0.05)
