"""Faults injected into real campaigns: the campaign flow on a real Prefect API, the local launcher
starting a stand-in engine (the emulator, tests/reliability_support.py) in its own process group.

Each test injects one fault and checks what should happen (a retry where the fault is transient, the
failure recorded with its reason, teardown, resume) and the end state: raw artifacts whole (no temporary
directory, every cell attempt complete), the warehouse consistent with the raw tree, no process left in
any launched group, nothing left in the ledger, and a re-run that resumes. Two faults are shown one level
down, on `run_cell` against the emulator: /metrics unreachable, and a disk that fills up while the cell's
artifact is written. What each test saw is recorded for docs/reliability.md (`observe`).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import polars as pl
import pytest
from emulator_cells import emulator_deployment
from reliability_support import (
    REPO,
    Hooks,
    assert_clean,
    attempts,
    campaign_dir,
    corpus,
    emulator_spec,
    end_state,
    latest_deployment,
    launched_pgids,
    leaks,
    ledger_ids,
    one_prompt_cell,
    poll_until,
    run_records,
    serve_env,
    serving_campaign,
    submit_served,
    wait_gone,
    write_spec,
)

from artifacts.store import write_json_atomic
from experiments.spec import LoadSpec
from specgauge import progress
from specgauge.errors import ArtifactError
from specgauge.settings import get_settings

# fixtures: standin, standin_engine, prefect_api, observe (home comes from conftest)
pytest_plugins = ["reliability_support"]


def run_campaign(spec_path: Path, hooks: Hooks | None = None, **options: Any) -> dict[str, Any]:
    from flows.campaign import CampaignRequest, campaign

    # Only one real engine may run on this machine, under its lock: these campaigns use the stand-in.
    assert get_settings().engine_python.name == "standin-engine", "use the standin_engine fixture"

    with progress.reporting(hooks or Hooks()):
        return campaign(CampaignRequest(spec_path=str(spec_path), gate=False, analyze=False, **options))


def set_emulator(directory: Path, **config: Any) -> None:
    """Reconfigure the stand-in engine of the campaign's current launch (POST /emulator/config)."""
    url = latest_deployment(directory)["base_url"]
    httpx.post(f"{url}/emulator/config", json=config, timeout=10).raise_for_status()


# -- stream cut, 5xx, stall: the client records each failure and the campaign goes on ----------------------
@pytest.mark.server  # a real Prefect API
def test_stream_cut_mid_response(prefect_api, standin_engine, tmp_path, observe) -> None:
    work = corpus(
        tmp_path / "cut.jsonl",
        [
            ("ok-0", "code", "def add(a, b):", 8),
            ("cut-1", "code", "def sub(a, b): [[fault:cut]]", 8),
            ("ok-2", "code", "def mul(a, b):", 8),
            ("cut-3", "code", "def div(a, b): [[fault:cut]]", 8),
        ],
    )
    spec = write_spec(tmp_path / "cut.yaml", emulator_spec("rel-cut", work, sampling={"max_tokens": 16}))
    directory = campaign_dir(spec)
    result = run_campaign(spec)

    (attempt,) = attempts(directory).values()
    frame: pl.DataFrame = attempt["frame"]
    cut = frame.filter(pl.col("error_class") == "stream_cut")
    state = end_state(directory)
    assert attempt["status"] == "ok" and result["failed_cells"] == {}
    assert attempt["requests"]["errors"] == {"stream_cut": 2} and attempt["requests"]["ok"] == 2
    assert sorted(set(cut["prompt_id"])) == ["cut-1", "cut-3"]
    assert (cut["chunks"] >= 1).all() and not cut["ok"].any()  # the part that arrived is kept, marked failed
    assert attempt["persisted"] == attempt["planned"] == 5
    assert_clean(state)
    observe(
        "stream cut mid-response",
        done="the stand-in engine drops the TCP connection after half the tokens of 2 of 4 prompts",
        expected="each cut request recorded failed (stream_cut) with what arrived; the cell goes on and is ok",
        observed=f"cell {attempt['status']}, {attempt['requests']['ok']}/{attempt['requests']['total']} ok, "
        f"errors {attempt['requests']['errors']}; cut records kept {cut['chunks'].to_list()} chunks; "
        f"{attempt['persisted']}/{attempt['planned']} records persisted; warehouse consistent",
        records_lost=state["records_lost"],
        leaked=leaks(state),
    )


