"""Whole deployment options weighed by traffic (analysis/options.py, docs/decision.md "Deployment options and
traffic"): on a planted verification, the same per-load ratios under three traffic profiles choose three
different options (the schedule, a fixed config, plain); the schedule's off range is scored at its measured
cost; plain wins when nothing clears the benefit rule; a refuted load disqualifies an option; the options and
the choice reach the decision document, v_decision and the report; the traffic files (a list, a Prometheus
range export) parse and bad ones are refused naming the file and field."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml
from analysis_fixtures import PlantedBuilder, profile
from warehouse_fixtures import make_spec

from analysis.data import load_campaign
from analysis.options import (
    EQUAL,
    Candidate,
    Figure,
    TrafficProfile,
    choose,
    read_traffic,
    score,
    traffic_profile,
)
from analysis.stats import log_ratio, ratio_interval, weighted_ratio_interval
from analysis.verification import decision_of, plan_verification, write_decision
from artifacts.documents.decisions import PLAIN_OPTION, DecisionDocument
from experiments.spec import DecisionSpec, parse_spec
from specgauge.errors import InputError
from warehouse.db import reader
from warehouse.ingest import ingest_raw

PLAIN = {"name": "plain", "method": "none"}
EAGLE = {"name": "eagle3-k3", "method": "eagle3", "k": 3, "eagle_head": "models/tiny-eagle3"}
SWEEP = {"c1": 1.5, "c4": 0.8}  # the sweep recommends k=3 at batch 1-2 and off from 3
# The verification's planted throughput over plain: (ratio, per-repeat spread) per arm and load. The schedule
# drafts at C=1 and is off at C=4, where its engine still costs 15% (wide: the off range is not refuted).
PLANTED = {
    ("recommended", "c1"): (1.8, [1.0, 1.01, 0.99]),
    ("recommended", "c4"): (0.85, [1.0, 1.12, 0.89]),
    ("fixed-k3", "c1"): (1.5, [1.0, 1.01, 0.99]),
    ("fixed-k3", "c4"): (1.0, [1.0, 0.99, 1.01]),
}
RULE = DecisionSpec()


def plant_sweep(variant: str, repeat: int, workload: str, load: str):
    if variant == "plain":
        return profile(0.020, None)
    return profile(0.020 / SWEEP[load], 0.5, tokens_per_chunk=2.5)


def plant_verification(variant: str, repeat: int, workload: str, load: str):
    base = 0.020 * (1 + 0.02 * repeat)
    if variant in ("plain", "plain-aa"):  # the verification's A/A arm (decision.verify_aa_control)
        return profile(base, None)
    ratio, noise = PLANTED[(variant, load)]
    if variant == "recommended" and load == "c4":  # speculation off: no drafts
        return profile(base / (ratio * noise[repeat]), None)
    return profile(base / (ratio * noise[repeat]), 0.5, tokens_per_chunk=2.5)


@pytest.fixture(scope="module")
def planted(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The sweep and its verification (plain, fixed k=3 and the schedule, three launches each), loaded."""
    root = tmp_path_factory.mktemp("options")
    spec = make_spec("sweep", repeats=1, concurrencies=(1, 4), requests=4, warmup=0, variants=[PLAIN, EAGLE])
    sweep_db = PlantedBuilder(root / "sweep", spec=spec, plant=plant_sweep).build(root / "sweep.duckdb")
    plan = plan_verification(None, None, sweep_db)
    assert plan.spec is not None and plan.recommendation.schedule == [[1, 2, 3], [3, 256, 0]]
    plan.spec = {**plan.spec, "repeats": 3}
    assert [v["name"] for v in plan.spec["variants"]] == ["plain", "fixed-k3", "recommended"]
    plan.spec_path = root / "verify.yaml"
    plan.spec_path.write_text(yaml.safe_dump(plan.spec, sort_keys=False))
    builder = PlantedBuilder(root / "verify", spec=parse_spec(plan.spec), plant=plant_verification)
    db = builder.build(root / "verify.duckdb")
    with reader(db) as con:
        data = load_campaign(con)
    with reader(sweep_db) as con:
        sweep = load_campaign(con)
    return {"plan": plan, "data": data, "sweep": sweep, "root": root}


def _traffic(root: Path, name: str, shares: dict[int, float]) -> Path:
    path = root / f"{name}.yaml"
    path.write_text(yaml.safe_dump([{"concurrency": c, "share": s} for c, s in shares.items()]))
    return path


def _decide(planted: dict, shares: dict[int, float] | None) -> DecisionDocument:
    traffic = (
        _traffic(planted["root"], "-".join(f"{c}x{s}" for c, s in shares.items()), shares) if shares else None
    )
    return decision_of(planted["plan"], planted["data"], sweep=planted["sweep"], traffic=traffic)


