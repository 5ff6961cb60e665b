"""The clusters a cell's load runs on (`load.cluster`, tasks/load/dask_clusters.py): the spec's errors, an
SSHCluster through the real sshd of tests/services (127.0.0.1:2222) and SLURMCluster jobs on the real
single-node SLURM, each running whole cells (run_cell) against the emulator, and one against the embedded
engine."""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import polars as pl
import pytest
from emulator_cells import emulator_cell
from stand_ins.cluster import SSHD_DIR, SSHD_PORT, ensure_services, live_job_ids, squeue

from experiments.plan import CellPlan
from experiments.spec import SLO, LoadSpec, Sampling, load_spec
from specgauge.errors import InputError, SpecError
from tasks.cell import CellOutcome, run_cell
from tasks.load.dask_clusters import JOB_NAME, close_clusters, open_cluster
from workloads.schema import load_corpus

REPO = Path(__file__).resolve().parent.parent


def cluster_cell(emulator, tmp_path: Path, load: LoadSpec) -> CellOutcome:
    """One closed-loop cell of 4 prompts through run_cell (scrapes, gauges, artifact) against the emulator."""
    try:
        return emulator_cell(
            emulator,
            tmp_path,
            load,
            deployment_id="dask-clusters.plain.l1",
            campaign_id="dask-clusters",
            prompt_count=4,
        )
    finally:
        close_clusters()  # the cluster is kept for the next cell until this: every test tears its own down


def assert_ends(command: list[str], what: str, within_s: float = 15.0) -> None:
    """`command` (pgrep) finds nothing within `within_s`: what the cluster started over SSH has ended (its
    processes end as their SSH connections close)."""
    deadline = time.monotonic() + within_s
    while True:
        found = subprocess.run(command, capture_output=True, text=True).stdout.split()
        if not found:
            return
        assert time.monotonic() < deadline, f"{what} still running after {within_s:g} s: pids {found}"
        time.sleep(0.5)


def check_cell(outcome, total: int, workers: int, kind: str) -> dict:
    assert outcome.status == "ok", outcome.summary.error
    rows = pl.read_parquet(outcome.path / "requests.parquet")
    assert rows["index"].to_list() == list(range(total)) and rows["ok"].all()
    meta = json.loads((outcome.path / "meta.json").read_text())
    facts = meta["load"]["cluster"]
    assert meta["load"]["workers"] == workers and facts["kind"] == kind and facts["workers"] == workers
    assert len(facts["hosts"]) == 1 and abs(facts["hosts"][0]["offset_ms"]) < 100
    return facts


# -- the spec ------------------------------------------------------------------------------------------------
def write_spec(tmp_path: Path, cluster: str) -> Path:
    path = tmp_path / "spec.yaml"
    base = (REPO / "experiments" / "scale-out.yaml").read_text()
    head = base[: base.index("  cluster:")]
    path.write_text(head + textwrap.indent(textwrap.dedent(cluster), "  "))
    return path


def test_the_example_spec_asks_for_a_slurm_cluster_and_reads_back() -> None:
    spec = load_spec(REPO / "experiments" / "scale-out.yaml")
    cluster = spec.load.cluster
    assert cluster is not None and cluster.kind == "slurm" and cluster.hosts == 2
    assert cluster.workers_per_host == 4 and cluster.max_clock_offset_ms == 50


@pytest.mark.parametrize(
    ("cluster", "message"),
    [
        ("cluster:\n  kind: slurm\n  memory: lots\n", "load.cluster.slurm.memory"),
        ("cluster:\n  kind: slurm\n  walltime: soon\n", "load.cluster.slurm.walltime"),
        ("cluster:\n  kind: ssh\n  hosts: []\n", "load.cluster.ssh.hosts"),
        ("cluster:\n  kind: local\n  max_clock_offset_ms: 0\n", "load.cluster.local.max_clock_offset_ms"),
        ("cluster:\n  kind: local\n  workers_per_host: '3'\n", "load.cluster.local.workers_per_host"),
        ("cluster:\n  kind: address\n  address: localhost\n", "load.cluster.address.address"),
        ("cluster:\n  kind: kubernetes\n", "load.cluster"),
        ("workers: 2\ncluster:\n  kind: local\n", "leave it at 1 with load.cluster"),
    ],
)
def test_bad_cluster_settings_name_the_field(tmp_path: Path, cluster: str, message: str) -> None:
    with pytest.raises(SpecError) as failure:
        load_spec(write_spec(tmp_path, cluster))
    assert message in str(failure.value)