@pytest.mark.server  # a real Prefect API
def test_bursts_of_5xx_retried_at_the_gate_recorded_in_cells_and_resumed(
    prefect_api, standin_engine, tmp_path, observe
) -> None:
    work = corpus(
        tmp_path / "5xx.jsonl",
        [
            ("ok-0", "code", "def add(a, b):", 8),
            ("err-1", "code", "def sub(a, b): [[fault:error]]", 8),
            ("err-2", "code", "def mul(a, b): [[fault:error]]", 8),
            ("ok-3", "code", "def div(a, b):", 8),
        ],
    )
    spec_data = emulator_spec(
        "rel-5xx", work, load={"concurrencies": [1, 2], "requests": 6, "allow_short_cells": True}
    )
    spec = write_spec(tmp_path / "5xx.yaml", spec_data)
    directory = campaign_dir(spec)
    standin_engine.write_text("--fail-first 3")  # the first three completions (the gate's) answer 503

    def whole_cell_burst(cell_id: str) -> None:
        if cell_id.endswith(".c2"):
            set_emulator(directory, fail_first=1000)  # every request of the second cell answers 503

    first = run_campaign(spec, Hooks(on_cell_started=whole_cell_burst))
    after_first = attempts(directory)
    ready_s = latest_deployment(directory)["ready_s"]
    standin_engine.write_text("")
    second = run_campaign(spec)  # resume: only the failed cell runs again, on a new launch
    after_second = attempts(directory)
    state = end_state(directory)

    c1, c2 = "plain.r0.code.c1.a1", "plain.r0.code.c2.a1"
    assert ready_s >= 2.0  # the gate polled through three 503s (one a second) before it was ready
    assert after_first[c1]["status"] == "ok"
    assert after_first[c1]["requests"]["errors"] == {"http_status": 3}  # err-1, err-2, then err-1 again
    assert (
        after_first[c2]["status"] == "failed" and "every measured request failed" in after_first[c2]["error"]
    )
    assert first["failed_cells"] == {"plain.r0.code.c2": "failed"}
    assert second["failed_cells"] == {}
    assert sorted(after_second) == [c1, c2, "plain.r0.code.c2.a2"]
    assert after_second["plain.r0.code.c2.a2"]["status"] == "ok"
    assert second["deployments"][0]["cells"]["plain.r0.code.c1"] == "ok (earlier run)"
    assert after_second["plain.r0.code.c2.a2"]["deployment_id"].endswith(".l2")  # a fresh launch
    assert_clean(state)
    observe(
        "burst of 5xx",
        done="503 for the gate's first 3 checks; 503 for 2 consecutive prompts of each pass in cell c1; "
        "503 for every request of cell c2; then the campaign re-run",
        expected="the gate retries until ready; failed requests recorded (http_status), the cell goes on; "
        "an all-failed cell is recorded failed and re-run on resume, finished cells skipped",
        observed=f"gate ready after {ready_s:.1f} s; c1 {after_first[c1]['status']} with errors "
        f"{after_first[c1]['requests']['errors']}; c2 {after_first[c2]['status']} "
        f"({after_first[c2]['error']}); re-run: c1 skipped, c2.a2 {after_second['plain.r0.code.c2.a2']['status']}"
        f" on a new launch; warehouse consistent",
        records_lost=state["records_lost"],
        leaked=leaks(state),
    )


