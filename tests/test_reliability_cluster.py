"""Cluster faults on the real single-node SLURM and sshd (tests/services): the SLURM launcher over SSH runs
the stand-in engine (tests/reliability_support.py) as a batch job, reached through an SSH tunnel.

- the SSH connection dropped in the middle of a cell (the sshd process serving it killed, as in an outage);
- the job cancelled from outside (`scancel` by hand) while the readiness check waits, and while a cell runs:
  the deployment must be reported dead within seconds, with its log, not after a timeout.
Each ends with no job left in squeue, nothing in the ledger and no stand-in process left.
"""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import polars as pl
import psutil
import pytest
from reliability_support import ledger_ids, one_prompt_cell
from stand_ins.cluster import ensure_services, live_job_ids, ssh_config

from experiments.spec import LoadSpec, SlurmLaunchSpec, TargetSpec, Variant
from specgauge.errors import EngineDied
from tasks.health import wait_ready
from tasks.launch.config import ClusterConfig
from tasks.launch.local import free_port
from tasks.launch.slurm import SlurmLauncher
from tasks.launch.ssh import SSHError

pytest_plugins = ["reliability_support"]
pytestmark = pytest.mark.slurm

TARGET = TargetSpec(model="models/tiny-target", served_model_name="tiny")
PLAIN = Variant(name="plain")


@pytest.fixture(scope="module")
def cluster_services() -> None:
    ensure_services("sshd", "slurm")


@pytest.fixture
def no_leftover_jobs(cluster_services: None) -> Iterator[list[str]]:
    """The test appends the job ids it submits; none may be left in squeue (other sessions' jobs may be)."""
    mine: list[str] = []
    yield mine
    leftover = set(mine) & live_job_ids()
    assert not leftover, f"jobs left in squeue: {leftover}"


def launcher(tmp_path: Path, standin: Path, standin_args: str = "") -> SlurmLauncher:
    cluster = ClusterConfig(
        name="test",
        partition="debug",
        remote_dir=str(tmp_path / "cluster-home"),
        engine_command=str(standin),
        env={"SPECGAUGE_STANDIN_ARGS": standin_args} if standin_args else {},
        port=free_port(),
        poll_s=0.5,
        cancel_wait_s=30,
    )
    return SlurmLauncher(SlurmLaunchSpec(), cluster=cluster, ssh=ssh_config())


def standin_processes(standin: Path) -> list[int]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if str(standin) in " ".join(proc.info["cmdline"] or []):
                found.append(proc.pid)
        except psutil.Error:
            continue
    return found


def wait_no_standin(standin: Path, timeout_s: float = 30) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while (left := standin_processes(standin)) and time.monotonic() < deadline:
        time.sleep(0.3)
    return left


def a_cell(tmp_path: Path, deployment, *, requests: int, on_record=None):
    load = LoadSpec(
        concurrencies=(1,),
        requests=requests,
        warmup=1,
        allow_short_cells=True,
        request_timeout_s=10,
        gauge_interval_s=0.5,
    )
    return one_prompt_cell(
        tmp_path,
        deployment,
        workload_name="c.jsonl",
        campaign_id="rel-cluster",
        load=load,
        on_record=on_record,
    )


def scancel(job_id: str) -> float:
    subprocess.run(["scancel", job_id], check=True, capture_output=True)
    return time.monotonic()


def test_ssh_connection_dropped_mid_cell(no_leftover_jobs, standin, tmp_path, observe) -> None:
    slurm = launcher(tmp_path, standin, "--step-ms 30")
    deployment = slurm.launch(TARGET, PLAIN, deployment_id="rel-ssh.plain.r0.l1", directory=tmp_path / "dep")
    no_leftover_jobs.append(deployment.job_id)
    dropped: list[str] = []

    def drop(record) -> None:
        if record.index == 2 and not dropped:  # the warm-up and one measured request have ended
            try:
                slurm.shell.run("kill -9 $PPID; sleep 5")  # kill the sshd serving this connection
            except SSHError as exc:
                dropped.append(str(exc))

    try:
        wait_ready(deployment, slurm, timeout_s=120, poll_s=0.5)
        reconnects_before = slurm.shell.reconnects
        outcome = a_cell(tmp_path, deployment, requests=8, on_record=drop)
        alive_after = slurm.alive(deployment)  # the next command reconnects by itself
        reconnects = slurm.shell.reconnects - reconnects_before
    finally:
        slurm.teardown(deployment)
    frame = pl.read_parquet(outcome.path / "requests.parquet")
    left = wait_no_standin(standin)
    errors = outcome.summary.requests.errors
    assert dropped and "connection lost" in dropped[0]
    assert alive_after is True and reconnects >= 1
    assert frame.height == 9  # every request recorded, whatever happened to it
    assert outcome.summary.requests.ok >= 6  # the tunnel reconnected: the cell went on
    assert deployment.job_id not in live_job_ids() and deployment.id not in ledger_ids() and left == []
    observe(
        "SSH connection dropped mid-campaign",
        done="the sshd process serving the launcher's SSH connection killed (kill -9) after a cell's 2nd "
        "request; the engine (a SLURM job) reached through that connection's tunnel",
        expected="the session reconnects on its next use and the tunnel with it; requests caught by the drop "
        "fail classified, the rest succeed; the cell is recorded; teardown cancels the job",
        observed=f"drop seen as `{dropped[0][:80]}`; {reconnects} reconnect(s); cell {outcome.status}, "
        f"{outcome.summary.requests.ok}/{outcome.summary.requests.total} ok, errors {errors or 'none'}; "
        f"{frame.height}/9 records; job cancelled at teardown ({deployment.teardown})",
        records_lost=9 - frame.height,
        leaked=len(left) + int(deployment.id in ledger_ids()) + int(deployment.job_id in live_job_ids()),
    )


