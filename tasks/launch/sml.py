"""The `sml` launcher: deployments through `sml advanced` (swiss-ai/model-launch) on the login node.

`sml` renders a batch script and submits it with sbatch; it has no status, cancel or logs commands, so this
launcher reads its output (`Job submitted:`, `Served model name:`), its job log
(`~/.sml/logs/<id>/log.out`: `Replica <r> head IP: <ip>`), and uses squeue/scancel like the SLURM
launcher. Two flag generations exist (docs/cluster.md); the cluster's setting says which one to speak, the
environment TOML is checked against it before submitting, and the generation is recorded in provenance.
"""

from __future__ import annotations

import posixpath
import re
import threading
import time
import tomllib
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from experiments.spec import SmlLaunchSpec, TargetSpec, Variant
from specgauge.argv import without_options
from specgauge.errors import InputError, LaunchError
from specgauge.redact import redact_text
from tasks.launch.base import Deployment
from tasks.launch.cluster import ClusterJobLauncher, stage_environment
from tasks.launch.command import vllm_args
from tasks.launch.config import ClusterConfig
from tasks.launch.registry import register
from tasks.launch.slurm_jobs import JobState, job_state
from tasks.launch.ssh import SSHError, quote

Generation = Literal["legacy", "current"]
# Flag spellings per generation (model-launch renamed them, and a container mount, in one change).
FLAGS: dict[str, dict[str, str]] = {
    "legacy": {
        "system": "--firecrest-system",
        "framework": "--serving-framework",
        "environment": "--slurm-environment",
        "replicas": "--slurm-replicas",
        "nodes_per_replica": "--slurm-nodes-per-replica",
    },
    "current": {
        "system": "--system",
        "framework": "--framework",
        "environment": "--environment",
        "replicas": "--replicas",
        "nodes_per_replica": "--nodes-per-replica",
    },
}
# The container path each generation's job scripts expect its mesh binaries at.
CONTAINER_MOUNT = {"legacy": "/ocfbin", "current": "/opentelabin"}
SML_PORT = 8080
_SUBMITTED = re.compile(r"^Job submitted:\s*(\d+)", re.MULTILINE)
_SERVED = re.compile(r"^Served model name:\s*(\S+)", re.MULTILINE)
_LOGS = re.compile(r"^Logs:\s*(\S+)", re.MULTILINE)
_HEAD_IP = re.compile(r"^Replica (\d+) head IP:\s*(\S+)", re.MULTILINE)
_SEGMENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
# Options that sml sets itself from its own flags (or injects, like --port 8080).
_OWNED_BY_SML = ("--served-model-name", "--port")


def check_generation(toml_text: str, source: str, generation: Generation) -> None:
    """Refuse an environment TOML written for the other sml generation: that pair submits fine and dies on
    the node. The message names the file, line and mount."""
    try:
        data = tomllib.loads(toml_text)
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"{source}: invalid TOML: {exc}") from None
    other: Generation = "legacy" if generation == "current" else "current"
    wanted, foreign = CONTAINER_MOUNT[generation], CONTAINER_MOUNT[other]
    targets = {str(m).split(":")[1] if ":" in str(m) else str(m) for m in data.get("mounts", [])}
    if foreign in targets and wanted not in targets:
        line = next(
            (
                i
                for i, text in enumerate(toml_text.splitlines(), 1)
                if f":{foreign}" in text or f'"{foreign}' in text
            ),
            0,
        )
        raise InputError(
            f"{source}:{line}: mounts: mounts {foreign}, which {other} sml builds use, but this cluster's sml "
            f"speaks the {generation} flags (sml_flags={generation}) and its jobs expect {wanted}: the job "
            f"would submit and then die on the node. Use a {generation} environment TOML, or set sml_flags "
            f"to {other} if the cluster's sml is that old/new."
        )


_last_stamp_ms = 0
_stamp_lock = threading.Lock()


def _unique_stamp() -> str:
    """UTC to the millisecond, strictly increasing within this process (two launches never share one)."""
    global _last_stamp_ms
    with _stamp_lock:
        ms = max(int(time.time() * 1000), _last_stamp_ms + 1)
        _last_stamp_ms = ms
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y%m%dT%H%M%S") + f"{ms % 1000:03d}Z"