@pytest.mark.server  # a real Prefect API
def test_stall_longer_than_the_request_timeout(prefect_api, standin_engine, tmp_path, observe) -> None:
    work = corpus(
        tmp_path / "stall.jsonl",
        [("ok-0", "code", "def add(a, b):", 8), ("stall-1", "code", "def sub(a, b): [[fault:stall]]", 8)],
    )
    timeout_s = 2.0
    spec_data = emulator_spec("rel-stall", work, load={"request_timeout_s": timeout_s})
    spec = write_spec(tmp_path / "stall.yaml", spec_data)  # the emulator stalls for 3600 s
    directory = campaign_dir(spec)
    result = run_campaign(spec)

    (attempt,) = attempts(directory).values()
    frame: pl.DataFrame = attempt["frame"]
    stalled = frame.filter(pl.col("prompt_id") == "stall-1")
    waited = (stalled["ended_s"] - stalled["sent_s"]).to_list()
    state = end_state(directory)
    assert attempt["status"] == "ok" and result["failed_cells"] == {}
    assert stalled["error_class"].to_list() == ["timeout", "timeout"]
    assert all(timeout_s <= w < timeout_s + 5 for w in waited), (
        waited
    )  # given up after the timeout, not 3600 s
    assert frame.filter(pl.col("prompt_id") == "ok-0")["ok"].all()
    assert_clean(state)
    observe(
        "stall longer than the request timeout",
        done=f"the stand-in engine sends one token then nothing for 3600 s; request_timeout_s {timeout_s:g}",
        expected="the request fails as `timeout` after request_timeout_s; the cell goes on",
        observed=f"stalled requests {stalled['error_class'].to_list()} after "
        f"{', '.join(f'{w:.2f}' for w in waited)} s; other requests ok; cell {attempt['status']}",
        records_lost=state["records_lost"],
        leaked=leaks(state),
    )


# -- /metrics: garbage through the campaign, unreachable for one cell ---------------------------------------
@pytest.mark.server  # a real Prefect API
def test_metrics_garbage_fails_the_cell_keeps_its_records_and_resumes(
    prefect_api, standin_engine, tmp_path, observe
) -> None:
    work = corpus(tmp_path / "m.jsonl", [("ok-0", "code", "def add(a, b):", 8)])
    spec = write_spec(tmp_path / "m.yaml", emulator_spec("rel-metrics", work))
    directory = campaign_dir(spec)
    standin_engine.write_text("--metrics-fault garbage")
    first = run_campaign(spec)
    garbage = attempts(directory)["plain.r0.code.c1.a1"]
    standin_engine.write_text("")
    second = run_campaign(spec)
    fixed = attempts(directory)["plain.r0.code.c1.a2"]
    state = end_state(directory)

    assert garbage["status"] == "failed" and "/metrics could not be used" in garbage["error"]
    assert "not a Prometheus text exposition" in garbage["server_problem"]
    assert garbage["requests"]["ok"] == 4 and garbage["persisted"] == 5  # every record kept
    assert first["failed_cells"] == {"plain.r0.code.c1": "failed"} and second["failed_cells"] == {}
    assert fixed["status"] == "ok"
    assert_clean(state)
    observe(
        "/metrics returns garbage",
        done="the stand-in engine's /metrics answers HTML and binary bytes; then the campaign re-run "
        "with /metrics repaired",
        expected="the cell is recorded failed with the reason, its request records kept; the re-run "
        "measures it again",
        observed=f"cell {garbage['status']}: {garbage['error'][:160]}...; {garbage['persisted']} records "
        f"kept ({garbage['requests']['ok']} ok measured); re-run: a2 {fixed['status']}",
        records_lost=state["records_lost"],
        leaked=leaks(state),
    )


def test_metrics_unreachable_fails_the_cell_naming_the_url(emulator, tmp_path, observe) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))  # bound, never listening: connection refused
        closed = f"http://127.0.0.1:{sock.getsockname()[1]}/metrics"
        deployment = emulator_deployment(
            emulator.url, tmp_path / "dep", "rel.metrics-unreachable.l1", metrics_url=closed
        )
        outcome = one_prompt_cell(
            tmp_path,
            deployment,
            workload_name="u.jsonl",
            campaign_id="rel-unreachable",
            load=LoadSpec(concurrencies=(1,), requests=4, warmup=1, gauge_interval_s=0.2),
        )
    summary = outcome.summary.model_dump(mode="json")
    rows = pl.read_parquet(outcome.path / "requests.parquet").height
    assert outcome.status == "failed" and closed in summary["error"]
    assert "ConnectError" in summary["error"] and summary["server_valid"] is False
    assert summary["requests"]["ok"] == 4 and rows == 5
    assert summary["gauges"]["scrape_failures"] >= 1
    observe(
        "/metrics unreachable",
        done="a cell whose metrics URL refuses connections (the completions endpoint works)",
        expected="the cell is recorded failed with the reason naming the URL; request records kept",
        observed=f"cell {outcome.status}: {summary['error'][:150]}...; {rows} records kept; "
        f"{summary['gauges']['scrape_failures']} gauge scrapes failed and were counted",
        records_lost=5 - rows,
        leaked=0,
    )