def test_an_ssh_cluster_without_a_key_is_refused_naming_the_field(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SPECGAUGE_DASK_SSH_KEY", raising=False)
    spec = LoadSpec(cluster={"kind": "ssh", "hosts": ["127.0.0.1"]}).cluster
    with (
        pytest.raises(InputError, match=r"load.cluster.key_path: an ssh cluster needs a key"),
        open_cluster(spec),
    ):
        pass
    named = LoadSpec(cluster={"kind": "ssh", "hosts": ["127.0.0.1"], "ssh": "login"}).cluster
    with pytest.raises(InputError, match=r"ClusterSSHBlock 'login' was not read"), open_cluster(named):
        pass


# -- SSH and SLURM -------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def services() -> None:
    ensure_services("sshd", "slurm")


@pytest.fixture
def no_leftover_jobs(services: None) -> Iterator[None]:
    before = live_job_ids()
    yield
    leftover = live_job_ids() - before
    assert not leftover, f"jobs left in squeue: {leftover}"


@pytest.mark.slurm
@pytest.mark.timeout(120)
def test_an_ssh_cluster_through_the_real_sshd_runs_a_cell(services: None, emulator, tmp_path: Path) -> None:
    """The scheduler and two workers started over SSH to 127.0.0.1 as the test user, key from the spec."""
    emulator.configure(ttft_ms=10, step_ms=5)
    user = "root" if os.geteuid() == 0 else os.environ.get("USER", "root")
    cluster = {
        "kind": "ssh",
        "hosts": ["127.0.0.1"],
        "workers_per_host": 2,
        "user": user,
        "port": SSHD_PORT,
        "key_path": str(SSHD_DIR / "client_ed25519"),
        "known_hosts": str(SSHD_DIR / "known_hosts"),
        "start_timeout_s": 90,
    }
    load = LoadSpec(
        concurrencies=(4,),
        requests=12,
        warmup=4,
        allow_short_cells=True,
        gauge_interval_s=0.5,
        cluster=cluster,
    )
    outcome = cluster_cell(emulator, tmp_path, load)
    facts = check_cell(outcome, 16, 2, "ssh")
    assert len(facts["hosts"][0]["workers"]) == 2
    assert emulator.stats()["completions"] == 16
    assert_ends(["pgrep", "-f", "distributed.cli.dask_spec"], "SSHCluster's processes")


@pytest.mark.slurm
@pytest.mark.timeout(120)
def test_slurm_jobs_run_a_cells_load_and_leave_squeue(
    no_leftover_jobs: None, emulator, tmp_path: Path
) -> None:
    """Two Dask workers in one SLURM job (dask-jobqueue, sbatch on this host), driving the emulator."""
    emulator.configure(ttft_ms=10, step_ms=5)
    cluster = {
        "kind": "slurm",
        "partition": "debug",
        "workers_per_host": 2,
        "cores": 1,
        "memory": "1GB",
        "walltime": "00:10:00",
        "start_timeout_s": 90,
    }
    load = LoadSpec(concurrencies=(2,), requests=8, warmup=2, gauge_interval_s=0.5, cluster=cluster)
    outcome = cluster_cell(emulator, tmp_path, load)
    check_cell(outcome, 10, 2, "slurm")
    assert not [row for row in squeue("%i", "%j", "%T") if row[1] == JOB_NAME]


@pytest.mark.slurm
@pytest.mark.engine
@pytest.mark.timeout(900)
def test_a_slurm_dask_worker_drives_the_embedded_engine(
    engines, no_leftover_jobs: None, tmp_path: Path
) -> None:
    """A Dask worker started as a SLURM job runs a small cell (C = 2, 4 requests) on the real engine."""
    deployment = engines.get("plain")
    cluster = {
        "kind": "slurm",
        "partition": "debug",
        "workers_per_host": 1,
        "memory": "1GB",
        "walltime": "00:15:00",
        "start_timeout_s": 120,
    }
    load = LoadSpec(
        concurrencies=(2,),
        requests=4,
        warmup=2,
        allow_short_cells=True,
        request_timeout_s=120,
        cluster=cluster,
    )
    try:
        outcome = run_cell(
            deployment,
            CellPlan("plain.r0.code.c2", "code", "closed", 2, None, "smoke.jsonl"),
            campaign_id="dask-slurm-engine",
            repeat=0,
            corpus=load_corpus(REPO / "workloads" / "smoke.jsonl"),
            sampling=Sampling(temperature=0.0, max_tokens=16, ignore_eos=True),
            load=load,
            slo=SLO(),
            cells_dir=tmp_path / "cells",
        )
    finally:
        close_clusters()
    summary = outcome.summary
    assert outcome.status == "ok", summary.error
    rows = pl.read_parquet(outcome.path / "requests.parquet")
    assert rows["index"].to_list() == list(range(6)) and rows["ok"].all()
    assert summary.requests.ok == 4 and summary.completion_tokens == 4 * 16
    meta = json.loads((outcome.path / "meta.json").read_text())
    assert meta["load"]["cluster"]["kind"] == "slurm" and meta["load"]["workers"] == 1
    # the scrapes bracket the measured requests: the server counted exactly their tokens
    check = summary.cross_checks.completion_tokens_vs_generation_tokens
    assert check.ok, check
    assert not [row for row in squeue("%i", "%j", "%T") if row[1] == JOB_NAME]
