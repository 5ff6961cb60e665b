"""Capacity search (tasks/capacity.py): order-statistic bounds of a p99, each point's verdict, the ramp and
bisection on planted latency curves, its record in the warehouse and the report's ratio with its interval,
and one search against the real engine."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import binom
from warehouse_fixtures import RawBuilder, make_spec

from artifacts import layout
from artifacts.store import write_json_atomic
from tasks.capacity import (
    Limits,
    Point,
    SearchSettings,
    judge_metric,
    judge_point,
    min_requests,
    next_rate,
    order_statistic_bounds,
    run_search,
)

LIMITS = Limits(ttft_s=1.0, tpot_s=0.1, quantile=0.99, confidence=0.95)


@pytest.mark.parametrize("quantile,confidence", [(0.99, 0.95), (0.99, 0.9), (0.9, 0.9), (0.95, 0.99)])
def test_bounds_are_the_binomial_order_statistics(quantile: float, confidence: float) -> None:
    for n in (1, 5, 22, 50, 100, 229, 230, 298, 299, 300, 1000):
        lower, upper = order_statistic_bounds(n, quantile, confidence)
        # rank j bounds the quantile from above with probability P(Binomial(n, q) <= j - 1)
        covers_above = [j for j in range(1, n + 1) if binom.cdf(j - 1, n, quantile) >= confidence]
        covers_below = [i for i in range(1, n + 1) if binom.sf(i - 1, n, quantile) >= confidence]
        assert upper == (min(covers_above) if covers_above else None), n
        assert lower == (max(covers_below) if covers_below else None), n
    assert min_requests(0.99, 0.95) == 299  # the classic: the maximum of 299 bounds p99 at 95%
    assert order_statistic_bounds(298, 0.99, 0.95)[1] is None
    assert order_statistic_bounds(299, 0.99, 0.95)[1] == 299


def test_a_point_is_met_violated_or_undecided_by_its_bounds() -> None:
    fast = [0.5] * 299
    assert judge_metric(fast, 0, 1.0, LIMITS).verdict == "met"
    # one slow request in 299: the maximum (the only upper bound) is over the limit, the lower bound is not
    assert judge_metric([*fast[:-1], 3.0], 0, 1.0, LIMITS).verdict == "undecided"
    # ten slow ones: even the lower bound of the p99 is over the limit
    slow = judge_metric([*fast[:-10], *[3.0] * 10], 0, 1.0, LIMITS)
    assert slow.verdict == "violated" and slow.lower == 3.0 and slow.observed == 3.0
    # too few requests for an upper bound: never met, however fast
    assert judge_metric([0.1] * 100, 0, 1.0, LIMITS).verdict == "undecided"
    # a failed request is an infinite latency
    failures = judge_metric(fast[:-10], 10, 1.0, LIMITS)
    assert failures.verdict == "violated" and failures.observed is None
    point = judge_point(2.0, "x", fast, [0.2] * 299, 0, LIMITS)  # TTFT met, TPOT violated
    assert point.verdict == "violated" and not point.meets
    assert judge_point(2.0, "x", fast, [0.05] * 299, 0, LIMITS, status="failed").verdict == "violated"


def curve(capacity: float, n: int = 299):
    """A deployment whose every latency grows with the rate and crosses the TTFT limit at `capacity`."""

    def measure(rate: float) -> Point:
        ttft = LIMITS.ttft_s * rate / capacity
        return judge_point(rate, f"p{rate:g}", [ttft] * n, [0.05] * n, 0, LIMITS)

    return measure


def test_ramp_then_bisection_brackets_the_capacity_within_the_precision() -> None:
    settings = SearchSettings(start_rps=1.0, growth=2.0, precision=0.05, max_points=12)
    result = run_search(curve(5.3), LIMITS, settings)
    rates = [p.rate for p in result.points]
    assert rates[:4] == [1.0, 2.0, 4.0, 8.0]  # the ramp, to the first failure
    assert result.converged and result.capacity_rps is not None and result.first_failing_rps is not None
    assert result.capacity_rps <= 5.3 < result.first_failing_rps <= result.capacity_rps * 1.05
    assert [p.meets for p in result.points] == [r <= 5.3 for r in rates]
    # deterministic: the same measurements propose the same rates (a resumed search reuses its cells)
    assert [p.rate for p in run_search(curve(5.3), LIMITS, settings).points] == rates
    record = json.loads(json.dumps(result.as_dict()))
    assert record["capacity_rps"] == result.capacity_rps and len(record["points"]) == len(rates)


def test_the_search_ramps_down_stops_at_its_edges_and_says_why() -> None:
    down = run_search(curve(0.3), LIMITS, SearchSettings(start_rps=2.0, precision=0.1))
    assert [p.rate for p in down.points][:4] == [2.0, 1.0, 0.5, 0.25]
    assert down.capacity_rps is not None and down.capacity_rps <= 0.3 < down.first_failing_rps
    roomy = run_search(curve(1000.0), LIMITS, SearchSettings(start_rps=1.0, max_rps=16.0))
    assert roomy.capacity_rps == 16.0 and roomy.first_failing_rps is None
    assert "capacity is at least that" in roomy.stopped_because
    short = run_search(curve(5.3), LIMITS, SearchSettings(start_rps=1.0, max_points=4))
    assert len(short.points) == 4 and not short.converged and "max_points" in short.stopped_because
    hopeless = run_search(curve(0.01), LIMITS, SearchSettings(start_rps=0.4, min_rps=0.1))
    assert hopeless.capacity_rps is None and "min_rps" in hopeless.stopped_because
    assert next_rate([], SearchSettings(start_rps=1.23456)) == 1.23


def test_noisy_latencies_are_judged_with_their_confidence() -> None:
    """Exponential TTFTs whose p99 crosses the limit at 5 req/s: each search brackets it, or stays below it
    where a point near the limit is undecided (never above: a claimed capacity has its confidence)."""
    rng = np.random.default_rng(0)

    def measure(rate: float) -> Point:
        mean = LIMITS.ttft_s / math.log(100) * rate / 5.0  # p99 of Exp(mean) = mean * ln(100)
        return judge_point(rate, "p", rng.exponential(mean, 400).tolist(), [0.05] * 400, 0, LIMITS)

    for _ in range(20):
        result = run_search(measure, LIMITS, SearchSettings(start_rps=1.0, precision=0.1))
        assert result.capacity_rps is not None and result.capacity_rps <= 5.0 * 1.02


def write_search(builder: RawBuilder, variant: str, repeat: int, capacity: float, failing: float) -> None:
    slot = builder.slot(variant, repeat)
    search_id = f"{variant}.r{repeat}.chat"
    result = run_search(curve(capacity), LIMITS, SearchSettings(start_rps=1.0, precision=0.05))
    record = {
        "search_id": search_id,
        "campaign_id": builder.campaign_id,
        "deployment_id": f"{slot.deployment_id}.l1",
        "variant": slot.variant.model_dump(mode="json"),
        "repeat": repeat,
        "workload": {"file": "workloads/smoke.jsonl", "sha256": None, "stratum": "chat"},
        "sampling": {"temperature": 0.0},
        "requests_per_point": 299,
        "warmup_per_point": 2,
        **result.as_dict(),
    }
    record["capacity_rps"], record["first_failing_rps"] = capacity, failing
    write_json_atomic(layout.search_file(builder.campaign_dir, search_id), record)


def test_searches_reach_the_warehouse_and_the_report_compares_capacity_with_an_interval(
    tmp_path: Path,
) -> None:
    from analysis.capacity import search_table
    from analysis.data import load_campaign
    from warehouse.db import reader
    from warehouse.ingest import ingest_raw

    builder = RawBuilder(tmp_path / "raw", spec=make_spec(repeats=2))
    builder.write_all(captures=False)
    # plain's capacity lies in [4, 4.4] in both repeats; the draft model's in [6, 6.6] and [6.3, 6.9]
    write_search(builder, "plain", 0, 4.0, 4.4)
    write_search(builder, "plain", 1, 4.1, 4.4)
    write_search(builder, "draft-k3", 0, 6.0, 6.6)
    write_search(builder, "draft-k3", 1, 6.3, 6.9)
    write_search(builder, "ngram-k3", 0, 3.9, 4.3)
    write_search(builder, "ngram-k3", 1, 4.2, 4.6)
    db = tmp_path / "w.duckdb"
    report = ingest_raw(tmp_path / "raw", db)
    assert report.ok, report.as_dict()
    with reader(db) as con:
        assert con.execute("SELECT count(*) FROM capacity_searches").fetchone() == (6,)
        points = con.execute(
            "SELECT count(*), count(DISTINCT verdict) FROM capacity_points WHERE search_key LIKE '%plain.r0.chat'"
        ).fetchone()
        data = load_campaign(con)
    assert points is not None and points[0] > 4 and points[1] == 2
    table = {r["variant"]: r for r in search_table(data).to_dicts()}
    draft = table["draft-k3"]
    assert draft["ratio_vs_plain"] == pytest.approx(6.15 / 4.05)
    assert draft["ratio_low"] == pytest.approx(6.0 / 4.4) and draft["ratio_high"] == pytest.approx(6.9 / 4.0)
    assert "raises capacity" in draft["verdict"]
    assert "not separated" in table["ngram-k3"]["verdict"]
    assert table["plain"]["verdict"].startswith("baseline")
    # re-ingesting changes nothing; a search file is immutable
    again = ingest_raw(tmp_path / "raw", db)
    assert again.ok
    with reader(db) as con:
        assert con.execute("SELECT count(*) FROM capacity_searches").fetchone() == (6,)


@pytest.mark.engine
@pytest.mark.timeout(900)
def test_a_search_on_the_engine_writes_its_points_as_cells_and_its_record(engines, tmp_path: Path) -> None:
    """The pool's plain engine searched with a loose confidence (p90 at 90%: 22 requests a point) so that it
    takes seconds: every verdict agrees with the order statistics of its cell's own requests."""
    import polars as pl
    import yaml

    from experiments.plan import plan_campaign
    from experiments.spec import parse_spec
    from tasks.capacity import search_deployment
    from warehouse.ingest import ingest_raw
    from workloads.schema import load_corpus

    repo = Path(__file__).resolve().parent.parent
    data = yaml.safe_load((repo / "experiments" / "capacity.yaml").read_text())
    data["capacity"] |= {
        "quantile": 0.9,
        "confidence": 0.9,
        "start_rps": 2.0,
        "max_points": 4,
        "precision": 0.5,
    }
    data["slo"] = {"ttft_p99_s": 1.0, "tpot_p99_s": 0.05}
    data["variants"] = [{"name": "plain", "method": "none"}]
    spec = parse_spec(data)
    plan = plan_campaign(spec)
    (search,) = plan.searches()
    assert search.search_id == "plain.r0.code"
    deployment = engines.get("plain")
    raw = tmp_path / "raw"
    directory = raw / plan.campaign_id
    from tasks.campaign_state import record_campaign

    record_campaign(plan, spec, raw)
    path = search_deployment(
        deployment,
        search,
        spec,
        campaign_id=plan.campaign_id,
        repeat=0,
        corpus=load_corpus(repo / "workloads" / "smoke.jsonl"),
        directory=directory,
        alive=lambda: True,
    )
    record = json.loads(path.read_text())
    assert record["requests_per_point"] == 22 and 1 <= len(record["points"]) <= 4
    for point in record["points"]:
        (cell_dir,) = layout.cell_attempts(layout.cells_dir(directory), point["cell_id"])
        requests = pl.read_parquet(cell_dir / layout.REQUESTS).filter(pl.col("phase") == "measured")
        assert (
            requests.height == 22
            and json.loads((cell_dir / layout.META).read_text())["load"]["rate"] == point["rate"]
        )
        good = requests.filter(pl.col("ok"))
        worst_ttft = math.inf if good.height < requests.height else good["ttft_s"].max()
        worst_tpot = math.inf if good.height < requests.height else good["tpot_s"].max()
        # p90 at 90% from 22 requests: the upper bound is the largest latency, the lower one the 17th
        met = worst_ttft <= 1.0 and worst_tpot <= 0.05
        assert (point["verdict"] == "met") == met, point
    met_rates = [p["rate"] for p in record["points"] if p["verdict"] == "met"]
    failing = [p["rate"] for p in record["points"] if p["verdict"] != "met"]
    assert record["first_failing_rps"] == (min(failing) if failing else None)
    assert record["capacity_rps"] == (
        max((r for r in met_rates if not failing or r < min(failing)), default=None)
    )
    report = ingest_raw(raw, tmp_path / "w.duckdb")
    assert report.ok, report.as_dict()


