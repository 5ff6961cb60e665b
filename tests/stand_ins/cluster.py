"""The test cluster: the real sshd and single-node SLURM that tests/services/{sshd,slurm}.sh run on this
host, and how tests reach them. `ensure_services()` starts them when they are down and we are root (CI),
and skips with the reason otherwise."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tasks.launch.local import UNIPROCESS, uniprocess_env
from tasks.launch.ssh import SSHConfig

REPO = Path(__file__).resolve().parents[2]
SERVICES = REPO / "tests" / "services"
STAND_INS = REPO / "tests" / "stand_ins"
SLURM_DIR = Path(os.environ.get("SPECGAUGE_SLURM_DIR", "/var/tmp/specgauge-slurm"))
SSHD_DIR = Path(os.environ.get("SPECGAUGE_SSHD_DIR", "/var/tmp/specgauge-sshd"))
SSHD_PORT = int(os.environ.get("SPECGAUGE_SSHD_PORT", "2222"))
SLURM_CONF = SLURM_DIR / "slurm.conf"
ENGINE_PYTHON = REPO / ".engine-venv" / "bin" / "python"

# How the test cluster's jobs run the embedded engine. The job tests check the path (submit, tunnel, gate,
# cell, teardown), not step times, so the engine skips compiling: on the CPU vLLM's compile cache never loads
# back, and the compile took 54-56 s of each job's start in CI (2026-12-01). Its worker runs in the engine
# core's process, as the local launcher runs it (`uniprocess_env`; docs/performance.md "Engine start").
CPU_ENGINE_ARGS = ("--enforce-eager", *UNIPROCESS)
CPU_ENGINE_ENV = uniprocess_env(list(UNIPROCESS))


def _status(service: str) -> bool:
    script = SERVICES / f"{service}.sh"
    return subprocess.run(["bash", str(script), "status"], capture_output=True).returncode == 0


def ensure_services(*services: str) -> None:
    """Make sure sshd and/or slurm run; start them as root, else skip saying how to start them."""
    for service in services:
        if _status(service):
            continue
        if os.geteuid() != 0:
            pytest.skip(
                f"{service} is not running and starting it needs root: run `sudo tests/services/{service}.sh start`"
            )
        if service == "slurm" and not shutil.which("slurmctld"):
            pytest.fail("slurm-wlm is not installed: run tests/services/install-system.sh (as root)")
        done = subprocess.run(
            ["bash", str(SERVICES / f"{service}.sh"), "start"], capture_output=True, text=True
        )
        if done.returncode != 0:
            pytest.fail(f"tests/services/{service}.sh start failed:\n{done.stdout}{done.stderr}")
    if "slurm" in services:
        os.environ["SLURM_CONF"] = str(SLURM_CONF)  # for squeue/scancel run by the tests themselves


def ssh_config(**changes: object) -> SSHConfig:
    """The test sshd on 127.0.0.1, its host key pinned in its own known_hosts file."""
    settings: dict[str, object] = {
        "host": "127.0.0.1",
        "port": SSHD_PORT,
        "user": "root" if os.geteuid() == 0 else os.environ.get("USER", "root"),
        "key_path": SSHD_DIR / "client_ed25519",
        "known_hosts": SSHD_DIR / "known_hosts",
        "reconnect_backoff_s": 0.2,
    }
    settings.update(changes)
    return SSHConfig(**settings)  # type: ignore[arg-type]


def squeue(*fields: str) -> list[list[str]]:
    """Every job slurmctld shows as pending or running, as lists of the requested squeue fields."""
    fmt = "|".join(fields or ("%i", "%j", "%T"))
    done = subprocess.run(["squeue", "-h", "-o", fmt], capture_output=True, text=True, check=True)
    return [line.split("|") for line in done.stdout.splitlines() if line.strip()]


def live_job_ids() -> set[str]:
    return {row[0] for row in squeue("%i")}


def save_cluster_blocks(
    ssh_block: str,
    cluster_block: str,
    *,
    engine_command: str,
    remote_dir: Path,
    time_limit: str,
    env: dict[str, str] | None = None,
) -> None:
    """The test cluster as Prefect blocks saved to the current Prefect API: `ssh_block`, the test sshd with its
    key, and `cluster_block`, partition debug over it, one CPU a job and port 0 (jobs on the one node each take
    a free port), the engine started as `engine_command`."""
    # imported here: the blocks import Prefect, which most users of this module never need
    from blocks.cluster_ssh import ClusterSSHBlock
    from blocks.slurm_cluster import SlurmClusterBlock

    plain = ssh_config()
    ClusterSSHBlock(
        host=plain.host,
        port=plain.port,
        user=plain.user,
        private_key=(SSHD_DIR / "client_ed25519").read_text(),
        known_hosts=str(plain.known_hosts),
    ).save(ssh_block, overwrite=True)
    SlurmClusterBlock(
        partition="debug",
        time_limit=time_limit,
        cpus_per_task=1,
        remote_dir=str(remote_dir),
        engine_command=engine_command,
        env=env or {},
        port=0,
        ssh_block=ssh_block,
    ).save(cluster_block, overwrite=True)
