"""The analysis answers what was planted: synthetic campaigns (tests/analysis_fixtures.py) written through the
real raw layout, the real correctness gate and the real ingest, with known speedups, a known crossover, a known
fit, known capacities and known refusals; the decision rule refuses what it must; results land in the
analysis_* tables idempotently and in one transaction."""

from __future__ import annotations

from pathlib import Path

import duckdb
import polars as pl
import pytest
from analysis_fixtures import PlantedBuilder, planted_throughput_speedup, profile
from typer.testing import CliRunner
from warehouse_fixtures import make_spec

from analysis.capacity import q5_statement
from analysis.data import AnalysisSettings, load_campaign
from analysis.run import analyze_campaign, compute
from analysis.store import ANALYSIS_TABLES, RUNS_TABLE, store_results
from cli.app import app
from warehouse.db import reader, writer

PLAIN_TPOT = 0.020
FAST = AnalysisSettings()

VARIANTS = {
    "plain": {"name": "plain", "method": "none"},
    "ngram-k3": {
        "name": "ngram-k3",
        "method": "ngram",
        "k": 3,
        "prompt_lookup_min": 1,
        "prompt_lookup_max": 4,
    },
    "draft-k3": {"name": "draft-k3", "method": "draft_model", "k": 3, "draft_model": "models/tiny-draft"},
    "draft-k2": {"name": "draft-k2", "method": "draft_model", "k": 2, "draft_model": "models/tiny-draft"},
}


def variants(*names: str) -> list[dict]:
    return [VARIANTS[n] for n in names]


def load_of(label: str) -> float:
    return float(label[4:]) if label.startswith("rate") else float(label[1:])


def analysed(db: Path, campaign_id: str | None = None, settings: AnalysisSettings = FAST):
    with reader(db) as con:
        data = load_campaign(con, campaign_id)
    return data, compute(data, settings)


def row(frame: pl.DataFrame, **where) -> dict:
    match = frame.filter(*[pl.col(k) == v for k, v in where.items()])
    assert match.height == 1, (where, match)
    return match.row(0, named=True)


# ------------------------------------------------------------------------------------- Q1: known speedup

DRIFT = [1.00, 1.08, 0.95, 1.03, 0.97]  # a deployment block's drift, shared by the variants of a repeat
NOISE = [1.02, 0.98, 1.01, 0.99, 1.00]  # the speculative deployment's own launch-to-launch variation
TRUE_TPOT_SPEEDUP = 1.6


@pytest.fixture(scope="module")
def speedup_db(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, PlantedBuilder]:
    root = tmp_path_factory.mktemp("speedup")

    def plant(variant: str, repeat: int, workload: str, load: str):
        tpot = PLAIN_TPOT * DRIFT[repeat]
        if variant == "plain":
            return profile(tpot, None)
        return profile(tpot / TRUE_TPOT_SPEEDUP * NOISE[repeat], 0.5, tokens_per_chunk=2.5)

    spec = make_spec(
        "speedup", repeats=5, concurrencies=(1, 4), requests=16, variants=variants("plain", "draft-k3")
    )
    builder = PlantedBuilder(root / "raw", spec=spec, plant=plant)
    return builder.build(root / "w.duckdb"), builder


def test_a_planted_speedup_lies_inside_its_interval_and_a_wrong_one_outside(speedup_db) -> None:
    db, _ = speedup_db
    _, results = analysed(db)
    for load in ("c1", "c4"):
        tpot = row(results.speedup, variant="draft-k3", load_label=load, metric="tpot_p50")
        assert tpot["n_repeats"] == 5 and len(tpot["per_repeat"]) == 5
        assert tpot["ci_low"] <= TRUE_TPOT_SPEEDUP <= tpot["ci_high"], tpot
        assert abs(tpot["estimate"] - TRUE_TPOT_SPEEDUP) < 0.05
        for wrong in (1.0, 1.3, 2.0):
            assert not tpot["ci_low"] <= wrong <= tpot["ci_high"]
        assert tpot["interval_excludes_one"] is True and tpot["interval"].startswith("n=5, t on log-ratios")
        throughput = row(results.speedup, variant="draft-k3", load_label=load, metric="throughput")
        truth = planted_throughput_speedup(PLAIN_TPOT, TRUE_TPOT_SPEEDUP)
        assert throughput["ci_low"] <= truth <= throughput["ci_high"], (truth, throughput)
        assert not throughput["ci_low"] <= 1.3 <= throughput["ci_high"]
        # TTFT was planted equal (request-level noise only): no speedup invented
        ttft = row(results.speedup, variant="draft-k3", load_label=load, metric="ttft_p50")
        assert ttft["estimate"] == pytest.approx(1.0, abs=0.08)