def test_job_cancelled_from_outside_while_waiting_until_ready(
    no_leftover_jobs, standin, tmp_path, observe
) -> None:
    slurm = launcher(tmp_path, standin, "--never-ready")
    deployment = slurm.launch(
        TARGET, PLAIN, deployment_id="rel-scancel-gate.plain.r0.l1", directory=tmp_path / "dep"
    )
    no_leftover_jobs.append(deployment.job_id)
    cancelled: list[float] = []
    timer = threading.Timer(3.0, lambda: cancelled.append(scancel(deployment.job_id)))
    timer.start()
    try:
        with pytest.raises(EngineDied) as died:
            wait_ready(deployment, slurm, timeout_s=600, poll_s=0.5)
        reported = time.monotonic()
    finally:
        timer.cancel()
        slurm.teardown(deployment)
    seconds = reported - cancelled[0]
    tail = died.value.log_tail
    left = wait_no_standin(standin)
    assert f"job {deployment.job_id}: CANCELLED" in tail
    assert "stand-in engine" in tail  # the job's own log
    assert seconds < 30, f"reported {seconds:.1f} s after scancel, of a 600 s ready timeout"
    assert deployment.status == "failed" and deployment.id not in ledger_ids() and left == []
    observe(
        "SLURM job cancelled from outside (readiness)",
        done="`scancel JOB` by hand 3 s into the readiness check of a never-ready engine (ready timeout 600 s)",
        expected="EngineDied within seconds, with the job's state and log tail; the job gone; nothing leaked",
        observed=f"EngineDied {seconds:.1f} s after scancel: `{str(died.value).splitlines()[0][:110]}`; log tail "
        f"starts `{tail.splitlines()[0][:70]}`; teardown: {deployment.teardown}",
        records_lost=0,
        leaked=len(left) + int(deployment.id in ledger_ids()) + int(deployment.job_id in live_job_ids()),
    )


def test_job_cancelled_from_outside_during_a_cell(no_leftover_jobs, standin, tmp_path, observe) -> None:
    slurm = launcher(tmp_path, standin, "--step-ms 50")  # 8 tokens: about 0.4 s a request
    deployment = slurm.launch(
        TARGET, PLAIN, deployment_id="rel-scancel-cell.plain.r0.l1", directory=tmp_path / "dep"
    )
    no_leftover_jobs.append(deployment.job_id)
    watcher = launcher(tmp_path, standin)  # its own SSH session: asks squeue while the cell runs
    cancelled: list[float] = []
    dead: list[float] = []

    def watch() -> None:
        t0 = scancel(deployment.job_id)
        cancelled.append(t0)
        while time.monotonic() - t0 < 120:
            if watcher.alive(deployment) is False:  # what the campaign asks before it relaunches the slot
                dead.append(time.monotonic())
                return
            time.sleep(0.2)

    thread = threading.Thread(target=watch)

    def cancel_now(record) -> None:
        if record.index == 3 and not thread.is_alive() and not cancelled:
            thread.start()

    try:
        wait_ready(deployment, slurm, timeout_s=120, poll_s=0.5)
        outcome = a_cell(tmp_path, deployment, requests=20, on_record=cancel_now)
        cell_ended = time.monotonic()
        thread.join(130)
        tail = watcher.log_tail(deployment)
    finally:
        watcher.shell.close()
        slurm.teardown(deployment)
    dead_after = dead[0] - cancelled[0]
    frame = pl.read_parquet(outcome.path / "requests.parquet")
    left = wait_no_standin(standin)
    assert outcome.status == "failed" and frame.height == 21
    assert outcome.summary.requests.ok >= 2 and outcome.summary.requests.failed >= 1
    assert dead_after < 30 and f"job {deployment.job_id}: CANCELLED" in tail
    assert deployment.id not in ledger_ids() and left == []
    observe(
        "SLURM job cancelled from outside (cell)",
        done="`scancel JOB` by hand after a cell's 4th request (20 measured requests of about 0.4 s)",
        expected="the remaining requests fail classified; the cell is recorded failed with every record; the "
        "launcher reports the job dead within seconds (the campaign then relaunches the slot), with its log",
        observed=f"cell {outcome.status}: {outcome.summary.requests.ok} ok, errors "
        f"{outcome.summary.requests.errors}, `{(outcome.summary.error or '')[:90]}`; {frame.height}/21 "
        f"records; the cell ended {cell_ended - cancelled[0]:.1f} s after scancel; alive() False "
        f"{dead_after:.1f} s after scancel; log: `{tail.splitlines()[0][:60]}`",
        records_lost=21 - frame.height,
        leaked=len(left) + int(deployment.id in ledger_ids()) + int(deployment.job_id in live_job_ids()),
    )