def unique_served_name(
    user: str, org: str, target: TargetSpec, variant: Variant, stamp: str | None = None
) -> str:
    """`user/org/<model>-<variant>-<UTC stamp>`: three segments (the gateway routes only those), and unique
    per launch (two launches by one user under one name would be load-balanced together)."""
    base = target.served_model_name or target.model.rstrip("/").split("/")[-1]
    stamp = stamp or _unique_stamp()
    name = f"{base}-{variant.name}-{stamp}"
    for label, segment in (("user", user), ("org", org), ("name", name)):
        if not _SEGMENT.fullmatch(segment):
            raise InputError(f"served name {label} segment {segment!r}: only letters, digits, '.', '_', '-'")
    return f"{user}/{org}/{name}"


def framework_args(target: TargetSpec, variant: Variant) -> list[str]:
    """vLLM's arguments as sml forwards them: without the options sml sets itself."""
    args = vllm_args(target, variant, served_model_name="-", host="0.0.0.0", port=SML_PORT)
    return without_options(args, _OWNED_BY_SML)


def sml_command(
    cluster: ClusterConfig,
    *,
    environment: str,
    args: list[str],
    served: str,
    generation: Generation,
) -> list[str]:
    """`sml advanced ...` in the given flag generation (a list of words, not yet quoted)."""
    flags = FLAGS[generation]
    words = [cluster.sml_path, "advanced"]
    if cluster.sml_system:
        words += [flags["system"], cluster.sml_system]
    if cluster.partition:
        words += ["--partition", cluster.partition]
    if cluster.account:
        words += ["--account", cluster.account]
    words += [
        flags["framework"],
        "vllm",
        flags["environment"],
        environment,
        "--framework-args",
        " ".join(quote(a) for a in args),
        flags["replicas"],
        "1",
        flags["nodes_per_replica"],
        str(cluster.nodes_per_replica),
        "--time",
        cluster.time_limit,
        "--served-model-name",
        served,
        "--no-tui",
    ]
    return words


def parse_submission(stdout: str) -> tuple[str, str | None, str | None]:
    """(job id, served model name, log dir) from sml's non-interactive output."""
    job = _SUBMITTED.search(stdout)
    if not job:
        raise LaunchError(f"sml printed no 'Job submitted: <id>' line; it printed:\n{stdout[-2000:]}")
    served = _SERVED.search(stdout)
    logs = _LOGS.search(stdout)
    return job.group(1), served.group(1) if served else None, logs.group(1) if logs else None


def head_ip(log_text: str, replica: int = 0) -> str | None:
    found = [m.group(2) for m in _HEAD_IP.finditer(log_text) if int(m.group(1)) == replica]
    return found[-1] if found else None