def _option(doc: DecisionDocument, name: str):
    return next(option for option in doc.options if option.name == name)


# -- the choice ---------------------------------------------------------------------------------------------
def test_the_same_ratios_under_three_traffic_profiles_choose_three_options(planted) -> None:
    """Mostly C=1: the schedule (1.8x there, the fixed k=3 1.5x); equal: the fixed k=3 (the schedule's interval, widened by its off
    range, does not clear 1.10, the fixed config's does); mostly C=4: plain (neither clears 1.10)."""
    low_load = _decide(planted, {1: 0.9, 4: 0.1})
    equal = _decide(planted, None)
    high_load = _decide(planted, {1: 0.2, 4: 0.8})
    shown = [(o.name, o.gain, o.gain_low, o.reason) for o in equal.options]
    assert (low_load.choice, equal.choice, high_load.choice) == ("schedule", "eagle3-k3", PLAIN_OPTION), shown
    assert [o.name for o in equal.options] == [PLAIN_OPTION, "schedule", "eagle3-k3"]
    assert equal.traffic == EQUAL and [load.share for load in _option(equal, "schedule").loads] == [0.5, 0.5]
    # the per-load ratios are the same under every profile: only the weights differ
    for doc in (low_load, high_load):
        for name in ("schedule", "eagle3-k3"):
            assert [load.over_plain for load in _option(doc, name).loads] == pytest.approx(
                [load.over_plain for load in _option(equal, name).loads]
            )
    schedule = _option(low_load, "schedule")
    assert schedule.eligible and schedule.gain_low is not None and schedule.gain_low > 1.1
    fixed = _option(equal, "eagle3-k3")
    assert fixed.eligible and fixed.gain == pytest.approx(math.sqrt(1.5 * 1.0), rel=0.03)
    # the fixed config's figures are the verification's launches of it (fixed-k3), not the sweep's one launch
    assert all(load.source.startswith("verification fixed-k3") for load in fixed.loads)
    assert all(load.n_repeats == 3 for load in fixed.loads)
    assert low_load.choice_reason.startswith("schedule (") and "deploy plain" in high_load.choice_reason
    assert high_load.summary.endswith("; deploy plain")


def test_an_off_range_is_scored_at_its_measured_cost(planted) -> None:
    """The schedule's off range (C=4) costs 15% in its own launches: scored so, never 1; with 80% of the
    traffic there the schedule loses to plain although it is 1.8x at C=1."""
    doc = _decide(planted, {1: 0.2, 4: 0.8})
    schedule = _option(doc, "schedule")
    off = schedule.loads[1]
    assert (off.concurrency, off.k) == (4, 0) and off.source.startswith("verification recommended")
    assert off.over_plain == pytest.approx(0.85, rel=0.03) and off.over_plain_high > 0.95 and not off.refuted
    drafted = schedule.loads[0].over_plain
    assert schedule.gain == pytest.approx(math.exp(0.2 * math.log(drafted) + 0.8 * math.log(off.over_plain)))
    assert schedule.gain < 1.1 and not schedule.eligible and "does not clear 1.10" in schedule.reason
    assert (schedule.worst_concurrency, doc.choice) == (4, PLAIN_OPTION)


def test_plain_wins_when_nothing_clears_the_benefit_rule() -> None:
    """Every speculative option 5% faster at every load, by tight intervals: faster, not worth it."""
    candidates = [
        Candidate(PLAIN_OPTION, "plain", "no speculation", None, {1: 0, 4: 0}, {}),
        _candidate("a", {1: 1.05, 4: 1.04}),
        _candidate("b", {1: 1.06, 4: 1.02}),
    ]
    traffic = TrafficProfile({1: 0.5, 4: 0.5}, EQUAL)
    options = [score(c, traffic, RULE, 0.95) for c in candidates]
    assert all(o.gain_low is not None and o.gain_low > 1.0 for o in options[1:])  # faster, by their intervals
    choice, why = choose(options, RULE, traffic)
    assert choice == PLAIN_OPTION and why.startswith("deploy plain: no speculative option")
    assert [o.eligible for o in options] == [True, False, False]


