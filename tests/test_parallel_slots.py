"""Parallel deployment slots on the real single-node SLURM (tests/services) over the real sshd: a campaign with
`parallel_deployments: 2` runs two repeat blocks at once, each block's slots on one node (the later slots of a
block are submitted with --nodelist=<the block's node>), every cell records its node; with the cluster's port 0
each job takes a free port on the shared node. A two-slot campaign cancelled through the API leaves no job of
either slot, nothing in the ledger and no engine process. The engine is the stand-in (tests/reliability_support.py:
the emulator behind vLLM's command line): the orchestration is what is tested here; one real engine at a time
is all this machine holds, and the SLURM launcher's real-engine run is tests/test_slurm.py's.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from reliability_support import (
    corpus,
    ledger_ids,
    poll_until,
    serve_env,
    serving_campaign,
    submit_served,
    write_spec,
)
from stand_ins.cluster import ensure_services, live_job_ids, save_cluster_blocks, squeue

pytest_plugins = ["reliability_support"]
pytestmark = [pytest.mark.slurm, pytest.mark.server]

SSH_BLOCK = "slots-login"
CLUSTER_BLOCK = "slots-cluster"


@pytest.fixture(scope="module")
def slots_cluster(prefect_api: str, standin: Path, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The test cluster as saved blocks: the stand-in as its engine, port 0 (jobs share the one node), one CPU
    a job (two jobs fit the node's two CPUs at once)."""
    ensure_services("sshd", "slurm")
    save_cluster_blocks(
        SSH_BLOCK,
        CLUSTER_BLOCK,
        engine_command=str(standin),
        remote_dir=tmp_path_factory.mktemp("slots-cluster-home"),
        time_limit="00:10:00",
        env={"SPECGAUGE_STANDIN_ARGS": "--step-ms 40"},
    )
    return CLUSTER_BLOCK


@pytest.fixture
def campaign_jobs() -> Iterator[list[str]]:
    """Job ids the test's campaign submitted (filled in by the test); none may be left in squeue."""
    mine: list[str] = []
    yield mine
    leftover = set(mine) & live_job_ids()
    subprocess.run(["scancel", *leftover], check=False, capture_output=True)
    assert not leftover, f"jobs left in squeue: {leftover}"


def slots_spec(tmp_path: Path, name: str, *, requests: int, repeats: int = 2) -> Path:
    work = corpus(
        tmp_path / f"{name}.jsonl", [("p-0", "code", "def add(a, b):", 8), ("p-1", "chat", "Hi", 8)]
    )
    spec: dict[str, Any] = {
        "name": name,
        "target": {"model": "models/tiny-target", "served_model_name": "tiny"},
        "variants": [{"name": "plain"}, {"name": "ngram-k3", "method": "ngram", "k": 3}],
        "workloads": [{"file": str(work)}],
        "load": {
            "concurrencies": [1],
            "requests": requests,
            "warmup": 1,
            "allow_short_cells": True,
            "request_timeout_s": 30,
        },
        "sampling": {"max_tokens": 8},
        "capture": {"enabled": False},
        "validity": {"client_calibration": False, "aa_control": False},
        "repeats": repeats,
        "parallel_deployments": 2,
        "launcher": {"kind": "slurm", "cluster": CLUSTER_BLOCK, "ready_timeout_s": 300},
    }
    return write_spec(tmp_path / f"{name}.yaml", spec)


def deployments_of(directory: Path) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted(directory.glob("deployments/*/deployment.json"))]


def seconds(stamp: str) -> float:
    return datetime.fromisoformat(stamp).timestamp()


