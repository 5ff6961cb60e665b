"""The plain settings launchers take: a cluster's, a login node's, an endpoint's, and the bundle of them a
spec's launcher section resolves to.

Saved settings live in Prefect blocks (blocks/); the flow resolves the names a spec gives into these plain
values (`blocks.resolve_launcher_config`) and hands them to the launcher, so nothing in tasks/launch/ needs
Prefect. Tests build these directly.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationInfo,
    field_validator,
    model_validator,
)

from experiments.spec import ClusterLaunchSpec, EndpointLaunchSpec, LaunchSpec
from tasks.launch.command import ENGINE_MODULE

HostKeyPolicy = Literal["known_hosts", "accept-new", "insecure"]
# What may reach a shell or a path on the cluster unquoted (scripts quote everything else).
SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
SAFE_PATH = re.compile(r"^[A-Za-z0-9._/~+@=-]+$")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SBATCH_OPTION = re.compile(r"^--[a-z][a-z0-9-]*(=[A-Za-z0-9._:,/+@=%-]+)?$")
_TIME = re.compile(r"^(\d+-)?\d{1,3}(:\d{2}){0,2}$")
_MEMORY = re.compile(r"^\d+[KMGT]?$")
_PLACEHOLDERS = frozenset({"mounts", "environment"})
# ClusterConfig's text fields that must match a pattern, and what the error says after the value if not.
_PATTERNS: dict[str, tuple[re.Pattern[str], str]] = {
    **dict.fromkeys(
        ("name", "partition", "account", "sml_system", "served_org", "arch"),
        (SAFE_NAME, ": only letters, digits, '.', '_' and '-'"),
    ),
    "time_limit": (_TIME, " is not a SLURM time ([D-]HH:MM:SS)"),
    "memory": (_MEMORY, " is not a SLURM --mem value (e.g. 200G)"),
    **dict.fromkeys(
        ("remote_dir", "sml_path"), (SAFE_PATH, ": paths may hold letters, digits and ._/~+@=- only")
    ),
}


class EndpointConfig(BaseModel):
    """What `EndpointBlock.to_config()` returns; the spec's endpoint section overrides what it sets."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    base_url: str
    api_key: SecretStr | None = None
    metrics_url: str | None = None
    served_model_name: str | None = None

    @field_validator("base_url")
    @classmethod
    def root_url(cls, value: str) -> str:
        """The server root: the readiness check and the client add /v1/... themselves."""
        if not value.startswith(("http://", "https://")):
            # not echoed: without a scheme, a user:password@ in it is not recognisable as one
            raise ValueError("base_url must start with http:// or https://")
        value = value.rstrip("/")
        return value.removesuffix("/v1")


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
    port: int = Field(
        default=8080,
        ge=0,
        lt=65536,
        description="The engine's port on its node; 0: the job takes a free one (SLURM; needed when several "
        "slots of a campaign may share a node).",
    )
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

    @field_validator(*_PATTERNS)
    @classmethod
    def matches_its_pattern(cls, value: str | None, info: ValidationInfo) -> str | None:
        pattern, problem = _PATTERNS[info.field_name or ""]
        if value is not None and not pattern.fullmatch(value):
            raise ValueError(f"{value!r}{problem}")
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
            if not ENV_NAME.fullmatch(name):
                raise ValueError(f"{name!r} is not an environment variable name")
        return value

    @field_validator("container_prefix")
    @classmethod
    def known_placeholders(cls, value: str) -> str:
        unknown = set(re.findall(r"\{(\w*)\}", value)) - _PLACEHOLDERS
        if unknown:
            raise ValueError(f"unknown placeholder(s) {sorted(unknown)}; known: {sorted(_PLACEHOLDERS)}")
        return value


class SSHConfig(BaseModel):
    """How to reach a login node. `ClusterSSHBlock.to_config()` makes one; tests build it directly."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    host: str = Field(min_length=1)
    port: int = Field(default=22, gt=0, lt=65536)
    user: str = Field(min_length=1)
    key_path: Path | None = Field(default=None, description="Private key file.")
    private_key: SecretStr | None = Field(default=None, description="Private key text (OpenSSH/PEM).")
    passphrase: SecretStr | None = None
    known_hosts: Path | None = Field(default=None, description="Default: ~/.ssh/known_hosts.")
    host_key_policy: HostKeyPolicy = "known_hosts"
    connect_timeout_s: float = Field(default=15.0, gt=0)
    keepalive_s: int = Field(default=15, ge=0, description="0: no keepalive packets.")
    reconnect_attempts: int = Field(default=3, ge=1, description="Connection attempts per (re)connect.")
    reconnect_backoff_s: float = Field(default=1.0, ge=0)
    block: str | None = Field(default=None, description="The ClusterSSHBlock this came from, if any.")

    @model_validator(mode="after")
    def one_key(self) -> SSHConfig:
        if (self.key_path is None) == (self.private_key is None):
            raise ValueError("give exactly one of key_path or private_key")
        return self

    @property
    def known_hosts_path(self) -> Path:
        return Path(self.known_hosts or Path.home() / ".ssh" / "known_hosts").expanduser()

    @property
    def where(self) -> str:
        return f"{self.user}@{self.host}:{self.port}"

    def describe(self) -> dict[str, Any]:
        """Non-secret facts (for the ledger and provenance): enough to reconnect with a key file or block."""
        return {
            "host": self.host,
            "port": self.port,
            "user": self.user,
            "key_path": str(self.key_path) if self.key_path else None,
            "known_hosts": str(self.known_hosts) if self.known_hosts else None,
            "host_key_policy": self.host_key_policy,
            "block": self.block,
        }


@dataclass(frozen=True)
class LauncherConfig:
    """The saved settings a spec's launcher section names, as plain values (None: not named). The launcher
    overrides them with the spec's own fields."""

    endpoint: EndpointConfig | None = None
    cluster: ClusterConfig | None = None
    ssh: SSHConfig | None = None


class SavedSettings(Protocol):
    """Plain settings by the name a spec or a ledger entry gives them. blocks/ reads them from Prefect
    blocks; raises InputError naming what could not be loaded."""

    def endpoint(self, name: str) -> EndpointConfig: ...
    def cluster(self, name: str) -> ClusterConfig: ...
    def ssh(self, name: str) -> SSHConfig: ...


def resolve_names(launch: LaunchSpec, saved: SavedSettings) -> LauncherConfig:
    """Every block name in a launcher section (and the SSH block its cluster names) read from `saved`."""
    if isinstance(launch, EndpointLaunchSpec):
        return LauncherConfig(endpoint=saved.endpoint(launch.block) if launch.block else None)
    if isinstance(launch, ClusterLaunchSpec):
        cluster = saved.cluster(launch.cluster) if launch.cluster else None
        ssh_name = launch.ssh or (cluster.ssh_block if cluster else None)
        return LauncherConfig(cluster=cluster, ssh=saved.ssh(ssh_name) if ssh_name else None)
    return LauncherConfig()
