"""The simulator's second half (issue 20, items 3 and 5): the cost model on hand-built cells with planted
coefficients, the tree_sim tables (idempotent, transactional), the report section, and the simulate flow on
a planted campaign whose captures are a tiny hand-made folder (n-gram and suffix only: no model worker)."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from analysis.simulate.cost import (
    PROJECTION_SCHEMA,
    drafter_passes,
    fit_cost_model,
    measured_points,
    pay_table,
    project,
    tree_levels,
)
from analysis.simulate.shapes import parse_shape
from analysis.simulate.store import load_tree_sim, store_simulation
from warehouse.db import reader, writer

# Planted step-time model (seconds): base and per sequence per stratum, per batch token, per drafting pass.
BASE = {"chat": 0.010, "summarization": 0.030}
PER_SEQUENCE = {"chat": 0.001, "summarization": 0.004}
PER_TOKEN = 0.002
PER_PASS = {"draft": 0.004, "ngram": 0.0005}


def planted_step(stratum: str, conc: int, width: float, proposer: str | None, passes: int) -> float:
    return (
        BASE[stratum]
        + PER_SEQUENCE[stratum] * conc
        + PER_TOKEN * conc * width
        + (PER_PASS[proposer] * passes if proposer else 0.0)
    )


def cells_and_replays() -> tuple[pl.DataFrame, pl.DataFrame]:
    """v_cells-like rows whose TPOT follows the planted model exactly, and the replay rows of the served
    chains (tokens and verified width per step per stratum)."""
    served = {  # (label, stratum) -> (tokens per step, verified per step)
        ("chain:k=3@draft", "chat"): (2.0, 4.0),
        ("chain:k=3@draft", "summarization"): (1.5, 4.0),
        ("chain:k=3@ngram", "chat"): (1.6, 2.5),
        ("chain:k=3@ngram", "summarization"): (1.2, 1.5),
    }
    rows = []
    for stratum in BASE:
        for conc in (1, 4, 16):
            for repeat in (0, 1):
                plain_step = planted_step(stratum, conc, 1.0, None, 0)
                rows.append(
                    cell("plain", "none", None, stratum, conc, repeat, plain_step, 1000.0 / plain_step)
                )
                for variant, method, proposer, passes in (
                    ("draft-k3", "draft_model", "draft", 3),
                    ("ngram-k3", "ngram", "ngram", 1),
                ):
                    tokens, width = served[(f"chain:k=3@{proposer}", stratum)]
                    step = planted_step(stratum, conc, width, proposer, passes)
                    rows.append(
                        cell(variant, method, 3, stratum, conc, repeat, step / tokens, 1000.0 * tokens / step)
                    )
    replays = pl.DataFrame(
        [
            {
                "config": label,
                "stratum": stratum,
                "tokens_per_step": t,
                "verified_tokens_per_step": w,
                "mean_acceptance_length": t,
                "acceptance_rate_per_position": [0.5, 0.3, 0.2],
            }
            for (label, stratum), (t, w) in served.items()
        ]
    )
    return pl.DataFrame(rows), replays


def cell(variant, method, k, stratum, conc, repeat, tpot, throughput) -> dict:
    return {
        "variant": variant,
        "method": method,
        "k": k,
        "workload": stratum,
        "load_mode": "closed",
        "load_label": f"c{conc}",
        "concurrency": conc,
        "repeat": repeat,
        "tpot_mean_s": tpot,
        "output_throughput_tok_s": throughput,
        "mean_acceptance_length": None,
    }


def test_the_cost_fit_recovers_planted_coefficients() -> None:
    cells, replays = cells_and_replays()
    model = fit_cost_model(measured_points(cells, replays), fitted_on="planted")
    assert model.base_s == pytest.approx(BASE, rel=1e-6)
    assert model.per_sequence_s == pytest.approx(PER_SEQUENCE, rel=1e-6)
    assert model.per_batch_token_s == pytest.approx(PER_TOKEN, rel=1e-6)
    assert model.per_pass_s == pytest.approx(PER_PASS, rel=1e-6)
    assert model.rms_relative_residual < 1e-6 and model.points == cells.height
    assert model.fitted_on == "planted"


def test_a_wide_tree_pays_at_low_load_and_costs_at_high_load() -> None:
    cells, replays = cells_and_replays()
    model = fit_cost_model(measured_points(cells, replays), fitted_on="planted")
    shapes = [parse_shape(t)[0] for t in ("chain:k=3@draft", "tree:b=2:budget=8:depth=4@draft")]
    # the tree accepts more (2.6 tokens per step against the chain's 2.0) but verifies 9 tokens, not 4
    tree = {
        "config": shapes[1].label,
        "stratum": "chat",
        "tokens_per_step": 2.6,
        "verified_tokens_per_step": 9.0,
    }
    sims = pl.concat(
        [
            replays,
            pl.DataFrame([{**tree, "mean_acceptance_length": 2.6, "acceptance_rate_per_position": [0.7]}]),
        ]
    )
    frame = project(model, sims, shapes, cells).filter(pl.col("stratum") == "chat")
    speedup = {(r["shape"], r["concurrency"]): r["projected_speedup"] for r in frame.iter_rows(named=True)}
    # by hand, chat at C=1: plain 0.010 + 0.001 + 0.002 = 0.013; chain 0.010 + 0.001 + 0.002 x 4 + 0.004 x 3
    # = 0.031, speedup 2.0 x 0.013 / 0.031; the tree (levels of 2, 4, 2: 3 passes) 0.010 + 0.001 + 0.002 x 9
    # + 0.004 x 3 = 0.041, speedup 2.6 x 0.013 / 0.041 (its extra acceptance just pays for its width). At
    # C=16: plain 0.010 + 0.016 + 0.032 = 0.058; chain 0.010 + 0.016 + 0.128 + 0.012 = 0.166; tree 0.010 +
    # 0.016 + 0.288 + 0.012 = 0.326: the tree falls from 0.82 to 0.46, far below the chain's 0.70.
    assert speedup[(shapes[0].label, 1)] == pytest.approx(2.0 * 0.013 / 0.031)
    assert speedup[(shapes[1].label, 1)] == pytest.approx(2.6 * 0.013 / 0.041)
    assert speedup[(shapes[0].label, 16)] == pytest.approx(2.0 * 0.058 / 0.166)
    assert speedup[(shapes[1].label, 16)] == pytest.approx(2.6 * 0.058 / 0.326)
    served = frame.filter(pl.col("shape") == shapes[0].label, pl.col("concurrency") == 4).row(0, named=True)
    assert served["served_variant"] == "draft-k3"
    # the planted cells follow the model exactly, so projected and measured agree for the served chain
    assert served["measured_speedup"] == pytest.approx(served["projected_speedup"])
    assert set(pay_table(frame)["verdict"]) == {"nothing pays: every shape is projected slower than plain"}


def test_drafting_passes_count_levels_for_model_drafters_and_one_lookup_for_ngram() -> None:
    assert tree_levels(2, 8, 4) == 3 and tree_levels(2, 8, 2) == 2 and tree_levels(1, 5, 5) == 5
    passes = [drafter_passes(s) for s in parse_shape("graft:b=2:budget=8:depth=4:k=3@eagle3+ngram")]
    assert passes == [{"eagle3": 3, "ngram": 1}]
    assert drafter_passes(parse_shape("union:k=3@draft+eagle3")[0]) == {"draft": 3, "eagle3": 3}
    assert drafter_passes(parse_shape("chain:k=5@ngram")[0]) == {"ngram": 1}


# ------------------------------------------------------------------------------------------- the tables


def projection_rows(shape: str, speedup: float) -> pl.DataFrame:
    row = {name: None for name in PROJECTION_SCHEMA}
    row.update(shape=shape, proposers=["ngram"], stratum="chat", load_label="c1", concurrency=1)
    row.update(projected_speedup=speedup, mean_acceptance_length=1.5, acceptance_rate_per_position=[0.5])
    return pl.DataFrame([row], schema=PROJECTION_SCHEMA)


def run_row(sim: str) -> dict:
    from datetime import datetime

    return {"created_utc": datetime(2026, 12, 2, 8, int(sim[-1])), "fitted_on": "c", "notes": []}


def test_storing_a_simulation_replaces_its_settings_rows_in_one_transaction(tmp_path: Path) -> None:
    from analysis.simulate.validate import VALIDATION_SCHEMA

    db = tmp_path / "w.duckdb"
    empty = pl.DataFrame(schema=VALIDATION_SCHEMA)
    with writer(db) as con:
        store_simulation(
            con, "c", "key-a", "sim-1", run_row("sim-1"), projection_rows("chain:k=3@ngram", 1.1), empty
        )
        store_simulation(
            con, "c", "key-a", "sim-2", run_row("sim-2"), projection_rows("chain:k=3@ngram", 1.2), empty
        )
        store_simulation(
            con, "c", "key-b", "sim-3", run_row("sim-3"), projection_rows("chain:k=5@ngram", 0.9), empty
        )
        counts = con.execute("SELECT settings_key, count(*) FROM tree_sim GROUP BY 1 ORDER BY 1").fetchall()
        assert counts == [("key-a", 1), ("key-b", 1)]  # the re-run replaced, the other settings kept theirs
        assert con.execute("SELECT count(*) FROM tree_sim_runs").fetchone() == (2,)
        bad = projection_rows("chain:k=3@ngram", 1.3).with_columns(pl.lit("x").alias("no_such_column"))
        with pytest.raises(Exception, match="no_such_column"):
            store_simulation(con, "c", "key-a", "sim-4", run_row("sim-4"), bad, empty)
        # the failed write changed nothing: sim-2's rows are still there, whole
        assert con.execute(
            "SELECT simulation_id, projected_speedup FROM tree_sim WHERE settings_key = 'key-a'"
        ).fetchall() == [("sim-2", 1.2)]
        assert con.execute("SELECT simulation_id FROM tree_sim_runs ORDER BY 1").fetchall() == [
            ("sim-2",),
            ("sim-3",),
        ]
    with reader(db) as con:
        latest = load_tree_sim(con, "c")
        assert latest is not None and latest.run["simulation_id"] == "sim-3"  # the newest, whatever its key
        assert latest.projections["shape"].to_list() == ["chain:k=5@ngram"]
        assert load_tree_sim(con, "other") is None


# --------------------------------------------------------------------------- the flow, on a planted campaign

PROMPTS = ["cap-chat-00", "cap-chat-01", "cap-code-00"]
# Greedy "outputs": a repeating pattern, so prompt lookup finds matches once one period has passed.
OUTPUTS = {
    "cap-chat-00": [5, 6, 7, 5, 6, 7, 5, 6, 7, 5],
    "cap-chat-01": [8, 9, 8, 9, 8, 9, 8, 9],
    "cap-code-00": [11, 12, 13, 14, 11, 12, 13, 14, 11, 12],
}


def fake_tokenize(_tokenizer_dir, conversations):
    """Stands in for the target's chat template (a torch-free test): a fixed 3-token prompt."""
    return [[1, 2, 3] for _ in conversations]


