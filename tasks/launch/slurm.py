"""The SLURM launcher: one batch job per deployment, submitted over SSH (or on the login node itself).

launch: render tasks/launch/templates/vllm.sbatch, create the run directory (Slurm 22.05 does not create
log directories: a missing one fails the job), `sbatch --parsable`, write the job id into the ledger at
once, wait for the job to run, find its node and address, and expose the engine (through an SSH tunnel
when the client is outside the cluster). alive: `squeue` (not `sacct`, which needs a database). log tail:
the job's log over SFTP, with `scontrol`'s state and reason. teardown: `scancel`, wait, copy the log home.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import shlex
import string
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from experiments.spec import SlurmLauncher as SlurmLauncherSpec
from experiments.spec import SmlLauncher as SmlLauncherSpec
from experiments.spec import TargetSpec, Variant
from specgauge.errors import EngineDied, InputError, LaunchError
from specgauge.provenance import utc_now, utc_stamp
from tasks.launch import ledger
from tasks.launch.base import Deployment, startup_facts, tail
from tasks.launch.command import ENGINE_MODULE, served_name, vllm_args
from tasks.launch.overlay import Overlay, load_overlay
from tasks.launch.ssh import Endpoint, LocalShell, Shell, SSHConfig, SSHError, SSHSession, quote

log = logging.getLogger("specgauge.slurm")

TEMPLATE = Path(__file__).parent / "templates" / "vllm.sbatch"
ALIVE_STATES = frozenset({"PENDING", "CONFIGURING", "RUNNING"})
GONE = "GONE"  # slurmctld no longer knows the job (it ended more than MinJobAge ago)
_JOB_ID = re.compile(r"^(\d+)(?:;\S+)?$")
_SAFE_PATH = re.compile(r"^[A-Za-z0-9._/~+@=-]+$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_SBATCH_OPTION = re.compile(r"^--[a-z][a-z0-9-]*(=[A-Za-z0-9._:,/+@=%-]+)?$")
_TIME = re.compile(r"^(\d+-)?\d{1,3}(:\d{2}){0,2}$")
_MEMORY = re.compile(r"^\d+[KMGT]?$")
_NODE_LINE = re.compile(r"^specgauge: job=(\d+) node=(\S+) ip=(\S*) port=(\d+)", re.MULTILINE)
_PLACEHOLDERS = frozenset({"mounts", "environment"})


class ClusterConfig(BaseModel):
    """A cluster's launch settings: what `SlurmClusterBlock.to_config()` returns. The spec's launcher
    section overrides any field it sets (docs/cluster.md)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = "cluster"
    partition: str | None = None
    account: str | None = None
    time_limit: str = "01:00:00"
    gpus_per_node: int | None = Field(default=None, gt=0)
    cpus_per_task: int | None = Field(default=None, gt=0)
    memory: str | None = None
    extra_sbatch: tuple[str, ...] = Field(default=(), description="More #SBATCH options, e.g. --exclusive.")
    remote_dir: str = Field(default="specgauge", description="Work dir on a shared filesystem (~ = home).")
    engine_command: str = Field(
        default=f"python -m {ENGINE_MODULE}", description="Engine command on the node."
    )
    container_prefix: str = Field(
        default="", description="Prefix entering the container; {mounts}, {environment}."
    )
    environment_toml: str | None = Field(
        default=None, description="Local path of a container environment TOML."
    )
    arch: str = Field(default="arm64", description="Replaces {arch} in the environment TOML (GH200: arm64).")
    setup: tuple[str, ...] = Field(default=(), description="Shell lines run in the job before the engine.")
    env: dict[str, str] = Field(default_factory=dict)
    port: int = Field(default=8080, gt=0, lt=65536)
    ssh_block: str | None = Field(
        default=None, description="ClusterSSHBlock name; none: run on the login node."
    )
    pending_timeout_s: float = Field(
        default=3600.0, gt=0, description="How long a job may wait in the queue."
    )
    poll_s: float = Field(default=2.0, gt=0)
    cancel_wait_s: float = Field(default=60.0, gt=0)
    # `sml` (swiss-ai/model-launch) settings, used by the sml launcher only.
    sml_path: str = "sml"
    sml_flags: Literal["legacy", "current"] = "current"
    sml_system: str | None = None
    sml_env: dict[str, str] = Field(default_factory=dict, description="Environment for the sml command.")
    served_org: str = "specgauge"
    nodes_per_replica: int = Field(default=1, gt=0)

    @field_validator("name", "partition", "account", "sml_system", "served_org", "arch")
    @classmethod
    def safe_name(cls, value: str | None) -> str | None:
        if value is not None and not _SAFE_NAME.fullmatch(value):
            raise ValueError(f"{value!r}: only letters, digits, '.', '_' and '-'")
        return value

    @field_validator("time_limit")
    @classmethod
    def slurm_time(cls, value: str) -> str:
        if not _TIME.fullmatch(value):
            raise ValueError(f"{value!r} is not a SLURM time ([D-]HH:MM:SS)")
        return value

    @field_validator("memory")
    @classmethod
    def slurm_memory(cls, value: str | None) -> str | None:
        if value is not None and not _MEMORY.fullmatch(value):
            raise ValueError(f"{value!r} is not a SLURM --mem value (e.g. 200G)")
        return value

    @field_validator("remote_dir", "sml_path")
    @classmethod
    def safe_path(cls, value: str) -> str:
        if not _SAFE_PATH.fullmatch(value):
            raise ValueError(f"{value!r}: paths may hold letters, digits and ._/~+@=- only")
        return value

    @field_validator("extra_sbatch")
    @classmethod
    def sbatch_options(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for option in value:
            if not _SBATCH_OPTION.fullmatch(option):
                raise ValueError(f"{option!r} is not an sbatch option of the form --name or --name=value")
        return value

    @field_validator("env", "sml_env")
    @classmethod
    def env_names(cls, value: dict[str, str]) -> dict[str, str]:
        for name in value:
            if not _ENV_NAME.fullmatch(name):
                raise ValueError(f"{name!r} is not an environment variable name")
        return value

    @field_validator("container_prefix")
    @classmethod
    def known_placeholders(cls, value: str) -> str:
        unknown = set(re.findall(r"\{(\w*)\}", value)) - _PLACEHOLDERS
        if unknown:
            raise ValueError(f"unknown placeholder(s) {sorted(unknown)}; known: {sorted(_PLACEHOLDERS)}")
        return value


# Spec fields that override the cluster block's, by name (both launchers).
_OVERRIDES = (
    "partition",
    "account",
    "time_limit",
    "gpus_per_node",
    "cpus_per_task",
    "memory",
    "engine_command",
    "container_prefix",
    "environment_toml",
    "remote_dir",
    "port",
    "sml_flags",
    "nodes_per_replica",
    "served_org",
)


def _load_block(kind: str, name: str) -> Any:
    """A saved Prefect block by name (only when a spec names one; tests pass configs directly)."""
    if kind == "ssh":
        from blocks.cluster_ssh import ClusterSSHBlock as block_class
    else:
        from blocks.slurm_cluster import SlurmClusterBlock as block_class  # type: ignore[assignment]
    try:
        return block_class.load(name)
    except (ValueError, RuntimeError) as exc:
        raise InputError(
            f"no {block_class.__name__} named {name!r} could be loaded ({exc}); create it (docs/cluster.md)"
        ) from None


def resolve_cluster(
    spec: SlurmLauncherSpec | SmlLauncherSpec, cluster: ClusterConfig | None = None
) -> ClusterConfig:
    """The cluster block's settings (or `cluster`), overridden by whatever the spec's section sets."""
    base = cluster or (_load_block("cluster", spec.cluster).to_config() if spec.cluster else ClusterConfig())
    updates = {k: getattr(spec, k) for k in _OVERRIDES if getattr(spec, k, None) is not None}
    data = {**base.model_dump(), **updates, "env": {**base.env, **spec.env}}
    try:
        return ClusterConfig.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(f"launcher.{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise InputError(f"cluster settings: {problems}") from None


def resolve_ssh(
    spec: SlurmLauncherSpec | SmlLauncherSpec, cluster: ClusterConfig, ssh: SSHConfig | None = None
) -> SSHConfig | None:
    if ssh is not None:
        return ssh
    name = spec.ssh or cluster.ssh_block
    return _load_block("ssh", name).to_config(name) if name else None


def open_shell(ssh: SSHConfig | None) -> Shell:
    if ssh is None:
        return LocalShell()
    session = SSHSession(ssh)
    session.connect()
    return session


def shell_from_ledger(entry: dict[str, Any]) -> Shell:
    """Reach the cluster of a ledger entry again (for reaping): by block name, key file, or locally."""
    remote = entry.get("remote")
    if not remote:
        return LocalShell()
    if remote.get("block"):
        return open_shell(_load_block("ssh", remote["block"]).to_config(remote["block"]))
    if remote.get("key_path"):
        facts = {k: v for k, v in remote.items() if v is not None and k != "block"}
        return open_shell(SSHConfig(**facts))
    raise LaunchError(
        f"cannot reach {remote.get('user')}@{remote.get('host')} again to stop job {entry.get('job_id')}: "
        "its key was given inline (use a ClusterSSHBlock or a key file)"
    )


@dataclass(frozen=True)
class JobState:
    job_id: str
    state: str  # a SLURM state (PENDING, RUNNING, FAILED, ...) or GONE
    node: str | None = None
    reason: str | None = None
    name: str | None = None

    @property
    def alive(self) -> bool:
        return self.state in ALIVE_STATES


def job_state(shell: Shell, job_id: str) -> JobState:
    """The job's state from squeue (all states, so that a just-ended job reads as ended, not missing)."""
    result = shell.run(f"squeue -h -t all -j {quote(job_id)} -o '%T|%N|%r|%j'", 30, idempotent=True)
    if result.rc == 0:
        line = result.stdout.strip().splitlines()[0] if result.stdout.strip() else ""
        if line:
            state, node, reason, name = [*line.split("|"), "", "", ""][:4]
            return JobState(job_id, state.strip(), node.strip() or None, reason.strip() or None, name.strip())
        return JobState(job_id, GONE)
    if "Invalid job id" in result.stderr:
        return JobState(job_id, GONE)
    raise SSHError(f"squeue for job {job_id} failed (exit {result.rc}): {result.stderr.strip()[:500]}")


def job_details(shell: Shell, job_id: str) -> dict[str, str]:
    """`scontrol show job -o` as a dict (empty when slurmctld no longer knows the job)."""
    result = shell.run(f"scontrol show job -o {quote(job_id)}", 30, idempotent=True)
    if result.rc != 0:
        return {}
    details = {}
    for token in result.stdout.split():
        key, sep, value = token.partition("=")
        if sep and key not in details:
            details[key] = value
    return details


def describe_end(shell: Shell, job_id: str) -> str:
    """One line on how a job ended, e.g. `job 42: FAILED (NonZeroExitCode), exit code 1:0, node vm`."""
    details = job_details(shell, job_id)
    if not details:
        return f"job {job_id}: no longer known to slurmctld"
    parts = [f"job {job_id}: {details.get('JobState', '?')}"]
    if details.get("Reason") and details["Reason"] != "None":
        parts[0] += f" ({details['Reason']})"
    if details.get("ExitCode"):
        parts.append(f"exit code {details['ExitCode']}")
    if details.get("NodeList") and details["NodeList"] != "(null)":
        parts.append(f"node {details['NodeList']}")
    return ", ".join(parts)


def cancel_job(shell: Shell, job_id: str, *, wait_s: float = 60.0, poll_s: float = 1.0) -> str:
    """scancel, then wait until the job has left the running/pending states. Returns what happened."""
    state = job_state(shell, job_id)
    if not state.alive:
        return f"job {job_id} already ended ({state.state})"
    cancelled = shell.run(f"scancel {quote(job_id)}", 30)
    if cancelled.rc != 0:
        state = job_state(shell, job_id)
        if not state.alive:  # it ended between the two calls
            return f"job {job_id} already ended ({state.state})"
        cancelled.check(f"scancel {job_id}")
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        state = job_state(shell, job_id)
        if not state.alive and state.state != "COMPLETING":
            return f"cancelled job {job_id} ({state.state})"
        time.sleep(poll_s)
    return f"scancel sent to job {job_id}; still {state.state} after {wait_s:g} s"


def submit(shell: Shell, script_path: str, *, cwd: str) -> str:
    """`sbatch --parsable`; returns the job id."""
    result = shell.run(f"cd {quote(cwd)} && sbatch --parsable {quote(script_path)}", 60)
    result.check("sbatch")
    line = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else ""
    match = _JOB_ID.match(line)
    if not match:
        raise LaunchError(f"sbatch printed no job id: {result.stdout.strip()!r} {result.stderr.strip()!r}")
    return match.group(1)


def render_prefix(template: str, *, mounts: list[str], environment: str | None) -> str:
    """Fill {mounts} (comma-separated) and {environment} into the container prefix; a word whose
    placeholder has no value is left out (so an unused `--container-mounts={mounts}` disappears)."""
    words = []
    for word in shlex.split(template):
        names = set(re.findall(r"\{(\w+)\}", word))
        if ("mounts" in names and not mounts) or ("environment" in names and not environment):
            continue
        words.append(word.format(mounts=",".join(mounts), environment=environment or ""))
    return " ".join(shlex.quote(w) for w in words)


def render_script(
    *,
    deployment_id: str,
    job_name: str,
    run_dir: str,
    cluster: ClusterConfig,
    engine_command: list[str],
    env: dict[str, str],
    launch_prefix: str = "",
) -> str:
    """The batch script from the template; every value that reaches the shell is validated or quoted."""
    if not _SAFE_PATH.fullmatch(run_dir):
        raise InputError(f"run directory {run_dir!r}: paths may hold letters, digits and ._/~+@=- only")
    options = []
    if cluster.partition:
        options.append(f"--partition={cluster.partition}")
    if cluster.account:
        options.append(f"--account={cluster.account}")
    options.append(f"--time={cluster.time_limit}")
    if cluster.gpus_per_node:
        options.append(f"--gpus-per-node={cluster.gpus_per_node}")
    if cluster.cpus_per_task:
        options.append(f"--cpus-per-task={cluster.cpus_per_task}")
    if cluster.memory:
        options.append(f"--mem={cluster.memory}")
    options.extend(cluster.extra_sbatch)
    for name in env:
        if not _ENV_NAME.fullmatch(name):
            raise InputError(f"environment variable name {name!r} is not valid")
    values = {
        "deployment_id": deployment_id,
        "job_name": job_name,
        "run_dir": run_dir,
        "run_dir_quoted": quote(run_dir),
        "sbatch_options": "\n".join(f"#SBATCH {o}" for o in options),
        "port": str(cluster.port),
        "setup": "\n".join(cluster.setup),
        "exports": "\n".join(f"export {k}={quote(v)}" for k, v in sorted(env.items())),
        "launch_prefix": f"{launch_prefix} " if launch_prefix else "",
        "engine_command": " ".join(quote(w) for w in engine_command),
    }
    return string.Template(TEMPLATE.read_text()).substitute(values)


def resolve_arch(text: str, arch: str) -> str:
    return text.replace("{arch}", arch)


def add_mounts(text: str, mounts: list[str], source: str) -> str:
    """Add container mounts to an environment TOML's `mounts` array (textually, keeping comments)."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"{source}: invalid TOML: {exc}") from None
    if not mounts:
        return text
    for mount in mounts:
        if any(c in mount for c in '"\\\n'):
            raise InputError(f"mount {mount!r} holds a quote, backslash or newline")
    entries = "".join(f'  "{m}",\n' for m in mounts)
    found = re.search(r"^mounts\s*=\s*\[", text, re.MULTILINE)
    if found:
        text = text[: found.end()] + "\n" + entries + text[found.end() :]
    elif "mounts" in data:
        raise InputError(f"{source}: 'mounts' is not a top-level array the launcher can extend")
    else:
        table = re.search(r"^\[", text, re.MULTILINE)
        block = f"mounts = [\n{entries}]\n"
        text = text[: table.start()] + block + "\n" + text[table.start() :] if table else text + "\n" + block
    merged = tomllib.loads(text).get("mounts", [])
    assert all(m in merged for m in mounts)
    return text


def stage_environment(
    shell: Shell, local_path: str, *, arch: str, remote_root: str, mounts: list[str] | None = None
) -> tuple[str, str]:
    """Resolve {arch}, add mounts, upload to an absolute path under remote_root. Returns (path, text)."""
    path = Path(local_path).expanduser()
    try:
        text = path.read_text()
    except OSError as exc:
        raise InputError(f"environment TOML {path}: cannot read: {exc.strerror or exc}") from None
    text = add_mounts(resolve_arch(text, arch), mounts or [], str(path))
    digest = hashlib.sha256(text.encode()).hexdigest()[:12]
    remote = f"{remote_root}/env/{path.stem}-{arch}-{digest}.toml"
    shell.mkdir_p(f"{remote_root}/env")
    shell.write_text(remote, text)
    return remote, text


def stage_overlay(shell: Shell, overlay_dir: str, remote_root: str) -> tuple[Overlay, str]:
    """Upload an overlay's patched files to remote_root/overlays/<digest>/; returns it and that path."""
    overlay = load_overlay(Path(overlay_dir))
    digest = hashlib.sha256(json.dumps([f["sha256"] for f in overlay.files]).encode()).hexdigest()[:12]
    remote = f"{remote_root}/overlays/{digest}"
    for entry in overlay.files:
        target = f"{remote}/{entry['relpath']}"
        shell.mkdir_p(target.rsplit("/", 1)[0])
        shell.put(Path(overlay_dir) / entry["relpath"], target)
    return overlay, remote


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


class _Live:
    def __init__(self, endpoint: Endpoint | None = None) -> None:
        self.endpoint = endpoint


class SlurmLauncher:
    """Launch each deployment as a SLURM batch job. Configs may be given directly (tests) or come from
    blocks named in the spec."""

    kind = "slurm"

    def __init__(
        self,
        spec: SlurmLauncherSpec | None = None,
        *,
        cluster: ClusterConfig | None = None,
        ssh: SSHConfig | None = None,
    ) -> None:
        self.spec = spec or SlurmLauncherSpec()
        self.cluster = resolve_cluster(self.spec, cluster)
        self.ssh = resolve_ssh(self.spec, self.cluster, ssh)
        self._shell: Shell | None = None
        self._live: dict[str, _Live] = {}

    # -- plumbing ---------------------------------------------------------------------------------
    @property
    def shell(self) -> Shell:
        if self._shell is None:
            self._shell = open_shell(self.ssh)
        return self._shell

    def remote_root(self) -> str:
        return self.shell.expand(self.cluster.remote_dir)

    def _ledger_facts(self) -> dict[str, Any]:
        return {"remote": self.ssh.describe() if self.ssh else None, "cluster": self.cluster.name}

    def engine_command(self, target: TargetSpec, variant: Variant) -> list[str]:
        args = vllm_args(
            target,
            variant,
            served_model_name=served_name(target, variant),
            host="0.0.0.0",
            port=self.cluster.port,
        )
        return [*shlex.split(self.cluster.engine_command), *args]

    # -- the Launcher protocol --------------------------------------------------------------------
    def launch(
        self, target: TargetSpec, variant: Variant, *, deployment_id: str, directory: Path
    ) -> Deployment:
        if not _SAFE_NAME.fullmatch(deployment_id):
            raise InputError(f"deployment id {deployment_id!r} is not safe for job names and paths")
        directory.mkdir(parents=True, exist_ok=True)
        shell = self.shell
        root = self.remote_root()
        run_dir = f"{root}/runs/{deployment_id}.{utc_stamp()}"
        shell.mkdir_p(run_dir)  # before sbatch: Slurm 22.05 does not create the --output directory

        mounts: list[str] = []
        extra: dict[str, Any] = {"cluster": self.cluster.name, "run_dir": run_dir}
        if self.spec.overlay:
            overlay, overlay_root = stage_overlay(shell, self.spec.overlay, root)
            mounts = overlay.mounts(overlay_root)
            extra["overlays"] = overlay.provenance(overlay_root)
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
        job_name = f"specgauge-{deployment_id}"
        script = render_script(
            deployment_id=deployment_id,
            job_name=job_name,
            run_dir=run_dir,
            cluster=self.cluster,
            engine_command=command,
            env={"PYTHONUNBUFFERED": "1", **self.cluster.env, **target.env},
            launch_prefix=prefix,
        )
        script_path = f"{run_dir}/job.sbatch"
        shell.write_text(script_path, script, mode=0o755)
        (directory / "job.sbatch").write_text(script)

        job_id = submit(shell, script_path, cwd=run_dir)
        ledger.record(
            deployment_id,
            self.kind,
            job_id=job_id,
            job_name=job_name,
            run_dir=run_dir,
            directory=str(directory),
            **self._ledger_facts(),
        )
        log_path = f"{run_dir}/log-{job_id}.out"
        deployment = Deployment(
            id=deployment_id,
            launcher=self.kind,
            variant=variant,
            served_model_name=served_name(target, variant),
            base_url="",
            metrics_url="",
            directory=directory,
            command=command,
            started_at=utc_now(),
            job_id=job_id,
            extra={
                **extra,
                "remote_log": log_path,
                "script": script_path,
                "ssh": self._ledger_facts()["remote"],
            },
        )
        deployment.save()  # the job id is on disk before any waiting
        self._live[deployment_id] = _Live()
        try:
            self._expose(deployment, log_path)
        except BaseException:
            deployment.status = "failed"
            self.teardown(deployment)
            raise
        return deployment

    def _expose(self, deployment: Deployment, log_path: str) -> None:
        """Wait until the job runs and has said where it is; then open the way to its engine."""
        assert deployment.job_id is not None
        job_id, shell = deployment.job_id, self.shell
        deadline = time.monotonic() + self.cluster.pending_timeout_s
        state = job_state(shell, job_id)
        while True:
            if not state.alive:
                raise EngineDied(
                    f"job {job_id} of deployment {deployment.id} ended before its engine started "
                    f"({describe_end(shell, job_id)})",
                    log_tail=self._remote_tail(log_path),
                    transient=True,
                )
            if state.state == "RUNNING":
                text = self._read(log_path)
                address = node_address(shell, text, job_id, state.node) if _NODE_LINE.search(text) else None
                if address:
                    break
            if time.monotonic() > deadline:
                raise LaunchError(
                    f"job {job_id} still {state.state} ({state.reason}) after {self.cluster.pending_timeout_s:g} s",
                    transient=True,
                )
            time.sleep(self.cluster.poll_s if state.state == "PENDING" else 0.5)
            state = job_state(shell, job_id)
        endpoint = shell.forward(address, self.cluster.port)
        self._live[deployment.id].endpoint = endpoint
        deployment.base_url = endpoint.url
        deployment.metrics_url = f"{endpoint.url}/metrics"
        deployment.extra.update(
            {
                "node": state.node,
                "node_address": address,
                "port": self.cluster.port,
                "tunnel": self.ssh is not None,
            }
        )
        deployment.save()
        log.info(
            "deployment %s: job %s on %s (%s), engine at %s",
            deployment.id,
            job_id,
            state.node,
            address,
            endpoint.url,
        )

    def _read(self, path: str, tail_bytes: int | None = None) -> str:
        try:
            return self.shell.read_text(path, tail_bytes)
        except FileNotFoundError:
            return ""

    def _remote_tail(self, path: str, lines: int = 60) -> str:
        try:
            text = self._read(path, 64 * 1024)
        except SSHError as exc:
            return f"(log {path} unreadable: {exc})"
        return "\n".join(text.splitlines()[-lines:])

    def alive(self, deployment: Deployment) -> bool | None:
        if deployment.job_id is None:
            return False
        try:
            return job_state(self.shell, deployment.job_id).alive
        except SSHError:
            return None  # cannot tell right now; the gate keeps polling

    def log_tail(self, deployment: Deployment, lines: int = 60) -> str:
        if deployment.log_path is not None and deployment.log_path.exists():
            return tail(deployment.log_path, lines)
        remote = deployment.extra.get("remote_log")
        header = ""
        if deployment.job_id:
            try:
                state = job_state(self.shell, deployment.job_id)
                header = describe_end(self.shell, deployment.job_id) if not state.alive else ""
            except SSHError as exc:
                header = f"(job state unknown: {exc})"
        body = self._remote_tail(remote, lines) if remote else ""
        return "\n".join(part for part in (header, body) if part)

    def collect_facts(self, deployment: Deployment) -> dict[str, Any]:
        remote = deployment.extra.get("remote_log")
        text = self._read(remote) if remote else ""
        facts = startup_facts(text)
        deployment.kv_cache_tokens = facts.get("kv_cache_tokens", deployment.kv_cache_tokens)
        deployment.max_model_len = facts.get("max_model_len", deployment.max_model_len)
        deployment.engine_version = facts.get("engine_version", deployment.engine_version)
        return facts

    def teardown(self, deployment: Deployment) -> None:
        live = self._live.pop(deployment.id, None)
        if live is not None and live.endpoint is not None:
            live.endpoint.close()
        outcome = "nothing to stop"
        cancelled = True
        if deployment.job_id:
            try:
                outcome = cancel_job(self.shell, deployment.job_id, wait_s=self.cluster.cancel_wait_s)
            except (SSHError, LaunchError) as exc:
                cancelled = False
                outcome = f"could not cancel job {deployment.job_id}: {exc}; left in the ledger for `specgauge reap`"
                log.error("deployment %s: %s", deployment.id, outcome)
        remote = deployment.extra.get("remote_log")
        if remote and deployment.log_path is None:
            try:
                local = deployment.directory / "engine.log"
                self.shell.get(remote, local)
                deployment.log_path = local
            except (FileNotFoundError, SSHError, OSError):
                pass
        deployment.status = "failed" if deployment.status == "failed" else "stopped"
        deployment.stopped_at = utc_now()
        deployment.teardown = outcome
        deployment.save()
        if cancelled:
            ledger.forget(deployment.id)
        if not self._live and self._shell is not None:
            self._shell.close()
            self._shell = None

    @staticmethod
    def stop_leftover(entry: dict[str, Any]) -> str:
        """Cancel the job a crashed run left behind (from its ledger entry), if it is still ours."""
        job_id = entry.get("job_id")
        if not job_id:
            return "no job id recorded"
        shell = shell_from_ledger(entry)
        try:
            state = job_state(shell, str(job_id))
            if not state.alive:
                return f"job {job_id} already ended ({state.state})"
            if entry.get("job_name") and state.name and state.name != entry["job_name"]:
                return f"job {job_id} is now {state.name!r}, not {entry['job_name']!r}: left alone"
            return cancel_job(shell, str(job_id))
        finally:
            shell.close()
