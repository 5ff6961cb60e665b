"""The engine killed in the middle of a cell, on the real embedded engine: the campaign flow (real Prefect
API) on a tiny spec, its engine's process group SIGKILLed after the cell's second request. The cell is
recorded failed with every record it made, the slot relaunches and measures the cell again, the campaign
completes, nothing is left running, and a re-run skips what is done. Two engine starts: about 2-3 minutes.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import polars as pl
import pytest
from reliability_support import (
    Hooks,
    attempts,
    campaign_dir,
    incomplete_attempts,
    latest_deployment,
    launched_pgids,
    ledger_ids,
    records_lost,
    run_records,
    temporaries,
    wait_gone,
    warehouse_problems,
    write_spec,
)

from specgauge import progress
from specgauge.settings import get_settings

pytest_plugins = ["reliability_support"]
# Two engine starts and a killed cell within the test: minutes on 2 cores (the default is 5).
pytestmark = [pytest.mark.engine, pytest.mark.server, pytest.mark.timeout(1200)]

SPEC = {
    "name": "rel-engine-kill",
    "target": {"model": "models/tiny-target", "served_model_name": "tiny", "max_model_len": 2048},
    "variants": [{"name": "plain"}],
    "workloads": [{"file": "workloads/smoke.jsonl", "strata": ["code"]}],
    "load": {"concurrencies": [1], "requests": 4, "warmup": 1, "request_timeout_s": 60},
    "sampling": {"temperature": 0.0, "max_tokens": 16},
    "capture": {"enabled": False},
    "validity": {"aa_control": False},  # plain only: no A/A arm
    "launcher": {"kind": "local", "kv_cache_gib": 1, "ready_timeout_s": 600},
}


def test_engine_killed_mid_cell_is_recorded_relaunched_and_resumed(
    prefect_api, no_idle_engines, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, observe
) -> None:
    monkeypatch.setenv("SPECGAUGE_HOME", str(tmp_path / "home"))
    get_settings.cache_clear()
    assert get_settings().engine_python.name == "python"  # the real engine
    from flows.campaign import CampaignRequest, campaign

    spec = write_spec(tmp_path / "kill.yaml", SPEC)
    directory = campaign_dir(spec)
    killed: dict[str, float | int] = {}

    def kill_engine(cell_id: str, records: int) -> None:
        if records == 2 and not killed:  # the warm-up and the first measured request have ended
            pgid = int(latest_deployment(directory)["pid"])
            os.killpg(pgid, signal.SIGKILL)
            killed.update(pgid=pgid, at=time.monotonic())

    try:
        with progress.reporting(Hooks(on_record=kill_engine)):
            first = campaign(CampaignRequest(spec_path=str(spec), gate=False, analyze=False))
        after_first = attempts(directory)
        launches_first = sorted(p.name for p in (directory / "deployments").iterdir())
        second = campaign(
            CampaignRequest(spec_path=str(spec), gate=False, analyze=False)
        )  # resume: nothing left to do
        launches_second = sorted(p.name for p in (directory / "deployments").iterdir())
    finally:
        pgids = launched_pgids(directory) if (directory / "deployments").exists() else []
        leaked = wait_gone(pgids)
        for pgid in pgids if leaked else []:
            try:
                os.killpg(pgid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        get_settings.cache_clear()
    state = {
        "ledger": ledger_ids(),
        "temporaries": temporaries(get_settings().raw_dir),
        "incomplete": incomplete_attempts(directory),
        "lost": records_lost(directory),
        "warehouse": warehouse_problems(
            get_settings().raw_dir, get_settings().warehouse_path, directory.name
        ),
    }
    failed, redone = after_first["plain.r0.code.c1.a1"], after_first["plain.r0.code.c1.a2"]
    frame: pl.DataFrame = failed["frame"]
    saved = [
        json.loads((directory / "deployments" / n / "deployment.json").read_text()) for n in launches_first
    ]
    runs = run_records(directory)

    assert killed, "the engine was never killed"
    assert failed["status"] == "failed" and failed["deployment_id"].endswith(".l1")
    assert failed["persisted"] == failed["planned"] == 5  # every record of the failed cell kept
    assert frame["ok"].to_list()[:2] == [True, True] and not frame["ok"][2:].any()
    assert failed["error"]  # the engine is gone: the requests fail, and so does /metrics after the window
    assert redone["status"] == "ok" and redone["deployment_id"].endswith(".l2")
    assert launches_first == [f"{directory.name}.plain.r0.l1", f"{directory.name}.plain.r0.l2"]
    assert first["failed_cells"] == {} and first["deployments"][0]["launches"] == launches_first
    assert launches_second == launches_first  # the re-run launched nothing
    assert second["deployments"][0]["cells"] == {"plain.r0.code.c1": "ok (earlier run)"}
    assert len(runs) == 2 and runs[-1]["failed_cells"] == {}
    assert leaked == [] and state["ledger"] == [] and state["temporaries"] == []
    assert state["incomplete"] == [] and state["lost"] == 0 and state["warehouse"] == []
    observe(
        "engine killed mid-cell",
        done="the real engine's process group SIGKILLed after the cell's 2nd request (campaign flow, "
        "plain, 1 warm-up + 4 measured); then the campaign re-run",
        expected="the cell recorded failed with its records; the slot relaunches and measures the cell "
        "again; the campaign completes; the re-run skips it; nothing left running",
        observed=f"a1 {failed['status']} on l1 with {failed['persisted']}/{failed['planned']} records "
        f"(errors {failed['requests']['errors']}; {failed['error'][:110]}); relaunched as l2 (ready after "
        f"{saved[1]['ready_s']:.0f} s), a2 {redone['status']}; campaign failed_cells {first['failed_cells']}; "
        f"re-run launched nothing, cell 'ok (earlier run)'; l1 teardown: {saved[0]['teardown']}; "
        "warehouse consistent",
        records_lost=state["lost"],
        leaked=len(leaked) + len(state["ledger"]),
    )
