"""The torch worker's ops (tasks/drafters/head_worker.py) as SLURM batch jobs, for targets that live on a
cluster: the same request the local run pipes into the worker is written to the cluster's shared work
directory, `sbatch` runs `python head_worker.py < request.json > answer.json` on a node, and the answer
is read back when the job ends. Submitted, polled and cancelled with tasks/launch/slurm_jobs through the
login-node shell the SLURM launcher uses (SSH, or local on the login node).

`sml` (swiss-ai/model-launch) renders serving jobs only (`--framework vllm`), so a training job goes
through plain `sbatch` on the same cluster, with the cluster block's partition, account, time limit, GPUs
and setup lines. The paths in the request (target, parent, states, the head's output folder) must be on a
filesystem the node sees: SPECGAUGE_HOME and the models on the cluster's shared filesystem, as for the
launchers' overlays.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from typing import Any

from specgauge.errors import LaunchError
from tasks.launch.config import ClusterConfig
from tasks.launch.slurm_jobs import cancel_job, describe_end, job_state, submit
from tasks.launch.ssh import Shell, quote

Runner = Callable[[dict[str, Any]], dict[str, Any]]


def job_script(cluster: ClusterConfig, *, python: str, worker: str, workdir: str, name: str) -> str:
    """The batch script: the cluster's #SBATCH settings, its setup lines, then the worker on the request."""
    lines = ["#!/bin/bash", f"#SBATCH --job-name={name}", f"#SBATCH --output={workdir}/job.out"]
    lines.append(f"#SBATCH --time={cluster.time_limit}")
    for option, value in (
        ("partition", cluster.partition),
        ("account", cluster.account),
        ("cpus-per-task", cluster.cpus_per_task),
        ("mem", cluster.memory),
    ):
        if value:
            lines.append(f"#SBATCH --{option}={value}")
    if cluster.gpus_per_node:
        lines.append(f"#SBATCH --gpus-per-node={cluster.gpus_per_node}")
    lines += [f"#SBATCH {option}" for option in cluster.extra_sbatch]
    lines.append("set -euo pipefail")
    lines += [f"export {key}={quote(value)}" for key, value in sorted(cluster.env.items())]
    lines += list(cluster.setup)
    lines.append(
        f"{quote(python)} {quote(worker)} < {quote(workdir + '/request.json')} > {quote(workdir + '/answer.tmp')}"
    )
    lines.append(f"mv {quote(workdir + '/answer.tmp')} {quote(workdir + '/answer.json')}")
    return "\n".join(lines) + "\n"


def run_job(
    shell: Shell,
    cluster: ClusterConfig,
    request: dict[str, Any],
    *,
    python: str,
    worker: str,
    timeout_s: float = 6 * 3600.0,
) -> dict[str, Any]:
    """One worker op as a SLURM job; its answer, or LaunchError naming the job, its end and its log."""
    workdir = f"{cluster.remote_dir.rstrip('/')}/drafter-jobs/{request['op']}-{uuid.uuid4().hex[:10]}"
    shell.run(f"mkdir -p {quote(workdir)}", 30).check("mkdir")
    shell.write_text(f"{workdir}/request.json", json.dumps(request))
    name = f"specgauge-{request['op']}"
    shell.write_text(
        f"{workdir}/job.sbatch", job_script(cluster, python=python, worker=worker, workdir=workdir, name=name)
    )
    job = submit(shell, f"{workdir}/job.sbatch", cwd=workdir)
    deadline = time.monotonic() + timeout_s
    try:
        while job_state(shell, job).alive:
            if time.monotonic() > deadline:
                raise LaunchError(f"training job {job} ({workdir}) still running after {timeout_s:g} s")
            time.sleep(cluster.poll_s)
    except BaseException:
        cancel_job(shell, job)  # a failed or cancelled flow leaves no job behind
        raise
    answer = shell.run(f"cat {quote(workdir + '/answer.json')}", 60, idempotent=True)
    if answer.rc != 0:
        log = shell.run(f"tail -n 40 {quote(workdir + '/job.out')}", 30, idempotent=True).stdout
        raise LaunchError(f"training job {job} ({workdir}) gave no answer: {describe_end(shell, job)}\n{log}")
    return json.loads(answer.stdout)


def slurm_runner(shell: Shell, cluster: ClusterConfig, *, python: str, worker: str) -> Runner:
    """A runner for tasks.drafters.training: each worker op as one job on the cluster."""

    def run(request: dict[str, Any]) -> dict[str, Any]:
        return run_job(shell, cluster, request, python=python, worker=worker)

    return run