def test_a_refuted_load_disqualifies_an_option_however_fast_elsewhere() -> None:
    """Option a: 3x at C=1, 0.8x [< 0.95] at C=16; b: 1.4x everywhere. a's expected gain is higher, and it is
    refuted at C=16: b is chosen. With no traffic at C=16, a is chosen."""
    candidates = [_candidate("a", {1: 3.0, 16: 0.8}), _candidate("b", {1: 1.4, 16: 1.4})]
    traffic = TrafficProfile({1: 0.5, 16: 0.5}, EQUAL)
    a, b = (score(c, traffic, RULE, 0.95) for c in candidates)
    assert a.gain is not None and b.gain is not None and a.gain > b.gain and a.gain_low > 1.1
    assert not a.eligible and "refuted at C=16" in a.reason and a.loads[1].refuted
    assert (a.worst_concurrency, a.worst) == (16, pytest.approx(0.8, rel=1e-3))
    assert choose([a, b], RULE, traffic)[0] == "b"
    nowhere = TrafficProfile({1: 1.0, 16: 0.0}, "planted")
    a, b = (score(c, nowhere, RULE, 0.95) for c in candidates)
    assert a.eligible and choose([a, b], RULE, nowhere)[0] == "a"


def test_an_unmeasured_load_with_traffic_leaves_the_gain_unknown() -> None:
    candidate = _candidate("a", {1: 2.0})
    candidate.depth[4], candidate.figures[4] = 0, None  # an off range nobody measured: unknown, never 1
    option = score(candidate, TrafficProfile({1: 0.5, 4: 0.5}, EQUAL), RULE, 0.95)
    assert option.gain is None and not option.eligible and "not measured at C=4" in option.reason
    assert option.loads[1].over_plain is None and option.loads[1].source == "not measured"


def _candidate(name: str, ratios: dict[int, float]) -> Candidate:
    """Planted per-repeat ratios (three launches, 1% apart) measured in one campaign."""
    figures: dict[int, Figure | None] = {}
    for c, ratio in ratios.items():
        per_repeat = {r: ratio * m for r, m in enumerate([1.0, 1.01, 0.99])}
        interval = ratio_interval(list(per_repeat.values()))
        figures[c] = Figure(
            interval.estimate, interval.low, interval.high, per_repeat, "planted", f"planted {name}"
        )
    return Candidate(name, "fixed", f"planted {name}", {"method": "ngram"}, dict.fromkeys(ratios, 3), figures)


# -- the interval of a weighted gain ----------------------------------------------------------------------------
def test_a_weighted_gain_of_one_load_is_that_loads_interval() -> None:
    ratios = [1.5, 1.6, 1.4]
    one = weighted_ratio_interval([(1.0, log_ratio(ratios))])
    alone = ratio_interval(ratios)
    assert (one.estimate, one.low, one.high) == pytest.approx((alone.estimate, alone.low, alone.high))
    point = weighted_ratio_interval([(0.5, log_ratio(ratios)), (0.5, log_ratio([2.0]))])
    assert point.low == point.high == point.estimate  # a weighted point: no interval
    both = weighted_ratio_interval([(0.5, log_ratio(ratios)), (0.5, log_ratio([0.9, 1.0, 0.95]))])
    assert both.estimate == pytest.approx(
        math.sqrt(one.estimate * math.exp(log_ratio([0.9, 1.0, 0.95]).mean))
    )
    assert both.low < both.estimate < both.high


def test_loads_of_one_launch_are_combined_per_launch() -> None:
    """A slow plain launch raises every load's ratio of that repeat: the per-launch combination keeps that
    correlation (wider than treating the loads as independent)."""
    shared = [1.0, 1.2, 0.85]  # the launch effect, the same at both loads
    candidate = _candidate("a", {1: 1.5, 4: 1.5})
    for c in (1, 4):
        figure = candidate.figures[c]
        assert figure is not None
        per_repeat = {r: 1.5 * shared[r] for r in range(3)}
        interval = ratio_interval(list(per_repeat.values()))
        candidate.figures[c] = Figure(interval.estimate, interval.low, interval.high, per_repeat, "one", "x")
    option = score(candidate, TrafficProfile({1: 0.5, 4: 0.5}, EQUAL), RULE, 0.95)
    one_load = ratio_interval([1.5 * m for m in shared])
    assert (option.gain_low, option.gain_high) == pytest.approx((one_load.low, one_load.high))


# -- the decision document, the warehouse and the report ---------------------------------------------------
def test_the_options_and_the_choice_reach_v_decision_and_the_report(planted, home: Path) -> None:
    from analysis.report_sections import decision_section

    raw = home / "raw"
    builder = PlantedBuilder(raw, spec=parse_spec(planted["plan"].spec), plant=plant_verification)
    db = builder.build(home / "warehouse.duckdb")
    doc = _decide(planted, None)
    assert builder.campaign_id == doc.campaign_id
    write_decision(doc)
    ingest_raw(raw, db)
    with reader(db) as con:
        frame = con.sql("SELECT * FROM v_decision ORDER BY concurrency").pl()
    first = frame.row(0, named=True)
    assert (first["choice"], first["traffic"]) == ("eagle3-k3", EQUAL)
    stored = json.loads(first["options"])
    assert [o["name"] for o in stored] == [PLAIN_OPTION, "schedule", "eagle3-k3"]
    assert [o["eligible"] for o in stored] == [True, False, True]
    html = decision_section(frame).body
    assert "Deployment options, weighed by traffic" in html and "Deploy: eagle3-k3" in html