def test_pairing_is_by_repeat_so_block_drift_cancels(speedup_db) -> None:
    """Each repeat's ratio is against the plain deployment of the same block: the planted drift (up to 13%
    between blocks) cancels, leaving only the speculative launch's own 2% noise."""
    db, _ = speedup_db
    _, results = analysed(db)
    tpot = row(results.speedup, variant="draft-k3", load_label="c1", metric="tpot_p50")
    assert tpot["repeats"] == [0, 1, 2, 3, 4]
    for repeat, ratio in zip(tpot["repeats"], tpot["per_repeat"], strict=True):
        assert ratio == pytest.approx(TRUE_TPOT_SPEEDUP / NOISE[repeat], rel=0.06)


def test_one_repeat_gives_no_interval_and_no_winner(tmp_path: Path) -> None:
    def plant(variant, repeat, workload, load):
        return profile(
            PLAIN_TPOT if variant == "plain" else PLAIN_TPOT / 1.6, None if variant == "plain" else 0.5
        )

    spec = make_spec("single", repeats=1, concurrencies=(1,), variants=variants("plain", "draft-k3"))
    db = PlantedBuilder(tmp_path / "raw", spec=spec, plant=plant).build(tmp_path / "w.duckdb")
    _, results = analysed(db)
    for r in results.speedup.iter_rows(named=True):
        assert r["ci_low"] is None and r["ci_high"] is None and r["interval_excludes_one"] is None
        assert r["interval"] == "n=1, no interval"
    decision = row(results.decisions, variant="draft-k3")
    assert decision["wins"] is False and "n=1, no interval" in decision["reason"]
    assert decision["gate_passed"] is True  # refused for the missing interval alone
    assert any("one repeat" in note for note in results.notes)


# --------------------------------------------------------------------------- crossover, depth, break-even

CROSS_SPEEDUP = {1: 1.6, 2: 1.3, 4: 1.1, 8: 0.9, 16: 0.7}  # draft-k3's TPOT speedup by concurrency
CROSS_TRUTH = 2 ** (2 + 0.1 / 0.2)  # log2-interpolated between c4 (1.1) and c8 (0.9): 5.66
CROSS_NOISE = [1.01, 0.99, 1.015, 0.985]


@pytest.fixture(scope="module")
def crossover_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("crossover")

    def plant(variant: str, repeat: int, workload: str, load: str):
        if variant == "plain":
            return profile(PLAIN_TPOT, None)
        speedup = 1.25 if variant == "ngram-k3" else CROSS_SPEEDUP[int(load_of(load))]
        return profile(PLAIN_TPOT / speedup * CROSS_NOISE[repeat], 0.4, tokens_per_chunk=2.0)

    spec = make_spec(
        "crossover",
        repeats=4,
        concurrencies=tuple(CROSS_SPEEDUP),
        requests=16,
        variants=variants("plain", "ngram-k3", "draft-k3"),
    )
    return PlantedBuilder(root / "raw", spec=spec, plant=plant).build(root / "w.duckdb")


def test_a_planted_crossover_is_found_with_its_interval(crossover_db: Path) -> None:
    _, results = analysed(crossover_db)
    tpot = row(results.crossover, variant="draft-k3", metric="tpot_p50")
    assert tpot["status"] == "crosses"
    assert tpot["crossover"] == pytest.approx(CROSS_TRUTH, rel=0.1)
    assert tpot["ci_low"] <= CROSS_TRUTH <= tpot["ci_high"]
    assert tpot["ci_low"] >= 4 and tpot["ci_high"] <= 8  # bracketed by the loads around the crossing
    assert tpot["n_repeats"] == 4 and tpot["loads"] == [1.0, 2.0, 4.0, 8.0, 16.0]
    throughput = row(results.crossover, variant="draft-k3", metric="throughput")
    assert throughput["status"] == "crosses" and 4 < throughput["crossover"] < 8
    never = row(results.crossover, variant="ngram-k3", metric="tpot_p50")
    assert never["status"] == "pays throughout" and never["crossover"] is None
    assert "> 16" in never["interval"]


