"""The SLURM launcher: one batch job per deployment, submitted with sbatch over SSH (or on the login node).

launch: render tasks/launch/templates/vllm.sbatch (slurm_script.py), create the run directory, `sbatch
--parsable` (slurm_jobs.py), write the job id into the ledger at once, then wait for the job to run, find its
node and address from the line the script prints, and expose the engine (cluster.py, shared with `sml`).
log tail: the job's log over SFTP, with `scontrol`'s state and reason. teardown: `scancel`, wait, copy the
log home.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

from experiments.spec import SlurmLaunchSpec, TargetSpec, Variant
from specgauge.errors import InputError
from specgauge.redact import redact_text
from tasks.launch.base import Deployment, tail
from tasks.launch.cluster import ClusterJobLauncher, stage_environment
from tasks.launch.command import hot_swap_env, served_name, vllm_args
from tasks.launch.config import SAFE_NAME, ClusterConfig
from tasks.launch.engine_side import EXTENSION_FILE
from tasks.launch.registry import register
from tasks.launch.slurm_jobs import JobState, submit
from tasks.launch.slurm_script import JOB_PORT, render_prefix, render_script, with_layout_gpus
from tasks.launch.ssh import Shell, quote

# What the batch script prints on the node before it starts the engine (templates/vllm.sbatch).
_NODE_LINE = re.compile(r"^specgauge: job=(\d+) node=(\S+) ip=(\S*) port=(\d+)", re.MULTILINE)


def node_address(shell: Shell, log_text: str, job_id: str, node: str | None) -> str | None:
    """The engine's address as the login node should dial it: the IP the job printed, unless that is a
    loopback address (Debian maps the host name to 127.0.1.1); then the node's NodeAddr or name."""
    found = [m for m in _NODE_LINE.finditer(log_text) if m.group(1) == job_id]
    if found:
        ip = found[-1].group(3)
        if ip and not ip.startswith("127."):
            return ip
        node = node or found[-1].group(2)
    if not node:
        return None
    result = shell.run(f"scontrol show node -o {quote(node)}", 30, idempotent=True)
    match = re.search(r"NodeAddr=(\S+)", result.stdout) if result.rc == 0 else None
    return match.group(1) if match else node


def engine_command(cluster: ClusterConfig, target: TargetSpec, variant: Variant) -> list[str]:
    """The engine's command line in the job: the cluster's engine command and vLLM's arguments."""
    args = vllm_args(
        target,
        variant,
        served_model_name=served_name(target, variant),
        host="0.0.0.0",
        port=cluster.port or JOB_PORT,
    )
    return [*shlex.split(cluster.engine_command), *args]


def job_name_of(deployment_id: str) -> str:
    return f"specgauge-{deployment_id}"


def job_script(
    cluster: ClusterConfig,
    target: TargetSpec,
    variant: Variant,
    *,
    deployment_id: str,
    run_dir: str,
    launch_prefix: str = "",
    swap_env: dict[str, str] | None = None,
    node: str | None = None,
) -> str:
    """The batch script of one deployment (pure: the launcher stages and submits it; tasks.promote writes it
    for a team to deploy)."""
    return render_script(
        deployment_id=deployment_id,
        job_name=job_name_of(deployment_id),
        run_dir=run_dir,
        cluster=with_layout_gpus(cluster, target),
        engine_command=engine_command(cluster, target, variant),
        env={"PYTHONUNBUFFERED": "1", **cluster.env, **target.env, **(swap_env or {})},
        launch_prefix=launch_prefix,
        node=node,
    )


@register
class SlurmLauncher(ClusterJobLauncher):
    """Launch each deployment as a SLURM batch job."""

    kind = "slurm"
    spec_class = SlurmLaunchSpec

    def engine_command(self, target: TargetSpec, variant: Variant) -> list[str]:
        return engine_command(self.cluster, target, variant)

    def launch(
        self, target: TargetSpec, variant: Variant, *, deployment_id: str, directory: Path
    ) -> Deployment:
        if not SAFE_NAME.fullmatch(deployment_id):
            raise InputError(f"deployment id {deployment_id!r} is not safe for job names and paths")
        root, run_dir = self._new_run_dir(deployment_id, directory)
        shell = self.shell

        extra: dict[str, Any] = {"cluster": self.cluster.name, "run_dir": run_dir}
        mounts = self._stage_overlay(root, extra)
        environment = None
        if self.cluster.environment_toml:
            # Mounts go into the TOML unless the prefix takes them itself (pyxis --container-mounts).
            toml_mounts = [] if "{mounts}" in self.cluster.container_prefix else mounts
            environment, _ = stage_environment(
                shell,
                self.cluster.environment_toml,
                arch=self.cluster.arch,
                remote_root=root,
                mounts=toml_mounts,
            )
            extra["environment_toml"] = environment
            if toml_mounts:
                mounts = []
        if mounts and "{mounts}" not in self.cluster.container_prefix:
            raise InputError(
                "an overlay needs a container: set container_prefix with {mounts} (or an environment_toml)"
            )
        prefix = render_prefix(self.cluster.container_prefix, mounts=mounts, environment=environment)
        command = self.engine_command(target, variant)
        swap_env: dict[str, str] = {}
        if variant.hot_swap:  # the worker extension beside the job, on the engine's path (docs/cluster.md)
            shell.put(EXTENSION_FILE, f"{run_dir}/{EXTENSION_FILE.name}")
            pythonpath = {**self.cluster.env, **target.env}.get("PYTHONPATH")
            swap_env = {
                **hot_swap_env(variant),
                "PYTHONPATH": ":".join(p for p in (run_dir, pythonpath) if p),
            }
        job_name = job_name_of(deployment_id)
        script = job_script(
            self.cluster,
            target,
            variant,
            deployment_id=deployment_id,
            run_dir=run_dir,
            launch_prefix=prefix,
            swap_env=swap_env,
            node=self.node,
        )
        script_path = f"{run_dir}/job.sbatch"
        shell.write_text(script_path, script, mode=0o755)
        (directory / "job.sbatch").write_text(redact_text(script))  # the cluster's copy keeps the secrets

        job_id = submit(shell, script_path, cwd=run_dir)
        self._record(deployment_id, job_id, job_name=job_name, run_dir=run_dir, directory=str(directory))
        return self._follow(
            deployment_id=deployment_id,
            directory=directory,
            variant=variant,
            served_model_name=served_name(target, variant),
            command=command,
            job_id=job_id,
            extra={**extra, "remote_log": f"{run_dir}/log-{job_id}.out", "script": script_path},
        )

    def _engine_address(self, deployment: Deployment, state: JobState) -> str | None:
        assert deployment.job_id is not None
        text = self._read(deployment.extra["remote_log"])
        return (
            node_address(self.shell, text, deployment.job_id, state.node) if _NODE_LINE.search(text) else None
        )

    def _engine_port(self, deployment: Deployment) -> int:
        """The port the job printed: the cluster's, or the free one it took when the cluster's is 0."""
        assert deployment.job_id is not None
        found = [
            m
            for m in _NODE_LINE.finditer(self._read(deployment.extra["remote_log"]))
            if m.group(1) == deployment.job_id
        ]
        return int(found[-1].group(4)) if found else self.cluster.port

    def log_tail(self, deployment: Deployment, lines: int = 60) -> str:
        if deployment.log_path is not None and deployment.log_path.exists():
            return tail(deployment.log_path, lines)
        remote = deployment.extra.get("remote_log")
        header = self._end_line(deployment)
        body = self._remote_tail(remote, lines) if remote else ""
        return "\n".join(part for part in (header, body) if part)