# -- the readiness check ---------------------------------------------------------------------------------
@pytest.mark.server  # a real Prefect API
def test_readiness_timeout_is_retried_torn_down_and_resumable(
    prefect_api, standin_engine, tmp_path, monkeypatch, observe
) -> None:
    import flows.campaign as flow_module

    # Same retries as in production, without the 10 s wait between them.
    monkeypatch.setattr(
        flow_module, "launch_until_ready", flow_module.launch_until_ready.with_options(retry_delay_seconds=0)
    )
    work = corpus(tmp_path / "g.jsonl", [("ok-0", "code", "def add(a, b):", 8)])
    spec = write_spec(
        tmp_path / "g.yaml", emulator_spec("rel-gate", work, launcher={"kind": "local", "ready_timeout_s": 3})
    )
    directory = campaign_dir(spec)
    standin_engine.write_text("--never-ready")
    first = run_campaign(spec)
    launches = sorted(p.name for p in (directory / "deployments").iterdir())
    saved = [json.loads((directory / "deployments" / n / "deployment.json").read_text()) for n in launches]
    state_after_timeouts = {"leaked": wait_gone(launched_pgids(directory)), "ledger": ledger_ids()}
    written_before_resume = sorted(p.name for p in (directory / "cells").glob("*"))
    standin_engine.write_text("")
    second = run_campaign(spec)
    state = end_state(directory)

    slot = first["deployments"][0]
    assert len(launches) == 3  # the first attempt and two retries, each a new launch id
    assert all(d["status"] == "failed" and d["teardown"] for d in saved)
    assert "not ready after 3 s" in slot["error"] and "/health answered 503" in slot["error"]
    assert slot["cells"] == {"plain.r0.code.c1": "not run (launch failed)"}
    assert written_before_resume == []  # nothing partial
    assert state_after_timeouts == {"leaked": [], "ledger": []}  # each launch's group (and child) stopped
    assert second["failed_cells"] == {} and attempts(directory)["plain.r0.code.c1.a1"]["status"] == "ok"
    assert_clean(state)
    observe(
        "readiness timeout",
        done="a stand-in engine whose /health answers 503 forever (with a child process in its group); "
        "ready_timeout_s 3; then the campaign re-run with a healthy engine",
        expected="ReadinessTimeout (transient) retried twice, each launch torn down; the slot's cells "
        "recorded not run; nothing written for them; the re-run completes",
        observed=f"{len(launches)} launches, each {saved[0]['status']} and torn down "
        f"({saved[0]['teardown']}); error: {slot['error'][:120]}; cells {slot['cells']}; re-run: cell ok",
        records_lost=state["records_lost"],
        leaked=len(state_after_timeouts["leaked"]) + len(state_after_timeouts["ledger"]) + leaks(state),
    )


