"""The decision's verdicts on the benefit rule, read with the verification campaign's validity, from planted
verifications of each outcome (confirmed, faster below the minimum effect, refuted, inconclusive, invalid);
promotion only of a confirmed, valid decision (refused otherwise, through the CLI too, unless --override);
a recomputed decision as a new revision; and no verdict from a point or a zero-width interval (the nightly
guard)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import yaml
from analysis_fixtures import PlantedBuilder, profile
from warehouse_fixtures import make_spec

from analysis.data import load_campaign
from analysis.recommend import Verdict, judge, overall, verification
from analysis.verification import NOT_JUDGED, decision_of, plan_verification, promoted_losses, write_decision
from artifacts import layout
from artifacts.documents import DecisionDocument, PromotionDocument
from artifacts.documents.decisions import BELOW_MIN_EFFECT, CONFIRMED, INCONCLUSIVE, REFUTED
from artifacts.store import read_document, write_json_atomic
from experiments.spec import parse_spec
from warehouse.db import reader
from warehouse.ingest import ingest_raw

PLAIN = {"name": "plain", "method": "none"}
EAGLE = {"name": "eagle3-k3", "method": "eagle3", "k": 3, "eagle_head": "models/tiny-eagle3"}
SWEEP = {"c1": 1.5, "c4": 0.8}  # the sweep recommends k=3 at batch 1-2 and off from 3
NOISE = [1.0, 1.01, 0.99]  # the schedule's launch-to-launch spread, per repeat
# What each planted verification measures at C=1 (the schedule's throughput over plain), its spread, and how
# much slower the A/A arm runs (beyond the 3% limit: an invalid campaign).
PLANTED = {
    "confirmed": (1.8, 0.01, 1.0),
    "below": (1.07, 0.01, 1.0),
    "refuted": (0.8, 0.01, 1.0),
    "inconclusive": (1.0, 0.08, 1.0),
    "invalid": (1.8, 0.01, 1.05),
}


def plant_sweep(variant: str, repeat: int, workload: str, load: str):
    if variant == "plain":
        return profile(0.020, None)
    return profile(0.020 / SWEEP[load], 0.5, tokens_per_chunk=2.5)


def planted(c1: float, spread: float, aa: float):
    noise = [1.0, 1 + spread, 1 - spread]

    def plant(variant: str, repeat: int, workload: str, load: str):
        base = 0.020 * (1 + 0.02 * repeat)
        if variant in ("plain", "plain-aa"):
            return profile(base * (aa if variant == "plain-aa" else 1.0), None)
        if load != "c1":  # off there: the schedule serves like plain (a little faster, to stay clear of 0.95)
            return profile(base / 1.07, None)
        return profile(base / c1 * noise[repeat], 0.5, tokens_per_chunk=2.5)

    return plant


@pytest.fixture(scope="module")
def verified(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Per outcome: the decision from its planted verification (three launches of each arm with an A/A arm,
    whose limit is 3% here), the plan, and the database."""
    root = tmp_path_factory.mktemp("verdicts")
    spec = make_spec("sweep", repeats=1, concurrencies=(1, 4), requests=4, warmup=0, variants=[PLAIN, EAGLE])
    sweep_db = PlantedBuilder(root / "sweep", spec=spec, plant=plant_sweep).build(root / "sweep.duckdb")
    plan = plan_verification(None, None, sweep_db)
    assert plan.spec is not None and plan.recommendation.schedule == [[1, 2, 3], [3, 256, 0]]
    verification_spec = {**plan.spec, "repeats": 3, "validity": {"aa_control": True, "max_aa_gap": 0.03}}
    plan.spec = verification_spec
    plan.spec_path = root / "verify.yaml"
    plan.spec_path.write_text(yaml.safe_dump(verification_spec, sort_keys=False))
    out: dict = {"plan": plan, "root": root}
    for name, (c1, spread, aa) in PLANTED.items():
        builder = PlantedBuilder(
            root / name, spec=parse_spec(verification_spec), plant=planted(c1, spread, aa)
        )
        db = builder.build(root / f"{name}.duckdb")
        with reader(db) as con:
            data = load_campaign(con)
        out[name] = decision_of(plan, data)
        out[f"{name}-verdicts"] = verification(data)
    return out