@pytest.mark.timeout(900)
def test_two_repeat_blocks_run_at_once_each_on_one_node(
    slots_cluster: str, campaign_jobs: list[str], tmp_path: Path, home: Path
) -> None:
    from flows.campaign import CampaignRequest, campaign

    spec = slots_spec(tmp_path, "slots-two", requests=12)
    result = campaign(CampaignRequest(spec_path=str(spec), gate=False, analyze=False))
    directory = Path(result["directory"])
    launched = deployments_of(directory)
    campaign_jobs.extend(str(d["job_id"]) for d in launched)

    assert result["failed_cells"] == {}
    assert len(launched) == 4 and all(d["status"] == "stopped" for d in launched)
    # Two blocks in flight at once: a deployment of repeat 0 and one of repeat 1 served at the same time.
    spans = {d["id"]: (seconds(d["started_at"]) + d["ready_s"], seconds(d["stopped_at"])) for d in launched}
    by_repeat = {r: [i for i in spans if f".r{r}." in i] for r in (0, 1)}
    overlaps = [
        (a, b)
        for a in by_repeat[0]
        for b in by_repeat[1]
        if min(spans[a][1], spans[b][1]) > max(spans[a][0], spans[b][0])
    ]
    assert overlaps, f"no two slots were in flight at once: {spans}"
    # Each block on one node; its second slot was pinned there; the port was the job's own.
    node = launched[0]["extra"]["node"]
    assert {d["extra"]["node"] for d in launched} == {node}
    ports = {d["id"]: d["extra"]["port"] for d in launched}
    a, b = overlaps[0]
    assert ports[a] > 0 and ports[b] > 0 and ports[a] != ports[b]  # one node, two engines: each its own port
    for repeat in (0, 1):
        order = [s for s in result["deployments"] if f".r{repeat}" in s["slot"]]
        scripts = [(directory / "deployments" / s["launches"][-1] / "job.sbatch").read_text() for s in order]
        assert f"--nodelist={node}" not in scripts[0] and f"#SBATCH --nodelist={node}" in scripts[1]
    # Every cell records the node it ran on.
    metas = [json.loads(p.read_text()) for p in directory.glob("cells/*/meta.json")]
    assert len(metas) == 8 and {m["deployment"]["extra"]["node"] for m in metas} == {node}
    assert ledger_ids() == []


POLL_S = 0.5  # how often the waits below ask squeue and the API


@pytest.mark.timeout(900)
def test_a_cancelled_two_slot_campaign_leaves_no_job_behind(
    prefect_api: str, slots_cluster: str, campaign_jobs: list[str], standin: Path, tmp_path: Path, home: Path
) -> None:
    from prefect.client.orchestration import get_client
    from prefect.states import Cancelling

    spec = slots_spec(tmp_path, "slots-cancel", requests=400)  # long cells: both slots are mid-cell
    log_path = tmp_path / "serve.log"
    with serving_campaign("slots-cancel", serve_env(prefect_api, home, tmp_path), log_path):
        flow_run = submit_served("slots-cancel", spec, POLL_S)

        def two_jobs_running() -> list[str]:
            rows = [r for r in squeue("%i", "%j", "%T") if r[1].startswith("specgauge-slots-cancel")]
            campaign_jobs.extend(r[0] for r in rows if r[0] not in campaign_jobs)
            running = [r[0] for r in rows if r[2] == "RUNNING"]
            return running if len(running) >= 2 else []

        try:
            running = poll_until(two_jobs_running, 400, "two slots' jobs running at once", POLL_S)
        except AssertionError as exc:
            raise AssertionError(f"{exc}; serve log:\n{log_path.read_text()[-4000:]}") from None
        time.sleep(3)
        with get_client(sync_client=True) as client:
            client.set_flow_run_state(flow_run.id, Cancelling(), force=True)
            final = poll_until(
                lambda: (s := client.read_flow_run(flow_run.id).state) and s.is_final() and s,
                120,
                "cancelled",
                POLL_S,
            )
    left = poll_until(
        lambda: not (set(campaign_jobs) & live_job_ids()) or None, 60, "the jobs to leave squeue", POLL_S
    )
    serve_log = log_path.read_text()

    assert len(running) == 2 and left
    assert final.type.value == "CANCELLED", final
    assert "Running hook '_reap_on_exit'" in serve_log
    assert ledger_ids() == []
    standins = subprocess.run(["pgrep", "-f", str(standin)], capture_output=True, text=True).stdout.split()
    assert standins == [], f"stand-in engines left: {standins}"