# -- cancelled through the Prefect API ------------------------------------------------------------------------
@pytest.mark.server  # a real Prefect API
@pytest.mark.timeout(600)
def test_campaign_cancelled_through_the_api_leaves_no_engine_and_resumes(
    prefect_api, standin, standin_engine, home, tmp_path, observe
) -> None:
    from prefect.client.orchestration import get_client
    from prefect.states import Cancelling

    args_file = standin_engine
    # ~0.8 s a request, 80 requests: the cell still runs when a slow cancellation lands (in a CI run of
    # 2026-12-04 the cell of 40 requests had ended ok before the cancellation reached it)
    args_file.write_text("--step-ms 100")
    work = corpus(tmp_path / "c.jsonl", [("ok-0", "code", "def add(a, b):", 8)])
    spec = write_spec(
        tmp_path / "c.yaml", emulator_spec("rel-cancel", work, load={"requests": 80, "request_timeout_s": 30})
    )
    directory = campaign_dir(spec)
    env = serve_env(
        prefect_api,
        home,
        tmp_path,
        SPECGAUGE_ENGINE_PYTHON=str(standin),
        SPECGAUGE_STANDIN_ARGS_FILE=str(args_file),
    )
    log_path = tmp_path / "serve.log"
    with serving_campaign("reliability-cancel", env, log_path):
        flow_run = submit_served("reliability-cancel", spec)

        def engine_ready() -> bool:
            with get_client(sync_client=True) as client:
                run_state = client.read_flow_run(flow_run.id).state
            if run_state and run_state.is_final():
                raise AssertionError(f"the served run ended {run_state.type.value}: {run_state.message}")
            if not any(directory.glob("deployments/*/deployment.json")):  # the folder comes before the file
                return False
            status = latest_deployment(directory)["status"]
            assert status != "failed", "the launch failed"
            return status == "ready"

        # The served process imports the flows, polls, then runs the flow in a process of its own that
        # launches the stand-in (a minute or more on 2 busy cores). A run that ends first fails at once, and
        # every failure here carries the serve log: a served run once failed before launching, and a bare
        # timeout hid why.
        try:
            poll_until(engine_ready, 300, "the engine to be ready")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; serve log:\n{log_path.read_text()[-4000:]}") from None
        engine_pgid = latest_deployment(directory)["pid"]
        time.sleep(3)  # a few requests into the cell
        with get_client(sync_client=True) as client:
            client.set_flow_run_state(flow_run.id, Cancelling(), force=True)
            cancelled_at = time.monotonic()
            final = poll_until(
                lambda: (s := client.read_flow_run(flow_run.id).state) and s.is_final() and s, 90, "cancelled"
            )
            seconds = time.monotonic() - cancelled_at
    leaked = wait_gone([engine_pgid])
    ledger_after = ledger_ids()
    serve_log = log_path.read_text()
    interrupted = attempts(directory)
    args_file.write_text("")
    resumed = run_campaign(spec, ingest=False)
    done = attempts(directory)
    state = end_state(directory)

    assert final.type.value == "CANCELLED", final
    assert leaked == [] and ledger_after == []
    assert latest_deployment(directory)["teardown"]
    assert "Running hook '_reap_on_exit'" in serve_log
    assert "An error was encountered while running hook" not in serve_log
    (partial,) = interrupted.values()  # the cell that was running: written failed, every sent request kept
    frame: pl.DataFrame = partial["frame"]
    ended_ok, cancelled = int(frame["ok"].sum()), frame.filter(pl.col("error_class") == "cancelled").height
    never_sent = partial["planned"] - partial["persisted"]
    assert partial["status"] == "failed" and partial["error"].startswith("interrupted")
    assert ended_ok > 0 and cancelled == 1  # the request in flight when the run was cancelled
    assert ended_ok + cancelled == partial["persisted"] == frame["sent_s"].drop_nulls().len()
    assert frame["index"].to_list() == list(range(partial["persisted"]))  # no gap: none sent and lost
    assert resumed["failed_cells"] == {} and done["plain.r0.code.c1.a2"]["status"] == "ok"
    assert state["leaked_processes"] == [] and state["ledger"] == [] and state["temporaries"] == []
    observe(
        "campaign cancelled through the Prefect API",
        done="the campaign flow served by a runner (flow.serve), run through the API, set to Cancelling "
        "while a cell runs on the stand-in engine; then the campaign re-run",
        expected="the run ends Cancelled; the engine's process group is stopped; the ledger is empty; "
        "the running cell is written failed with the requests that ended; the re-run resumes",
        observed=f"state {final.name} {seconds:.1f} s after the request; engine group left "
        f"{len(leaked)} processes; ledger {ledger_after}; on_cancellation hook ran without error; "
        f"interrupted cell written {partial['status']} with every request it sent ({ended_ok} ok, "
        f"{cancelled} in flight recorded cancelled; {never_sent} planned were never sent); re-run: a2 ok",
        records_lost=0,
        leaked=len(leaked) + len(ledger_after),
    )


# -- the warehouse -------------------------------------------------------------------------------------------
def _cli(spec: Path, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "cli", "campaign", "run", str(spec), "--no-gate", "--no-analyze"],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