@pytest.mark.parametrize(
    ("k", "low", "high", "outcome"),
    [
        (3, 1.15, 1.40, CONFIRMED),  # clears 1 + min_effect (1.10)
        (3, 1.03, 1.71, BELOW_MIN_EFFECT),  # the 1.33x [1.03, 1.71]: faster, not by 10%
        (3, 0.80, 0.95, REFUTED),
        (3, 0.90, 1.20, INCONCLUSIVE),
        (0, 0.96, 1.02, CONFIRMED),  # off: no worse than plain within 5%
        (0, 0.80, 0.90, REFUTED),  # off: below 0.95 throughout: deploy plain there
        (0, 0.90, 1.01, INCONCLUSIVE),
    ],
)
def test_a_load_is_judged_on_the_benefit_rule(k: int, low: float, high: float, outcome: str) -> None:
    assert judge(k, math.sqrt(low * high), low, high, 3, 0.05, 0.10)[0] == outcome


@pytest.mark.parametrize(("low", "high", "n"), [(None, None, 1), (1.5, 1.5, 3), (0.7, 0.7, 2)])
def test_no_verdict_from_a_point_or_a_zero_width_interval(low, high, n) -> None:
    for k in (0, 3):
        outcome, reason = judge(k, low or 1.5, low, high, n, 0.05, 0.10)
        assert outcome == INCONCLUSIVE and reason.startswith(NOT_JUDGED)


def test_the_decisions_outcome_follows_from_its_loads() -> None:
    def load(outcome: str) -> Verdict:
        return Verdict(1, 3, 1.2, 1.1, 1.3, "n=3", 3, None, None, None, outcome, "planted", 0.05)

    assert overall([load(CONFIRMED), load(CONFIRMED)]) == CONFIRMED
    assert overall([load(CONFIRMED), load(BELOW_MIN_EFFECT)]) == BELOW_MIN_EFFECT
    assert overall([load(BELOW_MIN_EFFECT), load(INCONCLUSIVE)]) == INCONCLUSIVE
    assert overall([load(CONFIRMED), load(REFUTED), load(BELOW_MIN_EFFECT)]) == REFUTED
    assert overall([]) == INCONCLUSIVE


@pytest.mark.parametrize(
    ("name", "outcome", "at_c1", "validity"),
    [
        ("confirmed", CONFIRMED, CONFIRMED, "valid"),
        ("below", BELOW_MIN_EFFECT, BELOW_MIN_EFFECT, "valid"),
        ("refuted", REFUTED, REFUTED, "valid"),
        ("inconclusive", INCONCLUSIVE, INCONCLUSIVE, "valid"),
        ("invalid", INCONCLUSIVE, INCONCLUSIVE, "invalid"),
    ],
)
def test_each_planted_verification_gives_its_outcome(verified, name, outcome, at_c1, validity) -> None:
    doc: DecisionDocument = verified[name]
    assert (doc.outcome, doc.loads[0].outcome, doc.validity) == (outcome, at_c1, validity)
    assert doc.loads[0].k == 3 and doc.loads[1].k == 0
    if name != "invalid":  # the off range: no worse than plain, by its interval
        assert doc.loads[1].outcome == CONFIRMED
    assert doc.validity_reasons.startswith(f"{validity}:")
    assert (doc.refusal() is None) is (name == "confirmed")  # promotable: confirmed and valid only


def test_an_invalid_campaign_makes_every_load_inconclusive_naming_why(verified) -> None:
    doc: DecisionDocument = verified["invalid"]
    fast = verified["confirmed"]
    assert doc.loads[0].over_plain_low > 1.5  # as fast as the confirmed one, by its interval
    assert [load.outcome for load in doc.loads] == [INCONCLUSIVE, INCONCLUSIVE]
    assert all(load.reason.startswith("the verification campaign is invalid (A/A gap") for load in doc.loads)
    assert [load.over_plain for load in doc.loads] == pytest.approx([load.over_plain for load in fast.loads])
    assert "INVALID" not in doc.summary and "verification campaign invalid" in doc.summary
    assert "the verification campaign is invalid" in (doc.refusal() or "")