# -- traffic files ----------------------------------------------------------------------------------------------
def _prometheus(values: list[str], name: str = "vllm:num_requests_running") -> dict:
    return {
        "status": "success",
        "data": {
            "resultType": "matrix",
            "result": [
                {
                    "metric": {"__name__": name, "model_name": "tiny"},
                    "values": [[1765000000 + 15 * i, v] for i, v in enumerate(values)],
                }
            ],
        },
    }


def test_a_list_and_a_prometheus_export_parse_and_bin_to_the_measured_loads(tmp_path: Path) -> None:
    listed = tmp_path / "traffic.yaml"
    listed.write_text(
        "- {concurrency: 1, share: 3}\n- {concurrency: 4, share: 1}\n- {concurrency: 8, share: 0}\n"
    )
    profile = traffic_profile(listed, [1, 4, 16])
    assert profile.shares == {1: 0.75, 4: 0.25, 16: 0.0} and str(listed) in profile.source
    as_json = tmp_path / "traffic.json"
    as_json.write_text(json.dumps([{"concurrency": 16, "share": 0.5}, {"concurrency": 2, "share": 0.5}]))
    assert traffic_profile(as_json, [1, 4, 16]).shares == {
        1: 0.5,
        4: 0.0,
        16: 0.5,
    }  # 2 lies in 1's range (1-2)
    # 10 samples: 2 idle (left out), batch 1, 2 (-> C=1), 3, 5, 8 (-> C=4), 9, 30, 400 (-> C=16)
    export = tmp_path / "running.json"
    export.write_text(json.dumps(_prometheus(["0", "1", "2", "3", "5", "8", "9", "30", "400", "0"])))
    profile = traffic_profile(export, [1, 4, 16])
    assert profile.shares == pytest.approx({1: 2 / 8, 4: 3 / 8, 16: 3 / 8})
    assert "8 samples (2 idle left out)" in profile.source
    assert traffic_profile(None, [1, 4, 16]).shares == pytest.approx({1: 1 / 3, 4: 1 / 3, 16: 1 / 3})


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("- {concurrency: 0, share: 1}\n", "[0].concurrency"),
        ("- {concurrency: 1, share: 1}\n- {concurrency: 2, share: -1}\n", "[1].share"),
        ("- {concurrency: 1, share: x}\n", "[0].share"),
        ("- {concurrency: 1, shares: 1}\n", "[0].shares"),
        ("- {concurrency: 1}\n", "[0].share"),
        ("- {concurrency: 1, share: 1}\n- {concurrency: 1, share: 2}\n", "[1].concurrency"),
        ("- {concurrency: 1, share: 0}\n", "[].share"),
        ("[]\n", "[]"),
        ("{foo: 1}\n", "(top level)"),
        (json.dumps({"status": "error", "error": "bad query"}), "status"),
        (
            json.dumps({**_prometheus(["1"]), "data": {"resultType": "vector", "result": []}}),
            "data.resultType",
        ),
        (json.dumps(_prometheus(["1", "many"])), "data.result[0].values[1]"),
        (json.dumps(_prometheus(["1", "-2"])), "data.result[0].values[1]"),
        (json.dumps(_prometheus(["1"], name="vllm:num_requests_waiting")), "data.result[0].metric.__name__"),
        (json.dumps(_prometheus(["0", "0"])), "data.result"),
        ('{"status": "success", "data": ', "invalid JSON"),
    ],
)
def test_a_bad_traffic_file_is_refused_naming_the_file_and_field(
    tmp_path: Path, text: str, field: str
) -> None:
    path = tmp_path / "traffic.json"
    path.write_text(text)
    with pytest.raises(InputError) as raised:
        read_traffic(path)
    message = str(raised.value)
    assert message.startswith(str(path)) and f": {field}" in message, message


def test_decide_refuses_a_bad_traffic_file_before_it_launches_anything(tmp_path: Path, home: Path) -> None:
    from typer.testing import CliRunner

    from cli.app import app

    path = tmp_path / "traffic.yaml"
    path.write_text("- {concurrency: 1, share: -1}\n")
    result = CliRunner().invoke(app, ["decide", "--campaign", "nothing-here", "--traffic", str(path)])
    assert result.exit_code == 2, result.output
    assert f"{path}" in " ".join(result.output.split()) and "[0].share" in result.output
    assert not (home / "raw").exists()