@pytest.mark.server  # a real Prefect API
def test_two_campaigns_write_one_warehouse_at_once(prefect_api, standin, home, tmp_path, observe) -> None:
    work = corpus(tmp_path / "w.jsonl", [("ok-0", "code", "def add(a, b):", 8), ("ok-1", "chat", "hi", 8)])
    specs = [
        write_spec(tmp_path / f"{name}.yaml", emulator_spec(name, work, load={"concurrencies": [1, 2]}))
        for name in ("rel-two-a", "rel-two-b")
    ]
    env = {
        **os.environ,
        "PREFECT_API_URL": prefect_api,
        "SPECGAUGE_HOME": str(home),
        "SPECGAUGE_ENGINE_PYTHON": str(standin),
    }
    procs = [_cli(spec, env) for spec in specs]  # both at once, one raw tree, one warehouse
    outputs = [p.communicate(timeout=300)[0] for p in procs]
    codes = [p.returncode for p in procs]
    directories = [campaign_dir(spec) for spec in specs]
    states = [end_state(d) for d in directories]
    from warehouse.db import reader
    from warehouse.ingest import ingest_raw

    clean = tmp_path / "clean.duckdb"
    ingest_raw(get_settings().raw_dir, clean)
    query = "SELECT cell_key, status, requests_total, requests_ok FROM cells ORDER BY cell_key"
    with reader(get_settings().warehouse_path) as con:
        live = con.execute(query).fetchall()
        campaigns = con.execute("SELECT campaign_id, status FROM campaigns ORDER BY 1").fetchall()
    with reader(clean) as con:
        fresh = con.execute(query).fetchall()

    assert codes == [0, 0], outputs
    assert len(live) == 8 and all(status == "ok" for _, status, _, _ in live)  # 2 campaigns x 4 cells
    assert live == fresh  # the same as one writer ingesting the finished tree alone
    assert campaigns == sorted((d.name, "complete") for d in directories)
    for state in states:
        assert_clean(state)
    observe(
        "two campaigns writing one warehouse",
        done="two `specgauge campaign run` processes at once, two specs, one raw tree, one DuckDB file, "
        "one Prefect API (its writer concurrency limit) and the warehouse file lock",
        expected="both complete; every cell once; the warehouse equal to a fresh single-writer ingest",
        observed=f"exit codes {codes}; {len(live)} cells, all ok; campaigns {[s for _, s in campaigns]}; "
        f"equal to a fresh ingest: {live == fresh}",
        records_lost=sum(s["records_lost"] for s in states),
        leaked=sum(leaks(s) for s in states),
    )


