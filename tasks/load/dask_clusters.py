"""The Dask cluster a cell's load runs on (`load.cluster`, docs/scale-out.md): start it, hand out a Client,
always tear it down.

- `local`: distributed.LocalCluster, `workers_per_host` worker processes on this machine.
- `slurm`: dask-jobqueue's SLURMCluster, `hosts` batch jobs of `workers_per_host` worker processes each,
  submitted with this machine's sbatch (the launchers' local path: the flow runs on the login node; their SSH
  path to a remote login node is not built for load clusters). The jobs are cancelled at teardown.
- `ssh`: distributed.SSHCluster over asyncssh: the scheduler on `scheduler_host`, the workers on `hosts`,
  with the user, port and key of an `SSHConfig` (a ClusterSSHBlock's, resolved by the caller) or of the spec's
  `user`/`port`/`key_path` (default: the key file named by SPECGAUGE_DASK_SSH_KEY). Keys are never logged.
- `address`: a scheduler that already runs; nothing is started or stopped but the Client.

Every worker runs one thread (`nthreads=1`): a share is one asyncio loop, and two in one process would share
its GIL. `shared_client` keeps one cluster open per spec for the life of the process (a campaign's cells
reuse it: a SLURM job's start takes seconds to minutes); `close_clusters` tears them down, and runs at exit.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from distributed import Client, LocalCluster

from experiments.spec import (
    AddressLoadCluster,
    LoadCluster,
    LocalLoadCluster,
    SlurmLoadCluster,
    SSHLoadCluster,
)
from specgauge.errors import InputError
from specgauge.settings import get_settings
from tasks.launch.config import SSHConfig

log = logging.getLogger("specgauge.dask")

SSH_KEY_ENV = "SPECGAUGE_DASK_SSH_KEY"  # a private key file for `ssh` clusters that name no key
JOB_NAME = "specgauge-load"  # the SLURM jobs' name (squeue shows it)
_JOB_ALIVE = frozenset({"PENDING", "CONFIGURING", "RUNNING", "COMPLETING"})


def _quiet() -> dict[str, Any]:
    # No dashboards: nothing here reads them, and 8787 is often taken on a shared machine.
    return {"dashboard_address": None}


def expected_workers(spec: LoadCluster) -> int | None:
    """Dask workers the spec starts (None: an existing scheduler's, whatever it has)."""
    if isinstance(spec, LocalLoadCluster):
        return spec.workers_per_host
    if isinstance(spec, SlurmLoadCluster):
        return spec.hosts * spec.workers_per_host
    if isinstance(spec, SSHLoadCluster):
        return len(spec.hosts) * spec.workers_per_host
    return None


def _local(spec: LocalLoadCluster) -> Any:
    return LocalCluster(
        n_workers=spec.workers_per_host,
        threads_per_worker=1,
        processes=True,
        host="127.0.0.1",
        worker_dashboard_address=None,
        **_quiet(),
    )


def _jobqueue() -> Any:
    """dask_jobqueue, imported without its side effect: its runner module sets SIGINT to sys.exit when it is
    imported, which fails outside the main thread (a cell opens its cluster from a worker thread) and would
    change Ctrl-C for the whole process. signal.signal is a no-op for the import's duration."""
    if "dask_jobqueue" in sys.modules:
        return sys.modules["dask_jobqueue"]
    with _lock:
        real = signal.signal
        signal.signal = lambda *_args, **_kwargs: None  # type: ignore[assignment]
        try:
            import dask_jobqueue
        finally:
            signal.signal = real
    return dask_jobqueue


def _slurm(spec: SlurmLoadCluster, log_directory: Path | None) -> Any:
    if shutil.which("sbatch") is None:
        raise InputError(
            "load.cluster.kind slurm: sbatch is not on this machine's PATH; run the flow on the cluster's "
            "login node (submitting load jobs over SSH is not built)"
        )
    if log_directory is None:  # else sbatch writes slurm-<job>.out into whatever folder the flow runs in
        log_directory = get_settings().home / "logs" / "dask-slurm"
    log_directory.mkdir(parents=True, exist_ok=True)
    cluster = _jobqueue().SLURMCluster(
        queue=spec.partition,
        account=spec.account,
        cores=spec.workers_per_host,  # Dask's threads per job: one per worker process
        processes=spec.workers_per_host,
        job_cpu=spec.cores,
        memory=spec.memory,
        walltime=spec.walltime,
        job_name=JOB_NAME,
        job_extra_directives=list(spec.job_extra),
        python=spec.python or sys.executable,
        log_directory=str(log_directory),
        scheduler_options=_quiet(),
    )
    cluster.scale(jobs=spec.hosts)
    return cluster


def _close_slurm(cluster: Any, wait_s: float = 60.0) -> None:
    """Close a SLURMCluster (scancel of its jobs), then wait until squeue no longer shows them running or
    completing: the teardown ends when the jobs have, not when their cancellation was asked for."""
    job_ids = [str(job.job_id) for job in cluster.workers.values() if getattr(job, "job_id", None)]
    cluster.close()
    deadline = time.monotonic() + wait_s
    while job_ids and time.monotonic() < deadline:
        listed = subprocess.run(
            ["squeue", "-h", "-j", ",".join(job_ids), "-o", "%T"], capture_output=True, text=True, check=False
        )
        states = listed.stdout.split()
        if listed.returncode == 0 and not any(s in _JOB_ALIVE for s in states):
            return
        time.sleep(0.5)
    if job_ids:
        log.warning("load cluster: SLURM jobs %s still listed %g s after scancel", ",".join(job_ids), wait_s)


def _ssh_connect_options(spec: SSHLoadCluster, ssh: SSHConfig | None) -> dict[str, Any]:
    """asyncssh.connect's options from the block's SSHConfig, else from the spec and the environment."""
    if ssh is None and spec.ssh is not None:
        raise InputError(
            f"load.cluster.ssh: ClusterSSHBlock {spec.ssh!r} was not read; the caller resolves it into an "
            "SSHConfig (open_cluster(..., ssh=...)), or give load.cluster.key_path"
        )
    if ssh is not None:
        if ssh.private_key is not None:
            import asyncssh

            passphrase = ssh.passphrase.get_secret_value() if ssh.passphrase else None
            keys: list[Any] = [asyncssh.import_private_key(ssh.private_key.get_secret_value(), passphrase)]
        else:
            keys = [str(ssh.key_path)]
        options: dict[str, Any] = {"username": ssh.user, "port": ssh.port, "client_keys": keys}
        options["known_hosts"] = None if ssh.host_key_policy == "insecure" else str(ssh.known_hosts_path)
        if ssh.passphrase is not None and ssh.private_key is None:
            options["passphrase"] = ssh.passphrase.get_secret_value()
        return options
    key = spec.key_path or os.environ.get(SSH_KEY_ENV)
    if not key:
        raise InputError(
            f"load.cluster.key_path: an ssh cluster needs a key: give key_path, a ClusterSSHBlock (ssh) or "
            f"{SSH_KEY_ENV}"
        )
    if not Path(key).expanduser().is_file():
        raise InputError(f"load.cluster.key_path: no key file at {key}")
    known = Path(spec.known_hosts or Path.home() / ".ssh" / "known_hosts").expanduser()
    return {
        "username": spec.user or os.environ.get("USER") or "root",
        "port": spec.port,
        "client_keys": [str(Path(key).expanduser())],
        "known_hosts": str(known),
    }


def _ssh(spec: SSHLoadCluster, ssh: SSHConfig | None) -> Any:
    from distributed import SSHCluster

    options = _ssh_connect_options(spec, ssh)
    scheduler = spec.scheduler_host or spec.hosts[0]
    return SSHCluster(
        hosts=[scheduler, *spec.hosts],
        connect_options=options,
        worker_options={"nthreads": 1, "n_workers": spec.workers_per_host, "dashboard_address": None},
        scheduler_options={"port": 0, **_quiet()},
        remote_python=spec.python or sys.executable,
    )


@contextlib.contextmanager
def open_cluster(
    spec: LoadCluster, *, ssh: SSHConfig | None = None, log_directory: Path | None = None
) -> Iterator[Client]:
    """Start the cluster `spec` asks for, yield a Client once its workers have joined, and tear it all
    down on the way out, on an error or a cancellation too (a SLURM cluster's jobs are cancelled).
    `ssh` is the ClusterSSHBlock's settings for an `ssh` cluster; `log_directory` keeps SLURM jobs' logs."""
    with contextlib.ExitStack() as stack:
        # closed by callbacks, not entered as context managers: a shared cluster is opened in one thread
        # and may be closed in another, where a Client's context token could not be reset
        if isinstance(spec, AddressLoadCluster):
            target: Any = spec.address
        else:
            if isinstance(spec, LocalLoadCluster):
                target = _local(spec)
            elif isinstance(spec, SlurmLoadCluster):
                target = _slurm(spec, log_directory)
            else:
                target = _ssh(spec, ssh)
            stack.callback(_close_slurm if isinstance(spec, SlurmLoadCluster) else type(target).close, target)
        # not the process's default client: every call names this one
        client = Client(target, timeout=f"{spec.start_timeout_s}s", set_as_default=False)
        stack.callback(client.close)
        wanted = expected_workers(spec)
        try:
            client.wait_for_workers(wanted or 1, timeout=spec.start_timeout_s)
        except TimeoutError:
            joined = len(client.scheduler_info()["workers"])
            raise TimeoutError(
                f"load.cluster ({spec.kind}): {joined} of {wanted or 1} Dask workers joined within "
                f"{spec.start_timeout_s:g} s (load.cluster.start_timeout_s)"
            ) from None
        log.info("load cluster %s: %d Dask workers", spec.kind, len(client.scheduler_info()["workers"]))
        yield client


# -- one cluster per spec for the life of the process --------------------------------------------------------
_open: dict[str, tuple[contextlib.ExitStack, Client]] = {}
_lock = threading.RLock()  # held by shared_client while it opens a cluster (which may import dask_jobqueue)
_at_exit: list[bool] = []  # close_clusters registered with atexit (once)


def shared_client(spec: LoadCluster, *, ssh: SSHConfig | None = None) -> Client:
    """The Client of the cluster `spec` asks for, started on first use and kept open for the next cells
    (a campaign's cells share it); started again if it was lost. `close_clusters` (also at exit) ends it."""
    key = spec.model_dump_json()
    with _lock:
        if key in _open:
            stack, client = _open[key]
            if client.status == "running" and client.scheduler_info()["workers"]:
                return client
            del _open[key]
            with contextlib.suppress(Exception):
                stack.close()
        stack = contextlib.ExitStack()
        client = stack.enter_context(open_cluster(spec, ssh=ssh))
        if not _at_exit:
            atexit.register(close_clusters)
            _at_exit.append(True)
        _open[key] = (stack, client)
        return client


def close_clusters() -> None:
    """Tear down every cluster `shared_client` started (SLURM jobs cancelled, worker processes ended)."""
    with _lock:
        while _open:
            _, (stack, _client) = _open.popitem()
            try:
                stack.close()
            except Exception:  # one cluster's teardown failing must not keep the others running
                log.exception("a load cluster's teardown failed")