def test_crossover_when_no_repeat_is_paired_at_every_load() -> None:
    """A pair left out at one load (TPOT 0: a stream read in one burst) can leave no repeat present at
    every load; the crossover then comes from the estimates alone instead of failing the analysis."""
    from analysis.crossover import crossover_table
    from analysis.speedup import SPEEDUP_SCHEMA

    base = {"variant": "draft-k3", "method": "draft_model", "k": 3, "workload": "chat", "load_mode": "closed"}
    rows = [
        base
        | {"load_label": "c1", "concurrency": 1, "rate": None, "metric": "tpot_p50", "estimate": 1.2}
        | {"per_repeat": [1.2], "repeats": [0], "n_repeats": 1},
        base
        | {"load_label": "c4", "concurrency": 4, "rate": None, "metric": "tpot_p50", "estimate": 0.8}
        | {"per_repeat": [0.8], "repeats": [1], "n_repeats": 1},
    ]
    speedups = pl.DataFrame(rows, schema=SPEEDUP_SCHEMA)
    table = crossover_table(speedups, FAST)
    crossing = table.filter(pl.col("metric") == "tpot_p50").row(0, named=True)
    assert crossing["status"] == "crosses"
    assert crossing["crossover"] == pytest.approx(2 ** (0 + 0.2 / 0.4 * 2))  # log2 midpoint of 1 and 4: 2
    assert crossing["loads"] == [1.0, 4.0] and crossing["speedups"] == [1.2, 0.8]


def test_speedup_below_one_is_flagged_and_break_even_explains_it(crossover_db: Path) -> None:
    _, results = analysed(crossover_db)
    depth = results.depth
    for load, planted in CROSS_SPEEDUP.items():
        r = row(depth, variant="draft-k3", load_label=f"c{load}")
        assert r["below_one"] is (planted < 1), r
        # L > L* exactly when speculation is faster per token: L / L* is the mean-TPOT speedup
        assert r["pays_per_token"] is (planted > 1)
        assert r["tokens_per_step"] / r["break_even_tokens_per_step"] == pytest.approx(planted, rel=0.05)
        assert r["relative_step_time"] == pytest.approx(r["step_time_s"] / r["plain_step_time_s"], rel=0.03)
    # best depth per method and load: the only depth of each method is its best
    assert depth.filter(pl.col("best")).height == depth.height


# --------------------------------------------------------------------------------------- Q2: planted fit

FIT_SLOPE, FIT_INTERCEPT = 2.0, 0.6  # TPOT speedup = 0.6 + 2 x acceptance rate


@pytest.fixture(scope="module")
def fit_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("fit")
    strata, loads = ("chat", "code", "summarization"), (1, 2, 4, 8)
    acceptance = {
        (w, f"c{c}"): 0.2 + 0.045 * i for i, (w, c) in enumerate((w, c) for w in strata for c in loads)
    }

    def plant(variant: str, repeat: int, workload: str, load: str):
        if variant == "plain":
            return profile(PLAIN_TPOT, None)
        a = acceptance[(workload, load)]
        return profile(PLAIN_TPOT / (FIT_INTERCEPT + FIT_SLOPE * a), a, tokens_per_chunk=1 + 3 * a)

    spec = make_spec(
        "fit",
        repeats=2,
        concurrencies=loads,
        strata=strata,
        requests=16,
        variants=variants("plain", "draft-k3"),
    )
    return PlantedBuilder(root / "raw", spec=spec, plant=plant).build(root / "w.duckdb")


def test_a_planted_fit_slope_and_r2_are_recovered(fit_db: Path) -> None:
    _, results = analysed(fit_db)
    draft_q2 = {"question": "Q2", "method": "draft_model"}
    fit = row(results.fits, **draft_q2, predictor="acceptance_rate", response="tpot_p50_speedup")
    assert fit["n"] == 24 and fit["n_deployments"] == 2
    assert fit["slope_low"] <= FIT_SLOPE <= fit["slope_high"], fit
    assert fit["intercept_low"] <= FIT_INTERCEPT <= fit["intercept_high"], fit
    assert not fit["slope_low"] <= 1.0 <= fit["slope_high"]  # a wrong slope is outside
    assert fit["r2"] > 0.95 and fit["p_value"] < 1e-6
    by_length = row(
        results.fits, **draft_q2, predictor="mean_acceptance_length", response="throughput_speedup"
    )
    assert by_length["slope"] > 0 and by_length["r2"] > 0.9
    # one depth per method: the step-time fit says why it has no slope instead of inventing one
    step = row(results.fits.filter(pl.col("workload").is_null()), question="Q3", method="draft_model")
    assert step["slope"] is None and "one depth" in step["note"]