@pytest.mark.server  # a real Prefect API
def test_crash_during_the_campaigns_ingest_then_resume(prefect_api, standin, home, tmp_path, observe) -> None:
    """The campaign process is SIGKILLed while its ingest holds the warehouse; the re-run completes it."""
    from warehouse_fixtures import RawBuilder, make_spec

    from flows.ingest import WRITER_SLOT_WAIT_S
    from warehouse.db import reader, writer
    from warehouse.lock import holder_path

    raw = get_settings().raw_dir
    # Another campaign's large raw tree makes the ingest long enough to be killed in the middle.
    RawBuilder(raw, spec=make_spec("rel-bulk", repeats=6, concurrencies=(1, 2, 4, 8))).write_all(
        captures=False
    )
    work = corpus(tmp_path / "i.jsonl", [("ok-0", "code", "def add(a, b):", 8)])
    spec = write_spec(tmp_path / "i.yaml", emulator_spec("rel-ingest-crash", work))
    env = {
        **os.environ,
        "PREFECT_API_URL": prefect_api,
        "SPECGAUGE_HOME": str(home),
        "SPECGAUGE_ENGINE_PYTHON": str(standin),
    }
    db = get_settings().warehouse_path
    with writer(db):
        pass  # the schema exists already, as in any warehouse after its first ingest
    proc = _cli(spec, env)
    try:

        def ingesting() -> bool:
            assert proc.poll() is None, (
                f"the campaign ended before its ingest was caught: {proc.stdout.read()}"
            )
            return holder_path(db).exists()

        poll_until(ingesting, 240, "the ingest to hold the warehouse", poll_s=0.02)
        # Now the ingest holds the Prefect writer slot and the file lock (its note is there only then).
        time.sleep(0.3)  # into its transactions
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=60)
    with reader(db) as con:  # what the killed writer committed: whole cells only
        committed = {
            t: con.execute(f"SELECT count(*) FROM {t}").fetchone()[0]
            for t in ("deployments", "cells", "requests")
        }
        partial = con.execute(
            "SELECT c.cell_key, c.requests_total + c.warmup, count(r.cell_key) FROM cells c "
            "LEFT JOIN requests r USING (cell_key) GROUP BY ALL"
        ).fetchall()
    started = time.monotonic()
    rerun = _cli(spec, env)
    out = rerun.communicate(timeout=300)[0]
    rerun_s = time.monotonic() - started
    directory = campaign_dir(spec)
    state = end_state(directory)

    assert proc.returncode == -signal.SIGKILL
    assert all(rows == expected for _, expected, rows in partial), partial  # no half-ingested cell
    assert committed["requests"] == sum(rows for _, _, rows in partial)  # no request without its cell
    assert rerun.returncode == 0, out
    assert "a writer that crashed left it; freeing it" in " ".join(out.split())  # the dead writer's slot
    assert "ok (earlier run)" in json.dumps(run_records(directory)[-1])  # the cell was not measured again
    assert_clean(state)
    with reader(db) as con:
        cells = con.execute("SELECT count(*) FROM cells").fetchone()[0]
    assert cells == 6 * 3 * 4 + 1
    observe(
        "crash during warehouse ingest",
        done="SIGKILL of the campaign process while its ingest holds the warehouse writer lock; then "
        "the campaign re-run",
        expected="only whole cells committed; the re-run skips measured cells and completes the ingest",
        observed=f"committed before the kill: {committed} (whole cells only: each with all its request "
        "rows; the transaction that was open was rolled back); "
        f"re-run exit {rerun.returncode} after {rerun_s:.0f} s: it found the dead writer's Prefect slot "
        f"taken with no live writer after {WRITER_SLOT_WAIT_S:g} s and freed it; the cell not re-measured; "
        f"all {cells} cells ingested; warehouse consistent with the raw tree",
        records_lost=state["records_lost"],
        leaked=leaks(state),
    )


# -- disk full -----------------------------------------------------------------------------------------------
RLIMIT_CELL = """
import json, resource, signal, sys
from pathlib import Path
from experiments.plan import CellPlan
from experiments.spec import SLO, LoadSpec, Sampling, Variant
from tasks.cell import run_cell
from tasks.launch.base import Deployment
from workloads.schema import load_corpus
url, work, cells = sys.argv[1], sys.argv[2], Path(sys.argv[3])
deployment = Deployment(id="rel.fsize.l1", launcher="endpoint", variant=Variant(name="plain"),
    served_model_name="emulated", base_url=url, metrics_url=url + "/metrics", directory=cells.parent / "dep")
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead of killing us
resource.setrlimit(resource.RLIMIT_FSIZE, (2048, 2048))
try:
    run_cell(deployment, CellPlan("plain.r0.code.c1", "code", "closed", 1, None, work), campaign_id="rel-fsize",
             repeat=0, corpus=load_corpus(work), sampling=Sampling(max_tokens=8),
             load=LoadSpec(concurrencies=(1,), requests=4, warmup=1), slo=SLO(), cells_dir=cells)
    print(json.dumps({"raised": None}))
except Exception as exc:
    print(json.dumps({"raised": type(exc).__name__, "message": str(exc)}))
"""