def test_a_resumed_verification_writes_a_new_revision_that_v_decision_shows(verified, home: Path) -> None:
    """A first run's decision with C=1 unmeasured (a failed cell), then the resumed run's with it measured:
    a second file, not the frozen first; the same figures again write nothing."""
    confirmed: DecisionDocument = verified["confirmed"]
    missing = confirmed.loads[0].model_copy(
        update={"outcome": INCONCLUSIVE, "reason": "not measured", "over_plain": None, "n_repeats": 0}
        | {"over_plain_low": None, "over_plain_high": None, "over_fixed": None}
        | {"over_fixed_low": None, "over_fixed_high": None}
    )
    first = confirmed.model_copy(update={"loads": [missing, confirmed.loads[1]], "outcome": INCONCLUSIVE})
    raw = home / "raw"
    builder = PlantedBuilder(
        raw, spec=parse_spec(verified["plan"].spec), plant=planted(*PLANTED["confirmed"])
    )
    db = builder.build(home / "warehouse.duckdb")
    assert builder.campaign_id == confirmed.campaign_id
    path1, doc1 = write_decision(first)
    path2, doc2 = write_decision(confirmed)
    path3, doc3 = write_decision(confirmed.model_copy(update={"created_utc": "2027-01-01T00:00:00Z"}))
    assert (doc1.revision, doc2.revision, doc3.revision) == (1, 2, 2) and path3 == path2 != path1
    assert (
        path2.name == f"{confirmed.decision_id}.rev2.json" and read_document(path1, DecisionDocument) == doc1
    )
    ingest_raw(raw, db)
    with reader(db) as con:
        rows = con.execute(
            "SELECT revision, outcome, validity, load_outcome FROM v_decision WHERE decision_id = ? "
            "ORDER BY concurrency",
            [confirmed.decision_id],
        ).fetchall()
        stored = con.execute("SELECT count(*) FROM decisions").fetchone()
        launches = con.execute(
            "SELECT DISTINCT launches, max_launches FROM v_decision WHERE decision_id = ?",
            [confirmed.decision_id],
        ).fetchall()
    assert rows == [(2, CONFIRMED, "valid", CONFIRMED), (2, CONFIRMED, "valid", CONFIRMED)]
    assert stored == (2,)  # both revisions are kept; the view shows the latest
    assert launches == [(3, None)]  # three launches per arm, a fixed count (migration 0026)


def _stored(home: Path, doc: DecisionDocument) -> str:
    """`doc` as the latest decision under HOME (as write_decision leaves it)."""
    write_json_atomic(layout.decision_file(home / "raw" / doc.campaign_id, doc.decision_id), doc)
    return doc.decision_id


@pytest.mark.parametrize("name", ["below", "refuted", "inconclusive", "invalid"])
def test_promotion_refuses_what_is_not_confirmed_by_a_valid_campaign(verified, home: Path, name) -> None:
    from typer.testing import CliRunner

    from cli.app import app
    from tasks.promote import promote_decision

    decision_id = _stored(home, verified[name])
    result = promote_decision(decision_id, True, "alice", "", "cli")
    assert result["promoted"] is False and result["refused"] is True
    expected = "the verification campaign is invalid" if name == "invalid" else f"the decision is {name}"
    expected = expected.replace("is below", f"is {BELOW_MIN_EFFECT}")
    assert expected in result["why"] and "--override" in result["why"]
    cli = CliRunner().invoke(app, ["promote", decision_id, "--approver", "alice"])
    assert cli.exit_code == 1, cli.output
    assert "not promotable" in cli.output and expected in " ".join(cli.output.split())
    assert not (home / "promoted").exists()
    assert not list((home / "raw").glob("*/promotions/*.json"))  # nothing recorded


def test_an_override_is_recorded_and_refuted_ranges_are_never_deployed(verified, home: Path) -> None:
    from tasks.promote import promote_decision

    below = _stored(home, verified["below"])
    result = promote_decision(below, True, "alice", "ship", "cli", override="the 7% pays for us")
    assert result["promoted"] is True and result["override"] == "the 7% pays for us"
    (path,) = (home / "raw").glob("*/promotions/*.json")
    stored = read_document(path, PromotionDocument)
    assert (
        stored.approver == "alice"
        and stored.override == "the 7% pays for us"
        and stored.decision_revision == 1
    )

    refuted = verified["refuted"].model_copy(update={"decision_id": "code-refuted0001"})
    result = promote_decision(_stored(home, refuted), True, "alice", "", "cli", override="ship it anyway")
    assert (
        result["refused"] is True and "deploy plain" in result["why"]
    )  # its only drafting range was refuted


