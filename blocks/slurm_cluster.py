"""SlurmClusterBlock: a SLURM cluster's launch settings (partition, account, container, sml, work dir)."""

from __future__ import annotations

from typing import Literal

from prefect.blocks.core import Block
from pydantic import Field

from tasks.launch.config import ClusterConfig


class SlurmClusterBlock(Block):
    """Where and how specgauge's SLURM and sml launchers start engines on one cluster. A spec's launcher
    section names this block (`cluster:`) and may override any field it also has."""

    _block_type_name = "SLURM Cluster"
    _block_type_slug = "specgauge-slurm-cluster"
    _description = "A SLURM cluster's launch settings for specgauge (sbatch or sml)."

    partition: str | None = Field(default=None, description="SLURM partition.")
    account: str | None = Field(default=None, description="SLURM account.")
    time_limit: str = Field(default="01:00:00", description="Job time limit.")
    gpus_per_node: int | None = Field(default=None, description="GPUs per node (sbatch --gpus-per-node).")
    cpus_per_task: int | None = Field(default=None, description="sbatch --cpus-per-task.")
    memory: str | None = Field(default=None, description="sbatch --mem, e.g. 200G.")
    extra_sbatch: list[str] = Field(
        default_factory=list, description="More sbatch options, e.g. --exclusive."
    )
    remote_dir: str = Field(
        default="specgauge",
        description="Work directory on a shared filesystem; relative paths are under $HOME.",
    )
    engine_command: str = Field(
        default="python -m vllm.entrypoints.openai.api_server",
        description="The engine command as the node runs it (inside the container, if any), before its args.",
    )
    container_prefix: str = Field(
        default="",
        description="Command prefix that enters the container, e.g. 'srun --environment={environment}' or "
        "'srun --container-image=IMG --container-mounts={mounts}'. Empty: no container.",
    )
    environment_toml: str | None = Field(
        default=None,
        description="Container environment TOML (local path); {arch} is resolved, then uploaded.",
    )
    arch: str = Field(default="arm64", description="Replaces {arch} in the environment TOML (GH200: arm64).")
    setup: list[str] = Field(default_factory=list, description="Shell lines the job runs before the engine.")
    env: dict[str, str] = Field(default_factory=dict, description="Environment for the engine.")
    port: int = Field(
        default=8080,
        description="Engine port on the node (sml: always 8080); 0: the SLURM job takes a free one, for nodes "
        "that several slots of a campaign may share.",
    )
    ssh_block: str | None = Field(
        default=None, description="Name of the ClusterSSHBlock to reach the login node; none: run on it."
    )
    pending_timeout_s: float = Field(default=3600.0, description="How long a job may wait in the queue.")
    sml_path: str = Field(default="sml", description="The sml command on the login node.")
    sml_flags: Literal["legacy", "current"] = Field(
        default="current",
        description="sml flag generation: legacy (--firecrest-system/--serving-framework/--slurm-environment) "
        "or current (--system/--framework/--environment). Must match the sml installed and the TOML.",
    )
    sml_system: str | None = Field(default=None, description="sml --system / --firecrest-system value.")
    sml_env: dict[str, str] = Field(default_factory=dict, description="Environment for the sml command.")
    served_org: str = Field(default="specgauge", description="Middle segment of served names user/org/name.")

    def to_config(self) -> ClusterConfig:
        """The plain configuration the launchers take (validated: bad values name their field)."""
        data = self.model_dump(include=set(ClusterConfig.model_fields))
        data["name"] = getattr(self, "_block_document_name", None) or "cluster"
        return ClusterConfig.model_validate(data)