@register
class SmlLauncher(ClusterJobLauncher):
    """Launch through `sml advanced`; status and cancel through squeue/scancel (sml has neither)."""

    kind = "sml"
    spec_class = SmlLaunchSpec
    job_label = "sml job"
    engine_label = "replica"
    address_key = "head_ip"
    facts_log_key = "engine_log"  # the engine's own output; log.out is sml's

    @property
    def generation(self) -> Generation:
        return self.cluster.sml_flags

    def _env_prefix(self) -> str:
        words = [f"{k}={quote(v)}" for k, v in sorted(self.cluster.sml_env.items())]
        return f"env {' '.join(words)} " if words else ""

    def sml_home(self) -> str:
        """Where sml writes ~/.sml (its HOME may be overridden in sml_env)."""
        if "HOME" in self.cluster.sml_env:
            return self.cluster.sml_env["HOME"]
        return self.shell.expand("~")

    def _expand_log_dir(self, logs: str | None, job_id: str) -> str:
        home = self.sml_home()
        if not logs:
            return f"{home}/.sml/logs/{job_id}"
        if logs.startswith("~/"):
            return posixpath.join(home, logs[2:])
        return logs

    def launch(
        self, target: TargetSpec, variant: Variant, *, deployment_id: str, directory: Path
    ) -> Deployment:
        if not self.cluster.environment_toml:
            raise InputError("the sml launcher needs environment_toml (in the cluster block or the spec)")
        if variant.hot_swap:  # sml takes vLLM's arguments only: no worker extension file, no dev mode
            raise InputError(
                f"variant {variant.name!r}: hot_swap needs the slurm or local launcher (docs/cluster.md)"
            )
        root, run_dir = self._new_run_dir(deployment_id, directory)
        shell = self.shell

        source = str(Path(self.cluster.environment_toml).expanduser())
        try:
            text = Path(source).read_text()
        except OSError as exc:
            raise InputError(f"environment TOML {source}: cannot read: {exc.strerror or exc}") from None
        check_generation(text, source, self.generation)

        extra: dict[str, Any] = {
            "cluster": self.cluster.name,
            "run_dir": run_dir,
            "sml_flags": self.generation,
        }
        mounts = self._stage_overlay(root, extra)
        environment, _ = stage_environment(
            shell, source, arch=self.cluster.arch, remote_root=root, mounts=mounts
        )
        user = shell.run("id -un", 30, idempotent=True).check("id -un").stdout.strip()
        served = unique_served_name(user, self.cluster.served_org, target, variant)
        args = framework_args(target, variant)
        words = sml_command(
            self.cluster, environment=environment, args=args, served=served, generation=self.generation
        )
        command = f"cd {quote(run_dir)} && {self._env_prefix()}{' '.join(quote(w) for w in words)}"
        (directory / "sml-command.txt").write_text(redact_text(" ".join(quote(w) for w in words)) + "\n")

        result = shell.run(command, 300)
        if result.rc != 0:
            hint = ""
            output = result.stderr + result.stdout
            if result.rc == 2 and ("unrecognized arguments" in output or "arguments are required" in output):
                hint = (
                    f"\nThe cluster's sml does not know the {self.generation} flags: set sml_flags to "
                    f"{'legacy' if self.generation == 'current' else 'current'} if its sml is of that generation."
                )
            raise LaunchError(
                f"sml advanced failed (exit {result.rc}): {(result.stderr or result.stdout).strip()[-2000:]}{hint}"
            )
        job_id, printed_name, logs = parse_submission(result.stdout)
        log_dir = self._expand_log_dir(logs, job_id)
        self._record(deployment_id, job_id)  # before anything else
        try:  # the name sml gave the job: the reaper cancels only a job still of that name
            job_name = job_state(shell, job_id).name
        except SSHError:
            job_name = None
        self._record(
            deployment_id,
            job_id,
            job_name=job_name,
            run_dir=run_dir,
            log_dir=log_dir,
            directory=str(directory),
            sml_flags=self.generation,
        )
        return self._follow(
            deployment_id=deployment_id,
            directory=directory,
            variant=variant,
            served_model_name=printed_name or served,
            command=words,
            job_id=job_id,
            extra={
                **extra,
                "environment_toml": environment,
                "log_dir": log_dir,
                "remote_log": f"{log_dir}/log.out",
                "engine_log": f"{log_dir}/replica_0.out",
            },
        )

    def _engine_address(self, deployment: Deployment, state: JobState) -> str | None:
        return head_ip(self._read(deployment.extra["remote_log"]))

    def _died_tail(self, deployment: Deployment) -> str:
        return self.log_tail(deployment)

    def log_tail(self, deployment: Deployment, lines: int = 60) -> str:
        """The job's state line, the tail of sml's log.out and of the engine's replica_0.out."""
        parts = [end] if (end := self._end_line(deployment)) else []
        for key in ("remote_log", "engine_log"):
            path = deployment.extra.get(key)
            if path:
                body = self._remote_tail(path, lines)
                if body:
                    parts.append(f"--- {posixpath.basename(path)} ---\n{body}")
        return "\n".join(parts)

    def place_on(self, node: str | None) -> None:
        """sml has no flag that pins a node: the job goes where sml puts it. The node each deployment ran on
        is still recorded, and the analysis flags a repeat block that spans nodes."""
        if node is not None and node != self.node:
            self.log.warning("sml cannot pin a node: the next deployment may not run on %s", node)
        self.node = node

    def teardown(self, deployment: Deployment) -> None:
        """scancel (as the SLURM launcher), keeping copies of sml's log.out and the engine's replica_0.out."""
        if deployment.log_path is None:
            for key, name in (("remote_log", "sml-log.out"), ("engine_log", "replica_0.out")):
                path = deployment.extra.get(key)
                if not path:
                    continue
                try:
                    self.shell.get(path, deployment.directory / name)
                    if key == "engine_log":
                        deployment.log_path = deployment.directory / name
                except (FileNotFoundError, SSHError, OSError):
                    pass
        super().teardown(deployment)