# ------------------------------------------------------------------ decision rule, Q4 and the stored tables

DECISION_SPEEDUP = {"draft-k3": 1.6, "ngram-k3": 1.3, "draft-k2": 1.5}
DRAFT_KV, PLAIN_KV = 30000, 43690


@pytest.fixture(scope="module")
def decision_db(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, PlantedBuilder]:
    root = tmp_path_factory.mktemp("decision")

    def plant(variant: str, repeat: int, workload: str, load: str):
        if variant == "plain":
            return profile(PLAIN_TPOT, None)
        return profile(
            PLAIN_TPOT / DECISION_SPEEDUP[variant] * CROSS_NOISE[repeat], 0.5, tokens_per_chunk=2.0
        )

    spec = make_spec(
        "decision",
        repeats=3,
        concurrencies=(1, 4),
        requests=16,
        variants=variants("plain", "ngram-k3", "draft-k3", "draft-k2"),
    )
    builder = PlantedBuilder(
        root / "raw",
        spec=spec,
        plant=plant,
        failed=lambda variant, *_: 1 if variant == "draft-k2" else 0,  # 15/16 = 93.8% success
        kv_tokens={"draft-k3": DRAFT_KV, "draft-k2": DRAFT_KV},
        diverging=frozenset({"ngram-k3"}),
    )
    return builder.build(root / "w.duckdb"), builder


def test_the_decision_rule_refuses_a_failed_gate_and_a_low_success_rate(decision_db) -> None:
    db, _ = decision_db
    data, results = analysed(db)
    gates = {r["treatment_variant"]: r["passed"] for r in data.gates.iter_rows(named=True)}
    assert gates == {"draft-k3": True, "draft-k2": True, "ngram-k3": False}  # real verdicts, real gate
    for load in ("c1", "c4"):
        winner = row(results.decisions, variant="draft-k3", load_label=load)
        assert winner["wins"] is True and winner["ci_low"] > 1 and winner["reason"].startswith("wins")
        lossy = row(results.decisions, variant="ngram-k3", load_label=load)
        assert lossy["interval_excludes_one"] is True and lossy["ci_low"] > 1  # it is faster...
        assert lossy["wins"] is False and lossy["gate_passed"] is False  # ...but not correct
        assert "correctness gate failed" in lossy["reason"]
        flaky = row(results.decisions, variant="draft-k2", load_label=load)
        assert flaky["ci_low"] > 1 and flaky["gate_passed"] is True
        assert flaky["success_rate"] == pytest.approx(15 / 16) and flaky["success_ok"] is False
        assert flaky["wins"] is False and "success rate 93.8% < 99%" in flaky["reason"]


def test_ngram_or_draft_choice_with_kv_cache_cost(decision_db) -> None:
    db, _ = decision_db
    _, results = analysed(db)
    for load in ("c1", "c4"):
        choice = row(results.choice, load_label=load)
        assert choice["draft_variant"] == "draft-k3" and choice["ngram_variant"] == "ngram-k3"
        assert choice["choice"] == "draft model" and "only the draft model wins" in choice["reason"]
        assert (choice["kv_tokens_plain"], choice["kv_tokens_draft"]) == (PLAIN_KV, DRAFT_KV)
        assert choice["draft_kv_loss"] == pytest.approx(1 - DRAFT_KV / PLAIN_KV)
        assert choice["draft_over_ngram"] == pytest.approx(1.6 / 1.3, rel=0.05)
        assert choice["draft_over_ngram_low"] > 1


