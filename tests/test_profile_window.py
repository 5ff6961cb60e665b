"""Profiled windows end to end: on the embedded engine (the session's campaign profiles one: launch with the
torch profiler, window, artifact, warehouse row, chart, teardown), the failure path against a server without
a profiler, and the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import psutil
import pytest
from campaign_support import campaign_rows
from emulator_cells import emulator_deployment
from typer.testing import CliRunner

from experiments.spec import Variant, load_spec
from specgauge.errors import InputError
from specgauge.provenance import sha256_file
from tasks.profile.torch_trace import analyze_trace, trim_trace
from tasks.profile.window import WindowPlan, run_window
from workloads.schema import load_corpus

REPO = Path(__file__).resolve().parent.parent
DATA = Path(__file__).parent / "data" / "profile"


@pytest.mark.engine
def test_profile_variant_on_the_embedded_engine(
    demo_campaign: dict, campaign_spec: Path, tmp_path: Path
) -> None:
    """The window the session's campaign profiled (its `profile:` block; the campaign flow's profile step
    calls `profile_variant`): launched with the torch profiler, window, artifact, warehouse row, chart,
    teardown."""
    from tasks.profile.breakdown import counters_from_metrics
    from tasks.profile.chart import save_chart, waste_chart

    planned = load_spec(campaign_spec).profile
    assert planned is not None and planned.variant == "draft-k3"
    result = demo_campaign["profile"]
    assert result["status"] == "ok", result["error"]
    path = Path(result["path"])
    meta = json.loads((path / "meta.json").read_text())
    breakdown = json.loads((path / "breakdown.json").read_text())
    assert meta["requests"] == {
        **meta["requests"],
        "total": planned.requests,
        "ok": planned.requests,
        "failed": 0,
    }
    trace = path / meta["trace"]["file"]
    assert sha256_file(trace) == meta["trace"]["sha256"]
    # the trace's verified drafts are what the server counted in the window, exactly
    assert breakdown["cross_checks"]["draft_tokens"]["rel_diff"] == 0.0
    assert breakdown["cross_checks"]["drafts"]["rel_diff"] == 0.0
    assert breakdown["counters"]["draft_tokens"] > 0 and breakdown["trace_counts"]["steps"] > 0
    shares = breakdown["shares"]
    assert 0 < shares["wasted_share"] < shares["added_share"] <= 1
    assert shares["wasted_share"] + shares["useful_share"] + shares["rejection_share"] + shares[
        "other_share"
    ] == pytest.approx(1.0)
    # the trimmed trace (what tests/data/profile keeps) gives the same answer as the full one
    counters = counters_from_metrics(
        (path / "metrics_before.txt").read_text(),
        (path / "metrics_after.txt").read_text(),
        meta["deployment"]["served_model_name"],
    )
    trimmed = tmp_path / "trimmed" / trace.name
    trim_trace(trace, trimmed)
    again = analyze_trace(trimmed, counters, k=meta["variant"]["k"]).to_json()
    assert json.loads(json.dumps(again, default=str)) == breakdown  # as tasks.artifacts.write_json wrote it

    # the deployment is gone, and recorded as stopped
    deployment_dir = path.parents[1] / "deployments" / meta["deployment_id"]
    deployment = json.loads((deployment_dir / "deployment.json").read_text())
    assert deployment["status"] == "stopped" and not psutil.pid_exists(deployment["pid"])
    assert "--profiler-config" in deployment["command"]

    # one warehouse row (the campaign flow ingested it), the same figures as breakdown.json
    rows = campaign_rows(
        "SELECT profile_id, variant, k, load_label, wasted_share, wasted_share_of_added, drafting_share, "
        "verification_share, rejection_share, other_share, wasted_drafting_share, "
        "wasted_verification_share, cross_check_ok FROM v_profile_waste WHERE campaign_id = ?",
        demo_campaign["campaign_id"],
    )
    assert len(rows) == 1
    row = dict(
        zip(
            ("window", "variant", "k", "load_label", "wasted_share", "wasted_share_of_added", "drafting_share",
             "verification_share", "rejection_share", "other_share", "wasted_drafting_share",
             "wasted_verification_share", "cross_check_ok"),
            rows[0],
            strict=True,
        )
    )  # fmt: skip
    label = f"c{planned.concurrency}"
    assert (row["variant"], row["k"], row["load_label"], row["cross_check_ok"]) == (
        "draft-k3",
        3,
        label,
        True,
    )
    assert row["window"] == meta["profile_id"]
    assert row["wasted_share"] == pytest.approx(shares["wasted_share"])
    html, png = save_chart(waste_chart([row]), tmp_path / "waste")
    text = html.read_text()
    assert "cdn.jsdelivr" not in text and "vega-lite" in text.lower()  # Vega inline: renders offline
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_server_without_profiler_gives_a_failed_artifact(tmp_path: Path) -> None:
    """The emulator has no /start_profile: the window is still written, failed, with the reason."""
    from emulator.config import EmulatorConfig
    from emulator.launch import EmulatorThread

    server = EmulatorThread(EmulatorConfig(port=0, model="emulated", k=3, step_ms=1, ttft_ms=1))
    server.start()
    try:
        deployment = emulator_deployment(
            server.url,
            tmp_path / "dep",
            "emulated.draft",
            variant=Variant(name="draft-k3", method="draft_model", k=3, draft_model="d"),
        )
        prompts = list(load_corpus(REPO / "workloads" / "smoke.jsonl").prompts)[:2]
        result = run_window(
            deployment,
            prompts,
            campaign_id="c1",
            raw_dir=tmp_path / "raw",
            trace_dir=tmp_path / "traces",
            plan=WindowPlan(concurrency=1, requests=2, warmup=0, request_timeout_s=10),
        )
    finally:
        server.stop()
    assert result.status == "failed" and result.breakdown is None
    assert "start_profile" in (result.error or "")
    meta = json.loads((result.path / "meta.json").read_text())
    assert meta["status"] == "failed" and "start_profile" in meta["error"]
    assert (result.path / "metrics_before.txt").exists() and not (result.path / "breakdown.json").exists()


def test_profile_variant_rejects_unknown_variants_and_endpoints(tmp_path: Path) -> None:
    from tasks.profile.run import profile_variant, profiled_variant

    with pytest.raises(InputError, match=r"no variant 'nope'.*plain, ngram-k3, draft-k3"):
        profile_variant(REPO / "experiments" / "demo.yaml", "nope", raw_dir=tmp_path)
    variant = Variant(name="v", method="ngram", k=2, extra_args=("--profiler-config", "{}"))
    with pytest.raises(InputError, match="already sets --profiler-config"):
        profiled_variant(variant, tmp_path)
    args = profiled_variant(Variant(name="v", method="ngram", k=2), tmp_path / "t").extra_args
    assert args[0] == "--profiler-config"
    assert json.loads(args[1]) == {"profiler": "torch", "torch_profiler_dir": str((tmp_path / "t").resolve())}


def test_cli_analyze_prints_the_breakdown() -> None:
    from cli.app import app

    runner = CliRunner()
    fixture = str(DATA / "draft-k3.code.c2.worker.pt.trace.json.gz")
    counters = ["--counters", str(DATA / "metrics_before.txt"), str(DATA / "metrics_after.txt")]
    out = runner.invoke(app, ["profile", "analyze", fixture, *counters, "--model", "tiny-draft-k3", "--json"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.output)
    assert data["cross_checks"]["draft_tokens"]["ok"] and "steps" not in data
    table = runner.invoke(app, ["profile", "analyze", fixture, *counters, "--model", "tiny-draft-k3"])
    assert table.exit_code == 0 and "wasted on rejected drafts" in table.output
    wrong = runner.invoke(app, ["profile", "analyze", fixture, *counters, "--model", "nope"])
    assert wrong.exit_code == 2 and "nope" in wrong.output
    bare = runner.invoke(app, ["profile", "analyze", fixture, "--json"])
    assert bare.exit_code == 0 and json.loads(bare.output)["shares"]["wasted_share"] is None