def test_without_refuted_turns_a_refuted_drafting_range_off(verified) -> None:
    from tasks.promote import without_refuted

    doc: DecisionDocument = verified["confirmed"]
    drafting = [[1, 2, 3], [3, 256, 3]]  # a schedule drafting everywhere, refuted from batch 3
    loads = [doc.loads[0], doc.loads[1].model_copy(update={"k": 3, "outcome": REFUTED})]
    variant = {**(doc.variant or {}), "k_schedule": drafting}
    changed, notes, blocked = without_refuted(doc.model_copy(update={"loads": loads, "variant": variant}))
    assert blocked is None and changed.schedule == [[1, 2, 3], [3, 256, 0]]
    assert (changed.speculative_config or {})["num_speculative_tokens_per_batch_size"] == [
        [1, 2, 3],
        [3, 256, 0],
    ]
    assert notes == ["batch sizes 3-256: speculation off here, the verification refuted k=3"]
    _, _, off = without_refuted(
        doc.model_copy(update={"loads": [doc.loads[0], doc.loads[1].model_copy(update={"outcome": REFUTED})]})
    )
    assert off is not None and "3-256: refuted with speculation off" in off


def test_the_nightly_guard_alerts_on_a_planted_regression_not_on_a_no_change(verified) -> None:
    lost, unjudged = promoted_losses(verified["refuted-verdicts"])
    assert [v.concurrency for v in lost] == [1] and unjudged == []
    assert promoted_losses(verified["confirmed-verdicts"]) == ([], [])


def test_the_nightly_guard_gives_no_verdict_from_a_point_or_a_zero_width_interval() -> None:
    point = Verdict(1, 3, 0.7, None, None, "n=1", 1, None, None, None, INCONCLUSIVE, "point", 0.05)
    flat = Verdict(4, 3, 0.7, 0.7, 0.7, "n=3", 3, None, None, None, INCONCLUSIVE, "zero width", 0.05)
    lost, unjudged = promoted_losses([point, flat])
    assert lost == [] and unjudged == [point, flat]  # below 1 as points, yet no alert


def test_a_decision_to_deploy_plain_is_not_promoted(verified, home: Path) -> None:
    """The options weighed by traffic chose plain: however its schedule was judged, there is no speculation
    config to deploy, and promotion says so (exit 1 through the CLI, as for any refusal)."""
    from tasks.promote import promote_decision

    plain = verified["confirmed"].model_copy(
        update={"choice": "plain", "choice_reason": "deploy plain: nothing clears 1.10"}
    )
    result = promote_decision(_stored(home, plain), True, "alice", "", "cli")
    assert result["refused"] is True and "the decision is to deploy plain" in result["why"]
    assert not list((home / "raw").glob("*/promotions/*.json"))


def test_a_chosen_fixed_config_is_what_promotion_deploys(verified, home: Path) -> None:
    """When the traffic-weighed choice is the verification's fixed arm rather than the schedule, the promoted
    files serve that arm's config (one depth at every batch size), not the schedule."""
    from artifacts.documents.decisions import DeploymentOption
    from tasks.promote import promote_decision

    doc: DecisionDocument = verified["confirmed"]
    fixed = next(v for v in verified["plan"].spec["variants"] if v["name"].startswith("fixed"))
    option = DeploymentOption(
        name=fixed["name"],
        kind="fixed",
        description=f"eagle3 k={fixed['k']}",
        speculative_config={"method": "eagle3", "num_speculative_tokens": fixed["k"]},
        loads=[],
    )
    chosen = doc.model_copy(update={"choice": fixed["name"], "options": [*doc.options, option]})
    result = promote_decision(_stored(home, chosen), True, "alice", "", "cli")
    assert result["promoted"] is True, result
    assert any(fixed["name"] in note for note in result["notes"])
    (path,) = (home / "raw").glob("*/promotions/*.json")
    stored = read_document(path, PromotionDocument)
    assert (stored.speculative_config or {}).get("num_speculative_tokens") == fixed["k"]
    assert "num_speculative_tokens_per_batch_size" not in (stored.speculative_config or {})