def test_both_win_without_a_significant_edge_means_ngram(crossover_db: Path) -> None:
    """In the crossover campaign both variants pass the gate; where both win and the draft model is not
    significantly faster than n-gram, n-gram is the operational choice; where it is, the draft model."""
    _, results = analysed(crossover_db, settings=AnalysisSettings(gain_metric="tpot_p50"))
    c1 = row(results.choice, load_label="c1")  # draft 1.6 vs n-gram 1.25: significant
    assert c1["choice"] == "draft model" and c1["draft_over_ngram_low"] > 1
    c16 = row(results.choice, load_label="c16")  # draft 0.7: only n-gram wins
    assert c16["choice"] == "n-gram" and "only n-gram wins" in c16["reason"]


def test_analysis_tables_match_their_migration(decision_db, tmp_path: Path) -> None:
    db, _ = decision_db
    result = analyze_campaign(db_path=db, settings=FAST, render=False)
    with reader(db) as con:
        for table, key in ANALYSIS_TABLES.items():
            described = con.execute(f"DESCRIBE {table}").fetchall()
            columns = [c[0] for c in described if c[0] not in ("campaign_id", "analysis_id")]
            assert columns == getattr(result.results, key).columns, table
            stored = con.execute(
                f"SELECT count(*) FROM {table} WHERE campaign_id = ?", [result.campaign_id]
            ).fetchall()[0][0]
            assert stored == getattr(result.results, key).height == result.rows[table], table


def test_reanalysis_replaces_a_campaigns_rows_in_one_transaction(decision_db) -> None:
    db, builder = decision_db
    first = analyze_campaign(builder.campaign_id, db, settings=FAST, render=False)
    second = analyze_campaign(builder.campaign_id, db, settings=FAST, render=False)
    assert first.analysis_id != second.analysis_id
    with reader(db) as con:
        runs = con.execute(
            f"SELECT analysis_id FROM {RUNS_TABLE} WHERE campaign_id = ?", [builder.campaign_id]
        ).fetchall()
        assert runs == [(second.analysis_id,)]
        for table in ANALYSIS_TABLES:
            ids = con.execute(
                f"SELECT DISTINCT analysis_id FROM {table} WHERE campaign_id = ?", [builder.campaign_id]
            ).fetchall()
            assert ids in ([(second.analysis_id,)], []), table
        before = {
            t: con.execute(f"SELECT count(*) FROM {t}").fetchall() for t in (RUNS_TABLE, *ANALYSIS_TABLES)
        }
    assert before[RUNS_TABLE] == [(1,)]
    # a write that fails half-way (a table's frame does not fit its table) leaves the previous rows whole
    broken = second.results.tables() | {"crossover": pl.DataFrame({"no_such_column": [1]})}
    with writer(db) as con, pytest.raises(duckdb.Error):
        store_results(con, builder.campaign_id, "broken", {"created_utc": None}, broken)
    with reader(db) as con:
        after = {
            t: con.execute(f"SELECT count(*) FROM {t}").fetchall() for t in (RUNS_TABLE, *ANALYSIS_TABLES)
        }
        assert after == before
        assert con.execute(f"SELECT analysis_id FROM {RUNS_TABLE}").fetchall() == [(second.analysis_id,)]


# ------------------------------------------------------------------------------------ Q5: planted capacity

# p99 TTFT (planted ttft x up to 1.2) against the SLO of 2 s; TPOT against 0.1 s
CAPACITY_TTFT = {
    "plain": {0.5: 0.3, 1: 0.6, 2: 2.5, 4: 5.0},  # sustainable 1 req/s
    "draft-k3": {0.5: 0.2, 1: 0.3, 2: 0.8, 4: 3.0},  # sustainable 2 req/s
    "ngram-k3": {0.5: 0.3, 1: 0.5, 2: 0.7, 4: 0.9},  # TTFT fine, but TPOT breaks from 1 req/s on
}


@pytest.fixture(scope="module")
def capacity_db(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, PlantedBuilder]:
    root = tmp_path_factory.mktemp("capacity")

    def plant(variant: str, repeat: int, workload: str, load: str):
        if load.startswith("c"):
            tpot = PLAIN_TPOT if variant == "plain" else PLAIN_TPOT / 1.4
            return profile(tpot, None if variant == "plain" else 0.5, tokens_per_chunk=2.0)
        rate = load_of(load)
        tpot = 0.15 if variant == "ngram-k3" and rate >= 1 else PLAIN_TPOT
        accept = None if variant == "plain" else 0.5
        return profile(tpot, accept, tokens_per_chunk=2.0, ttft_s=CAPACITY_TTFT[variant][rate])

    spec = make_spec(
        "capacity",
        repeats=2,
        concurrencies=(1,),
        rates=(0.5, 1, 2, 4),
        requests=12,
        variants=variants("plain", "ngram-k3", "draft-k3"),
    )
    builder = PlantedBuilder(root / "raw", spec=spec, plant=plant, kv_tokens={"draft-k3": DRAFT_KV})
    return builder.build(root / "w.duckdb"), builder