def write_captures(raw_campaign: Path, served: dict) -> None:
    """Replace the builder's captures by the tiny hand-made ones: real corpus prompt ids, the outputs above;
    the n-gram capture carries `served` as its vLLM counters."""
    for capture in sorted((raw_campaign / "captures").iterdir()):
        frame = pl.DataFrame(
            {
                "prompt_id": PROMPTS,
                "workload": ["chat", "chat", "code"],
                "ok": [True] * 3,
                "error": [None] * 3,
                "text": ["x"] * 3,
                "token_ids": [OUTPUTS[p] for p in PROMPTS],
                "finish_reason": ["length"] * 3,
                "prompt_tokens": [3] * 3,
                "completion_tokens": [len(OUTPUTS[p]) for p in PROMPTS],
            },
            schema_overrides={"error": pl.String, "token_ids": pl.List(pl.Int64)},
        )
        frame.write_parquet(capture / "outputs.parquet")
        meta = json.loads((capture / "meta.json").read_text())
        meta["prompt_ids"] = PROMPTS
        if meta["variant"]["method"] == "ngram":
            meta["speculation"] = served
        (capture / "meta.json").write_text(json.dumps(meta))


@pytest.mark.server
def test_the_simulate_flow_stores_tree_sim_and_the_report_shows_it(
    prefect_harness: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from analysis_fixtures import PlantedBuilder, profile
    from warehouse_fixtures import make_spec

    from analysis.run import analyze_campaign
    from analysis.simulate import models
    from flows.simulate import SimulationRequest, simulate

    variants = [
        {"name": "plain", "method": "none"},
        {"name": "ngram-k3", "method": "ngram", "k": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 4},
    ]
    spec = make_spec("treesim", variants=variants, strata=("chat", "code"))
    builder = PlantedBuilder(
        tmp_path / "raw",
        spec=spec,
        plant=lambda v, r, w, load: profile(0.02 if v == "plain" else 0.017, None if v == "plain" else 0.4),
    )
    db = builder.build(tmp_path / "w.duckdb")
    reports = tmp_path / "reports"
    # Before any simulation the report has no offline section.
    before = analyze_campaign(builder.campaign_id, db, reports_dir=reports)
    assert "Trees and drafter combinations (offline)" not in before.report.read_text()

    # By hand (prompt 1 2 3, vLLM's prompt lookup with min 1, max 4, k=3; drafting from t=1): cap-chat-01
    # (8 9 8 9 8 9 8 9) finds no earlier 8 or 9 at t=1, 2; at t=3 the suffix "8" first occurs at output[0],
    # followed by 9 8 (the context ends there): 2 drafted, 2 accepted, t=6; there "8 9 8 9" occurs from
    # output[0], followed by 8 9: 2 drafted, 2 accepted, done. cap-chat-00 (period 3): t=4 drafts 6 7 5
    # (3 accepted), t=8 drafts 7 5 6 against 7 5 (2 accepted, the output ends). cap-code-00 (period 4): t=5
    # drafts 12 13 14 (3 accepted), t=9 drafts 12 13 14 against 12 (1 accepted). Total: 6 drafts, 16 draft
    # tokens, 13 accepted.
    served = {"drafts": 6, "draft_tokens": 16, "accepted_tokens": 13, "mean_acceptance_length": 1 + 13 / 6}
    write_captures(builder.campaign_dir, served)
    monkeypatch.setattr(models, "tokenize", fake_tokenize)
    summary = simulate(
        SimulationRequest(
            campaign_id=str(builder.campaign_dir),
            shapes="chain:k=5@ngram,tree:b=2:budget=6@suffix,graft:b=2:budget=6:k=3@suffix+ngram",
            db=str(db),
            reports_dir=str(reports),
            tail=0,
        )
    )
    assert summary["campaign_id"] == builder.campaign_id and summary["validated"] == 1
    with reader(db) as con:
        stored = load_tree_sim(con, builder.campaign_id)
    assert stored is not None
    validation = stored.validation.row(0, named=True)
    assert validation["capture_id"] == "ngram-k3.r0" and validation["served_drafts"] == 6
    assert (validation["simulated_drafts"], validation["simulated_draft_tokens"]) == (6, 16)
    assert validation["simulated_accepted_tokens"] == 13
    assert validation["relative_error"] == pytest.approx(0.0)
    shapes = set(stored.projections["shape"])
    assert shapes == {
        "chain:k=3@ngram",  # the served chain, always simulated
        "chain:k=5@ngram",
        "tree:b=2:budget=6@suffix",
        "graft:b=2:budget=6:k=3@suffix+ngram",
    }
    # every shape x stratum x closed-loop load, each with a projection (suffix borrows n-gram's pass cost)
    assert stored.projections.height == 4 * 2 * 2
    assert stored.projections["projected_speedup"].null_count() == 0
    assert stored.run["fitted_on"] == builder.campaign_id and stored.run["fit_points"] > 0
    page = Path(summary["report"]).read_text()
    assert "Trees and drafter combinations (offline)" in page and "ngram-k3.r0" in page
    assert (reports / builder.campaign_id / "tree_sim.png").is_file()

    # Re-running the same settings replaces the simulation: no duplicate rows.
    simulate(
        SimulationRequest(
            campaign_id=str(builder.campaign_dir),
            shapes="chain:k=5@ngram,tree:b=2:budget=6@suffix,graft:b=2:budget=6:k=3@suffix+ngram",
            db=str(db),
            tail=0,
            report=False,
        )
    )
    with reader(db) as con:
        assert con.execute("SELECT count(*) FROM tree_sim").fetchone() == (16,)
        assert con.execute("SELECT count(*) FROM tree_sim_validation").fetchone() == (1,)