def test_the_plan_searches_every_variant_but_the_synthetic_ones_and_a_slot_waits_for_its_search(
    tmp_path: Path,
) -> None:
    import yaml

    from experiments.plan import plan_campaign
    from experiments.spec import parse_spec
    from specgauge.errors import SpecError
    from tasks.campaign_state import deployment_done

    repo = Path(__file__).resolve().parent.parent
    data = yaml.safe_load((repo / "experiments" / "depth-load.yaml").read_text())
    data["capacity"] = {"workload": "code"}
    plan = plan_campaign(parse_spec(data))
    searched = {d.variant.name for d in plan.deployments if d.search is not None}
    assert searched == {"plain", "ngram-k1", "ngram-k2", "ngram-k3", "ngram-k5"}  # not the synthetic ones
    # a swept variant's copies answer to its name
    data["capacity"] = {"variants": ["ngram"], "start_rps": 2.0}
    only = plan_campaign(parse_spec(data))
    assert {d.variant.name for d in only.deployments if d.search} == {f"ngram-k{k}" for k in (1, 2, 3, 5)}
    with pytest.raises(SpecError, match=r"capacity\.variants eagle are not variants"):
        parse_spec({**data, "capacity": {"variants": ["eagle"]}})
    with pytest.raises(SpecError, match="min_rps <= start_rps <= max_rps"):
        parse_spec({**data, "capacity": {"start_rps": 500}})
    # a capacity search alone is a load: no concurrencies or rates needed
    alone = parse_spec({**data, "load": {}, "capacity": {}, "capture": {"enabled": False}})
    empty = plan_campaign(alone)
    assert not alone.load.concurrencies and not empty.cells()
    # a slot with no cells left is still to do while its search has no record
    first = next(d for d in empty.deployments if d.search is not None)
    assert not deployment_done(tmp_path, first)
    assert first.search is not None
    layout.capacity_dir(tmp_path).mkdir()
    write_json_atomic(layout.search_file(tmp_path, first.search.search_id), {"search_id": "x"})
    assert deployment_done(tmp_path, first)
