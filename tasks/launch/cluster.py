"""What the SLURM and `sml` launchers share: each deployment is one SLURM job on a cluster, reached over SSH
(or run on its login node).

The base resolves the cluster's settings (the spec's section over the cluster block's), opens the shell,
creates the job's run directory (Slurm 22.05 does not create log directories: a missing one fails the job),
stages overlays and environment TOMLs, waits until the job runs and its engine has an address, exposes the
engine (through an SSH tunnel when the client is outside the cluster), and answers alive, collect_facts,
teardown and stop_leftover with squeue/scancel. A subclass submits the job (sbatch, `sml advanced`) and
says where in its logs the engine's address and start-up facts are.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from pathlib import Path
from typing import Any, ClassVar, Self

from pydantic import ValidationError

from experiments.spec import ClusterLaunchSpec, ExperimentSpec, Variant
from specgauge.errors import EngineDied, InputError, LaunchError
from specgauge.provenance import utc_now, utc_stamp
from tasks.launch import ledger
from tasks.launch.base import Deployment, apply_startup_facts, startup_facts
from tasks.launch.config import ClusterConfig, LauncherConfig, SavedSettings, SSHConfig
from tasks.launch.overlay import Overlay, load_overlay
from tasks.launch.provenance import model_argument, remote_provenance
from tasks.launch.slurm_jobs import JobState, cancel_job, describe_end, job_state
from tasks.launch.slurm_script import add_mounts, resolve_arch
from tasks.launch.ssh import Endpoint, LocalShell, Shell, SSHError, SSHSession

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


def resolve_cluster(spec: ClusterLaunchSpec, cluster: ClusterConfig | None = None) -> ClusterConfig:
    """The cluster block's settings (`cluster`, read by the flow), overridden by whatever the spec's section
    sets."""
    if cluster is None and spec.cluster:
        raise InputError(
            f"launcher: SlurmClusterBlock {spec.cluster!r} was not read; the flow resolves it first "
            "(blocks.resolve_launcher_config)"
        )
    base = cluster or ClusterConfig()
    updates = {k: getattr(spec, k) for k in _OVERRIDES if getattr(spec, k, None) is not None}
    data = {**base.model_dump(), **updates, "env": {**base.env, **spec.env}}
    try:
        return ClusterConfig.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(f"launcher.{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise InputError(f"cluster settings: {problems}") from None


def resolve_ssh(
    spec: ClusterLaunchSpec, cluster: ClusterConfig, ssh: SSHConfig | None = None
) -> SSHConfig | None:
    """`ssh` (read by the flow), or None for the login node itself when neither spec nor cluster names one."""
    name = spec.ssh or cluster.ssh_block
    if ssh is None and name:
        raise InputError(
            f"launcher: ClusterSSHBlock {name!r} was not read; the flow resolves it first "
            "(blocks.resolve_launcher_config)"
        )
    return ssh


def open_shell(ssh: SSHConfig | None) -> Shell:
    if ssh is None:
        return LocalShell()
    session = SSHSession(ssh)
    session.connect()
    return session


def shell_from_ledger(entry: dict[str, Any], saved: SavedSettings | None = None) -> Shell:
    """Reach the cluster of a ledger entry again (for reaping): by block name, key file, or locally."""
    remote = entry.get("remote")
    if not remote:
        return LocalShell()
    if remote.get("block"):
        if saved is None:
            raise LaunchError(
                f"cannot reach {remote.get('user')}@{remote.get('host')} again to stop job "
                f"{entry.get('job_id')}: its ClusterSSHBlock {remote['block']!r} was not given (`specgauge reap` reads it)"
            )
        return open_shell(saved.ssh(remote["block"]))
    if remote.get("key_path"):
        facts = {k: v for k, v in remote.items() if v is not None and k != "block"}
        return open_shell(SSHConfig(**facts))
    raise LaunchError(
        f"cannot reach {remote.get('user')}@{remote.get('host')} again to stop job {entry.get('job_id')}: "
        "its key was given inline (use a ClusterSSHBlock or a key file)"
    )


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


class _Live:
    def __init__(self, endpoint: Endpoint | None = None) -> None:
        self.endpoint = endpoint


class ClusterJobLauncher:
    """One SLURM job per deployment. Configs come from the flow (blocks read) or directly (tests)."""

    kind: ClassVar[str]
    spec_class: ClassVar[type[ClusterLaunchSpec]]  # the spec section of this kind (its defaults: no spec)
    job_label: ClassVar[str] = "job"  # how messages name the job
    engine_label: ClassVar[str] = "engine"  # what must have started before the job counts as up
    address_key: ClassVar[str] = "node_address"  # deployment.extra key of the engine's address
    facts_log_key: ClassVar[str] = "remote_log"  # deployment.extra key of the log holding start-up facts

    def __init__(
        self,
        spec: ClusterLaunchSpec | None = None,
        *,
        cluster: ClusterConfig | None = None,
        ssh: SSHConfig | None = None,
    ) -> None:
        self.spec = spec or self.spec_class()
        self.cluster = resolve_cluster(self.spec, cluster)
        self.ssh = resolve_ssh(self.spec, self.cluster, ssh)
        self._shell: Shell | None = None
        self._live: dict[str, _Live] = {}
        self.node: str | None = None  # where the next jobs must run (place_on); None: the scheduler's choice
        self.log = logging.getLogger(f"specgauge.{self.kind}")

    def place_on(self, node: str | None) -> None:
        self.node = node

    @classmethod
    def from_spec(cls, spec: ClusterLaunchSpec, config: LauncherConfig) -> Self:
        return cls(spec, cluster=config.cluster, ssh=config.ssh)

    @classmethod
    def check_inputs(cls, experiment: ExperimentSpec) -> None:
        """Nothing: cluster paths are not readable from here; the engine checks on its side."""

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

    def _record(self, deployment_id: str, job_id: str, **facts: Any) -> None:
        """The job in the ledger, with how to reach its cluster again, before anything waits on it."""
        ledger.record(deployment_id, self.kind, job_id=job_id, **facts, **self._ledger_facts())

    def _new_run_dir(self, deployment_id: str, directory: Path) -> tuple[str, str]:
        """(remote root, a fresh run directory under it), both created; the local directory too."""
        directory.mkdir(parents=True, exist_ok=True)
        root = self.remote_root()
        run_dir = f"{root}/runs/{deployment_id}.{utc_stamp()}"
        self.shell.mkdir_p(run_dir)  # before sbatch: Slurm 22.05 does not create the --output directory
        return root, run_dir

    def _stage_overlay(self, root: str, extra: dict[str, Any]) -> list[str]:
        """Upload the spec's overlay, if any; record it in `extra`; return the container mounts it needs."""
        if not self.spec.overlay:
            return []
        overlay, overlay_root = stage_overlay(self.shell, self.spec.overlay, root)
        extra["overlays"] = overlay.provenance(overlay_root)
        return overlay.mounts(overlay_root)

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

    def _end_line(self, deployment: Deployment) -> str:
        """How the job ended (empty while it runs), for log tails."""
        if not deployment.job_id:
            return ""
        try:
            if not job_state(self.shell, deployment.job_id).alive:
                return describe_end(self.shell, deployment.job_id)
        except SSHError as exc:
            return f"(job state unknown: {exc})"
        return ""

    # -- waiting for the engine -------------------------------------------------------------------
    def _engine_address(self, deployment: Deployment, state: JobState) -> str | None:
        """Where the running job's engine listens, once its logs say so (None: not yet)."""
        raise NotImplementedError

    def _engine_port(self, deployment: Deployment) -> int:
        """The port the running job's engine listens on (called once its address is known)."""
        return self.cluster.port

    def _died_tail(self, deployment: Deployment) -> str:
        """The log tail an EngineDied carries when the job ends before its engine started."""
        return self._remote_tail(deployment.extra["remote_log"])

    def _follow(
        self,
        *,
        deployment_id: str,
        directory: Path,
        variant: Variant,
        served_model_name: str,
        command: list[str],
        job_id: str,
        extra: dict[str, Any],
    ) -> Deployment:
        """The deployment of a submitted job, on disk before any waiting; then its engine exposed."""
        deployment = Deployment(
            id=deployment_id,
            launcher=self.kind,
            variant=variant,
            served_model_name=served_model_name,
            base_url="",
            metrics_url="",
            directory=directory,
            command=command,
            started_at=utc_now(),
            job_id=job_id,
            extra={**extra, "ssh": self._ledger_facts()["remote"]},
        )
        deployment.save()  # the job id is on disk before any waiting
        self._expose(deployment)
        return deployment

    def _expose(self, deployment: Deployment) -> None:
        """Wait for the engine's address and open the way to it; on any failure tear down, then raise."""
        self._live[deployment.id] = _Live()
        try:
            self._wait_and_tunnel(deployment)
        except BaseException:
            deployment.status = "failed"
            self.teardown(deployment)
            raise

    def _wait_and_tunnel(self, deployment: Deployment) -> None:
        assert deployment.job_id is not None
        job_id, shell = deployment.job_id, self.shell
        deadline = time.monotonic() + self.cluster.pending_timeout_s
        while True:
            state = job_state(shell, job_id)
            if not state.alive:
                raise EngineDied(
                    f"{self.job_label} {job_id} of deployment {deployment.id} ended before its "
                    f"{self.engine_label} started ({describe_end(shell, job_id)})",
                    log_tail=self._died_tail(deployment),
                    transient=True,
                )
            if state.state == "RUNNING":
                address = self._engine_address(deployment, state)
                if address:
                    break
            if time.monotonic() > deadline:
                raise LaunchError(
                    f"{self.job_label} {job_id} still {state.state} ({state.reason}) after "
                    f"{self.cluster.pending_timeout_s:g} s",
                    transient=True,
                )
            time.sleep(self.cluster.poll_s if state.state == "PENDING" else 0.5)
        port = self._engine_port(deployment)
        endpoint = shell.forward(address, port)
        self._live[deployment.id].endpoint = endpoint
        deployment.base_url = endpoint.url
        deployment.metrics_url = f"{endpoint.url}/metrics"
        deployment.extra.update(
            {
                "node": state.node,
                self.address_key: address,
                "port": port,
                "tunnel": self.ssh is not None,
            }
        )
        deployment.save()
        self.log.info(
            "deployment %s: %s %s on %s (%s), engine at %s",
            deployment.id,
            self.job_label,
            job_id,
            state.node,
            address,
            endpoint.url,
        )

    # -- the Launcher protocol (launch and log_tail: the subclasses) ------------------------------
    def alive(self, deployment: Deployment) -> bool | None:
        if deployment.job_id is None:
            return False
        try:
            return job_state(self.shell, deployment.job_id).alive
        except SSHError:
            return None  # cannot tell right now; the gate keeps polling

    def collect_facts(self, deployment: Deployment) -> dict[str, Any]:
        path = deployment.extra.get(self.facts_log_key)
        if deployment.provenance is None:  # the staged overlay is known here; the node's files and host not
            node = deployment.extra.get("node") or "a node the scheduler chose"
            deployment.provenance = remote_provenance(
                model_argument(deployment.command) or "",
                f"on {self.kind} node {node}",
                deployment.extra.get("overlays"),
            )
        return apply_startup_facts(deployment, startup_facts(self._read(path) if path else ""))

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
                self.log.error("deployment %s: %s", deployment.id, outcome)
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
    def stop_leftover(entry: dict[str, Any], saved: SavedSettings | None = None) -> str:
        """Cancel the job a crashed run left behind (from its ledger entry), if it is still ours."""
        job_id = entry.get("job_id")
        if not job_id:
            return "no job id recorded"
        shell = shell_from_ledger(entry, saved)
        try:
            state = job_state(shell, str(job_id))
            if not state.alive:
                return f"job {job_id} already ended ({state.state})"
            if entry.get("job_name") and state.name and state.name != entry["job_name"]:
                return f"job {job_id} is now {state.name!r}, not {entry['job_name']!r}: left alone"
            return cancel_job(shell, str(job_id))
        finally:
            shell.close()