@pytest.mark.parametrize("limit", ["tmpfs", "rlimit_fsize"])
def test_disk_full_while_writing_an_artifact(emulator, tmp_path, limit, observe) -> None:
    work = corpus(tmp_path / "d.jsonl", [("ok-0", "code", "def add(a, b):", 8)])
    full = tmp_path / "full"
    full.mkdir()
    cells = full / "cells"
    if limit == "tmpfs":
        if os.geteuid() != 0:
            pytest.skip("mounting a tmpfs needs root; the rlimit_fsize case covers this without it")
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(full)], check=True)
        try:
            (full / "filler").write_bytes(b"\0" * (64 * 1024 - 6 * 1024))  # about 6 KiB stay free
            deployment = emulator_deployment(emulator.url, tmp_path / "dep", "rel.full.l1")
            with pytest.raises(ArtifactError) as raised:
                one_prompt_cell(
                    tmp_path,
                    deployment,
                    workload_name=work.name,
                    campaign_id="rel-full",
                    load=LoadSpec(concurrencies=(1,), requests=4, warmup=1),
                    cells_dir=cells,
                )
            message = str(raised.value)
            big = {"rows": ["x" * 100] * 200}
            with pytest.raises(ArtifactError) as single:
                write_json_atomic(full / "runs" / "run.json", big)  # a run record or verdict: one file
            left = sorted(p.name for p in full.rglob("*") if p.name != "filler")
        finally:
            subprocess.run(["umount", str(full)], check=True)
        single_message = str(single.value)
    else:
        done = subprocess.run(
            [sys.executable, "-c", RLIMIT_CELL, emulator.url, str(work), str(cells)],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
        )
        outcome = json.loads(done.stdout.strip().splitlines()[-1])
        assert outcome["raised"] == "ArtifactError", (outcome, done.stderr[-2000:])
        message = outcome["message"]
        left = sorted(p.name for p in full.rglob("*"))
        single_message = "(not tried under RLIMIT_FSIZE)"

    message = message.replace(str(tmp_path) + "/", "")
    single_message = single_message.replace(str(tmp_path) + "/", "")
    assert "could not write artifact" in message and "plain.r0.code.c1.a1" in message
    assert ("No space left on device" if limit == "tmpfs" else "File too large") in message
    assert "nothing was kept" in message
    assert left in ([], ["cells"], ["cells", "runs"], ["runs"]), left  # no artifact, no temporary
    if limit == "tmpfs":
        assert "run.json" in single_message and "No space left on device" in single_message
    observe(
        "disk full while writing an artifact",
        done=f"a cell written to a directory that fills up ({'a 64 KiB tmpfs with 6 KiB free' if limit == 'tmpfs' else 'RLIMIT_FSIZE 2 KiB in a subprocess'})",
        expected="ArtifactError naming the artifact and the cause; no artifact, no temporary directory "
        "(the cell is re-run on resume)",
        observed=f"{message[:170]}...; left in the directory: {left or 'nothing'}; the 5 records of the "
        "cell could not be kept anywhere (a re-run measures the cell again)"
        + (f"; single-file artifact: {single_message[:100]}" if limit == "tmpfs" else ""),
        records_lost=5,  # the cell's records could not be written anywhere; a resume measures it again
        leaked=0,
    )


HOLD_FILE_LOCK = """
import sys, time
from pathlib import Path
from warehouse.lock import writer_lock
with writer_lock(Path(sys.argv[1])):
    Path(sys.argv[2]).write_text("held")
    time.sleep(float(sys.argv[3]))
    Path(sys.argv[2]).write_text("releasing")  # the last thing done while the lock is held
"""


@pytest.mark.server  # a real Prefect API
def test_a_taken_writer_slot_is_freed_only_when_no_process_writes(prefect_api, home, tmp_path) -> None:
    """The Prefect writer slot of a writer that died is taken back; one whose writer is alive is waited for."""
    from prefect.concurrency.sync import concurrency

    from flows.ingest import ensure_writer_limit, writer_slot
    from warehouse.lock import WRITER_LIMIT_NAME

    db = tmp_path / "w.duckdb"
    ensure_writer_limit()
    marker = tmp_path / "held"
    holder = subprocess.Popen([sys.executable, "-c", HOLD_FILE_LOCK, str(db), str(marker), "4"], cwd=REPO)
    try:
        poll_until(marker.exists, 60, "the file lock holder")
        with concurrency(WRITER_LIMIT_NAME, occupy=1):  # this slot's holder stands for a writer that died
            started = time.monotonic()
            with writer_slot(db, wait_s=1):  # a live writer holds the file lock: wait for it, then take over
                entered = time.monotonic() - started
                # Not the holder's exit: a loaded machine may take a while to end a process whose lock is
                # already released. The marker says whether the holder had come to the end of its hold.
                holder_released = marker.read_text() == "releasing"
    finally:
        holder.wait(30)
    assert holder_released, "entered while a live process held the warehouse's file lock"
    assert entered >= 1