def test_sustainable_rates_under_the_slo_are_found(capacity_db) -> None:
    db, _ = capacity_db
    data, results = analysed(db)
    open_loop = results.capacity.filter(pl.col("load_mode") == "open")
    assert row(open_loop, variant="plain")["sustainable_load"] == 1.0
    draft = row(open_loop, variant="draft-k3")
    assert (draft["sustainable_load"], draft["first_violation_load"]) == (2.0, 4.0)
    assert draft["gain_vs_plain"] == 2.0 and draft["plain_sustainable_load"] == 1.0
    assert draft["verdict"].startswith("raises the sustainable rate from 1 req/s to 2 req/s")
    assert "KV-cache capacity 31% below plain's" in draft["verdict"]
    assert draft["ttft_p99_s_at_sustainable"] <= 2.0 and draft["slo_ttft_p99_s"] == 2.0
    ngram = row(open_loop, variant="ngram-k3")
    assert ngram["sustainable_load"] == 0.5 and ngram["verdict"].startswith("lowers")
    assert ngram["tpot_p99_s_at_plain_sustainable"] > 0.1  # why: its TPOT breaks the SLO at plain's rate
    assert "open-loop rate sweep" in q5_statement(data, results.capacity)


def test_without_a_rate_sweep_q5_says_what_it_needs(speedup_db) -> None:
    db, _ = speedup_db
    data, results = analysed(db)
    statement = q5_statement(data, results.capacity)
    assert "Q5 needs an open-loop rate sweep" in statement and "load.rates" in statement
    closed = results.capacity.filter(pl.col("load_mode") == "closed")
    assert closed.height == 2 and set(closed["sustainable_load"].to_list()) == {4.0}


# ------------------------------------------------------------------------------------------ CLI, report


def test_cli_analyze_and_report_print_the_page_last(capacity_db, tmp_path: Path) -> None:
    db, builder = capacity_db
    reports = tmp_path / "reports"
    runner = CliRunner()
    result = runner.invoke(
        app,
        [
            "analyze",
            builder.campaign_id,
            "--db",
            str(db),
            "--reports-dir",
            str(reports),
        ],
    )
    assert result.exit_code == 0, result.output
    page = Path(result.stdout.strip().splitlines()[-1])
    assert page == reports / builder.campaign_id / "index.html" and page.is_file()
    for name in (
        "speedup_closed",
        "speedup_open",
        "capacity_open",
        "latency",
        "itl",
        "pareto",
        "acceptance_positions",
        "step_time",
    ):
        assert (page.parent / f"{name}.html").stat().st_size > 100_000  # Vega inline
        assert (page.parent / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    latest = runner.invoke(app, ["report", "--latest", "--db", str(db), "--reports-dir", str(reports)])
    assert latest.exit_code == 0, latest.output
    assert latest.stdout.strip().splitlines()[-1] == str(page)
    html = page.read_text()
    assert "n=2, t on log-ratios" in html and "Decision rule." in html and "ITL kind: chunk gap" in html
    missing = runner.invoke(app, ["report", "nope", "--db", str(db)])
    assert missing.exit_code == 2 and "no campaign 'nope'" in missing.stderr


def test_report_of_a_single_repeat_says_there_is_no_interval(tmp_path: Path) -> None:
    spec = make_spec("lonely", repeats=1, concurrencies=(1, 4), variants=variants("plain", "draft-k3"))
    db = PlantedBuilder(tmp_path / "raw", spec=spec).build(tmp_path / "w.duckdb", gates=False)
    result = analyze_campaign(db_path=db, settings=FAST, reports_dir=tmp_path / "reports")
    html = result.report.read_text()
    assert "n=1, no interval" in html
    assert "no correctness-gate verdict" in html and "Q5 needs an open-loop rate sweep" in html
