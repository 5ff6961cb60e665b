"""The decision loop without an engine: the verdict per load from its interval (confirmed / refuted /
inconclusive, never from a point or a zero-width interval), the family one deployment serves, the decide
flow's run form, and the whole flow on the emulator with its sign-off pause resumed by typed input."""

from __future__ import annotations

import math

import pytest

from analysis.recommend import LoadChoice, Recommendation, best_family, judge, k_at, overall


def verdict(outcome: str):
    from analysis.recommend import Verdict

    return Verdict(1, 3, 1.2, 1.1, 1.3, "n=2", 2, None, None, None, outcome, "planted", 0.05)


@pytest.mark.parametrize(
    ("k", "low", "high", "outcome"),
    [
        (3, 1.05, 1.40, "confirmed"),  # on: the whole interval above 1
        (3, 0.80, 0.95, "refuted"),  # on: the whole interval below 1
        (3, 0.90, 1.20, "inconclusive"),  # on: the interval holds 1
        (0, 0.96, 1.02, "confirmed"),  # off: within the 5% tolerance of plain
        (0, 0.80, 0.90, "refuted"),  # off: the schedule with speculation off runs below plain
        (0, 0.90, 1.01, "inconclusive"),  # off: the interval holds 0.95
    ],
)
def test_a_claim_is_judged_by_its_whole_interval(k: int, low: float, high: float, outcome: str) -> None:
    estimate = math.sqrt(low * high)
    assert judge(k, estimate, low, high, 3, 0.05)[0] == outcome


@pytest.mark.parametrize(("low", "high", "n"), [(None, None, 1), (1.3, 1.3, 2), (None, None, 2)])
def test_no_verdict_from_a_point_or_a_zero_width_interval(low, high, n) -> None:
    outcome, reason = judge(3, 1.3, low, high, n, 0.05)
    assert outcome == "inconclusive" and "no interval" in reason


def test_the_overall_outcome_needs_every_load() -> None:
    assert overall([verdict("confirmed"), verdict("confirmed")]) == "confirmed"
    assert overall([verdict("confirmed"), verdict("inconclusive")]) == "inconclusive"
    assert overall([verdict("confirmed"), verdict("refuted"), verdict("inconclusive")]) == "refuted"
    assert overall([]) == "inconclusive"


def test_a_schedule_gives_the_depth_of_its_range() -> None:
    schedule = [[1, 2, 3], [3, 8, 1], [9, 256, 0]]
    assert [k_at(schedule, b, 3) for b in (1, 2, 3, 8, 9, 256, 300)] == [3, 3, 1, 1, 0, 0, 0]
    assert k_at(None, 16, 3) == 3


def choice(c: int, k: int, speedup: float) -> LoadChoice:
    return LoadChoice(c, k if speedup >= 1 else 0, k, speedup, None, None, "n=1", None, None, None, None, "", None)


def rec(family: str, *choices: LoadChoice) -> Recommendation:
    return Recommendation(family, family.split()[0], "code", list(choices), [], None)


def test_one_family_is_deployed_and_the_others_are_named_where_they_measured_higher() -> None:
    eagle = rec("eagle3 heads/e", choice(1, 3, 1.50), choice(4, 1, 1.05), choice(16, 1, 0.80))
    draft = rec("draft_model models/d", choice(1, 3, 1.55), choice(4, 3, 0.99), choice(16, 3, 0.75))
    ngram = rec("ngram", choice(1, 3, 1.10), choice(4, 3, 0.90), choice(16, 3, 0.70))
    chosen, notes = best_family([ngram, draft, eagle])
    # eagle3: sqrt-free geometric mean of (1.50, 1.05, off) beats draft's (1.55, off, off)
    assert chosen is eagle
    assert notes == [
        "C=1: draft_model models/d at k=3 measured 1.550x, above the chosen eagle3 heads/e's 1.500x "
        "(one deployment serves one method)"
    ]
    with pytest.raises(ValueError):
        best_family([])


def test_the_decide_forms_fields_have_their_descriptions_and_the_spec_select() -> None:
    """The run form the UI draws for the `decide` deployment: one typed request, every field described, the
    spec a select of the repo's experiments with the decision spec as default; the sign-off form likewise."""
    from flows.decide import Approval, decide

    schema = decide.parameters.model_dump()
    request = schema["definitions"]["DecisionRequest"]["properties"]
    assert set(request) == {"spec", "sweep_campaign_id", "label", "workload", "sign_off", "sign_off_timeout_s"}
    assert all(field.get("description") for field in request.values())
    assert request["spec"]["default"] == "experiments/decision.yaml"
    choices = schema["definitions"]["ExperimentFile"]["enum"]
    assert "experiments/decision.yaml" in choices and "experiments/demo.yaml" in choices
    approval = Approval.model_json_schema()["properties"]
    assert set(approval) == {"approve", "approver", "note"} and approval["approver"]["description"]
