"""The analyze flow on a real Prefect API: it returns the report and links it as an artifact; and one
analysis of a real campaign (the session's, tests/conftest.py), run by the campaign flow on the embedded
engine."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import polars as pl
import pytest
from analysis_fixtures import PlantedBuilder, profile
from warehouse_fixtures import make_spec

from warehouse.db import reader


@pytest.fixture
def prefect_api(prefect_harness: None) -> None:
    """The session's Prefect test server (tests/conftest.py)."""


def _artifact(key: str):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    with get_client(sync_client=True) as client:
        found = client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])))
    assert found, f"no artifact {key}"
    return found[0]


@pytest.fixture
def report_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The report server on tmp_path/reports, and SPECGAUGE_REPORTS_URL pointing at it."""
    from analysis.serve import serving
    from specgauge.settings import get_settings

    with serving(tmp_path / "reports") as base:
        monkeypatch.setenv("SPECGAUGE_REPORTS_URL", base)
        get_settings.cache_clear()
        try:
            yield base
        finally:
            monkeypatch.delenv("SPECGAUGE_REPORTS_URL")
            get_settings.cache_clear()


@pytest.mark.server
def test_analyze_flow_returns_the_report_and_links_it(
    prefect_api: None, report_server: str, tmp_path: Path
) -> None:
    from flows.analyze import AnalysisRequest, analyze

    def plant(variant, repeat, workload, load):
        fast = {"plain": 1.0, "ngram-k3": 1.3, "draft-k3": 1.5}[variant]
        return profile(0.02 / fast * (1.01, 0.99, 1.0)[repeat], None if variant == "plain" else 0.4)

    # three repeats and a 1.3x gain: the fixture's closed-loop schedule moves per-repeat ratios by ~4%, and
    # the t interval (two degrees of freedom) must still clear the rule's 1 + 10%
    builder = PlantedBuilder(tmp_path / "raw", spec=make_spec("flow", repeats=3), plant=plant)
    db = builder.build(tmp_path / "w.duckdb")

    # no campaign_id: the latest campaign
    result = analyze(AnalysisRequest(db=str(db), reports_dir=str(tmp_path / "reports")))

    assert result["campaign_id"] == builder.campaign_id
    report = Path(result["report"])
    assert report == tmp_path / "reports" / builder.campaign_id / "index.html" and report.is_file()
    assert "analysis_decisions" in result["tables"] and "analysis_runs" in result["tables"]
    assert sorted(result["winners"]) == [
        f"{v} chat {c}" for v in ("draft-k3", "ngram-k3") for c in ("c1", "c4")
    ]
    # one click from the run's artifacts, in a browser anywhere: the link goes through the report server
    link = _artifact(builder.campaign_id.lower() + "-analysis")
    url = f"{report_server}/{builder.campaign_id}/index.html"
    assert url in str(link.data)  # Prefect stores a link artifact as a markdown link
    page = httpx.get(url)
    assert page.status_code == 200 and page.text == report.read_text()
    summary = _artifact(builder.campaign_id.lower() + "-analysis-summary")
    assert "draft-k3 chat c1" in str(summary.data)
    images = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", str(summary.data))
    assert images and all(i.startswith(f"{report_server}/{builder.campaign_id}/") for i in images), images
    for image in images:
        response = httpx.get(image)
        assert response.status_code == 200 and response.headers["content-type"] == "image/png"


@pytest.mark.engine
def test_analysis_of_the_real_demo_campaign(demo_campaign: dict) -> None:
    """The session's campaign (the demo's variants, each launched once), run by the campaign flow on the
    embedded engine, then its analysis: every table filled, each estimate labelled as one launch's (no
    interval from one repeat: intervals are tested on planted campaigns above), and the report written."""
    spec = json.loads((Path(demo_campaign["directory"]) / "campaign.json").read_text())["spec"]
    speculative = [v for v in spec["variants"] if v["method"] != "none"]
    (workload,) = spec["workloads"]
    analysis = demo_campaign["analysis"]
    report = Path(analysis["report"])
    assert report.is_file() and report.name == "index.html"
    campaign_id = demo_campaign["campaign_id"]
    with reader() as con:
        decisions = con.sql(
            "SELECT * FROM analysis_decisions WHERE campaign_id = $c", params={"c": campaign_id}
        ).pl()
        speedup = con.sql(
            "SELECT * FROM analysis_speedup WHERE campaign_id = $c", params={"c": campaign_id}
        ).pl()
        depth = con.sql("SELECT * FROM analysis_depth WHERE campaign_id = $c", params={"c": campaign_id}).pl()
        runs = con.sql("SELECT * FROM analysis_runs WHERE campaign_id = $c", params={"c": campaign_id}).pl()
    # speculative variants x workloads x concurrencies, each judged with its reasons
    assert decisions.height == len(speculative) * len(workload["strata"]) * len(spec["load"]["concurrencies"])
    assert set(decisions["workload"]) == set(workload["strata"])
    assert decisions["reason"].str.len_chars().min() > 0
    throughput = speedup.filter(pl.col("metric") == "throughput")
    assert throughput["estimate"].is_between(0.05, 20).all()
    if spec["repeats"] == 1:  # one launch per variant: said so, never an interval made up
        assert (throughput["interval"] == "n=1, no interval").all() and throughput["ci_low"].is_null().all()
    else:
        bounded = throughput.filter(pl.col("ci_low").is_not_null())
        assert bounded.height > 0
        assert (
            (bounded["ci_low"] <= bounded["estimate"]) & (bounded["estimate"] <= bounded["ci_high"])
        ).all()
    # measured step times and tokens per step
    assert (depth["step_time_s"] > 0).all() and (depth["tokens_per_step"] >= 1).all()
    assert runs.height >= 1 and runs["repeats"][-1] == spec["repeats"]
    html = report.read_text()
    assert "Decision rule." in html
    assert "0.32" in html and "vllm" in html.lower()  # provenance: engine version and command
    for chart in (
        "speedup_closed",
        "latency",
        "itl",
        "acceptance_positions",
        "pareto",
        "step_time",
        "capacity_closed",
    ):
        assert (report.parent / f"{chart}.png").is_file() and (report.parent / f"{chart}.html").is_file()


@pytest.mark.server
def test_an_invalid_campaign_raises_the_alert_event(
    prefect_api: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Plain's repeats disagree by 30% (over the 10% limit): the analysis marks the campaign invalid and the
    flow emits the event the alerts' automation sends to a person (tests/test_prefect_server.py checks
    the automation delivers such events to a webhook)."""
    import flows.alerts
    from flows.analyze import AnalysisRequest, analyze

    emitted: list[dict] = []
    monkeypatch.setattr(flows.alerts, "emit_event", lambda **event: emitted.append(event))

    def plant(variant, repeat, workload, load):
        drift = (1.0, 1.3, 0.8)[repeat]  # every variant of a repeat moves together: the machine's doing
        return profile(0.02 * drift, None if variant == "plain" else 0.4)

    builder = PlantedBuilder(tmp_path / "raw", spec=make_spec("shaky", repeats=3), plant=plant)
    db = builder.build(tmp_path / "w.duckdb")
    result = analyze(AnalysisRequest(db=str(db), reports_dir=str(tmp_path / "reports")))

    assert result["valid"] is False and "spread" in result["invalid_reasons"]
    assert [e["event"] for e in emitted] == ["specgauge.campaign.invalid"]
    payload = emitted[0]["payload"]
    assert payload["campaign_id"] == builder.campaign_id
    assert payload["summary"] == result["invalid_reasons"]
    assert payload["report"] == Path(result["report"]).as_uri()  # no report server configured here
