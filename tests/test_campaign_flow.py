"""The campaign flow under Prefect's test harness, on the real engine: the demo campaign end to end
(shared by the session), resume, and errors that name the spec field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specgauge.errors import SpecError
from tasks.artifacts import cell_attempts
from warehouse.db import reader

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.engine
def test_every_demo_cell_is_ok_and_in_the_warehouse(demo_campaign: dict) -> None:
    assert demo_campaign["failed_cells"] == {}
    campaign = json.loads((Path(demo_campaign["directory"]) / "campaign.json").read_text())
    planned = sum(len(d["cells"]) for d in campaign["deployments"])
    assert planned == 3 * 3 * 2 * campaign["spec"]["repeats"]  # variants x strata x concurrencies x repeats
    with reader() as con:
        cid = demo_campaign["campaign_id"]
        cells = con.execute("SELECT count(*) FROM v_cells WHERE campaign_id = ?", [cid]).fetchone()[0]
        speedups = con.execute("SELECT count(*) FROM v_speedup WHERE campaign_id = ?", [cid]).fetchone()[0]
        requests = con.execute(
            "SELECT count(*) FROM requests r JOIN cells c USING (cell_key) WHERE c.campaign_id = ?", [cid]
        ).fetchone()[0]
    assert cells == planned
    assert speedups == planned * 2 // 3  # every speculative cell found its plain baseline
    spec = campaign["spec"]["load"]
    assert requests == planned * (spec["requests"] + spec["warmup"])  # warm-up rows kept, marked


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
def test_the_gate_passes_both_speculative_variants(demo_campaign: dict) -> None:
    verdicts = {v["treatment"]: v for v in demo_campaign["gates"]}
    assert set(verdicts) == {"ngram-k3", "draft-k3"}
    assert all(v["passed"] for v in verdicts.values()), verdicts
    assert all("consistent with lossless speculation" in v["claim"] for v in verdicts.values())
    with reader() as con:
        rows = con.execute(
            "SELECT treatment_variant, passed FROM v_gate WHERE campaign_id = ?",
            [demo_campaign["campaign_id"]],
        ).fetchall()
    assert sorted(rows) == [("draft-k3", True), ("ngram-k3", True)]


@pytest.mark.engine
def test_the_demo_profiles_one_speculative_window(demo_campaign: dict) -> None:
    assert demo_campaign["profile"]["status"] == "ok", demo_campaign["profile"]
    with reader() as con:
        wasted = con.execute(
            "SELECT wasted_share FROM v_profile_waste WHERE campaign_id = ?", [demo_campaign["campaign_id"]]
        ).fetchall()
    assert len(wasted) == 1 and 0 < wasted[0][0] < 1


@pytest.mark.engine
def test_rerunning_the_campaign_resumes_without_launching(demo_campaign: dict) -> None:
    from flows.campaign import campaign

    cells_dir = Path(demo_campaign["directory"]) / "cells"
    before = sorted(p.name for p in cells_dir.iterdir())
    again = campaign(spec="experiments/demo.yaml", ingest=False, gate=False, analyze=False)
    assert again["campaign_id"] == demo_campaign["campaign_id"]
    assert all(slot["launches"] == [] for slot in again["deployments"])
    assert sorted(p.name for p in cells_dir.iterdir()) == before
    assert all(len(cell_attempts(cells_dir, name.rsplit(".a", 1)[0])) == 1 for name in before)


def test_a_bad_spec_fails_the_flow_naming_the_field(prefect_harness: None, tmp_path: Path) -> None:
    from flows.campaign import campaign

    bad = tmp_path / "bad.yaml"
    text = (
        (REPO / "experiments" / "demo.yaml")
        .read_text()
        .replace("k: 3\n    draft_model", "k: 0\n    draft_model")
    )
    bad.write_text(text)
    with pytest.raises(SpecError) as info:
        campaign(spec=str(bad))
    line = (
        text.splitlines().index("  - name: draft-k3") + 1
    )  # the variant's own line: the file, line and field
    assert (
        f"{bad}:{line}: variants[2]: method 'draft_model' needs k (num_speculative_tokens) > 0, got 0"
        in str(info.value)
    )
