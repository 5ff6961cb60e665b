"""Prefect blocks, one per module, and the reading of the blocks a spec names into the plain settings the
launchers take (tasks/launch/config.py). Imports go one way: blocks/ -> tasks/launch/, never back."""

from __future__ import annotations

from typing import Any

from experiments.spec import LaunchSpec
from specgauge.errors import InputError
from tasks.launch.config import ClusterConfig, EndpointConfig, LauncherConfig, SSHConfig, resolve_names


def _load(block_class: Any, name: str, hint: str = "") -> Any:
    try:
        return block_class.load(name)
    except (ValueError, RuntimeError) as exc:
        raise InputError(f"no {block_class.__name__} named {name!r} could be loaded ({exc}){hint}") from None


class SavedBlocks:
    """Saved launcher settings by name, read from the Prefect API in use (tasks.launch.config.SavedSettings)."""

    def endpoint(self, name: str) -> EndpointConfig:
        from blocks.endpoint import EndpointBlock

        return _load(EndpointBlock, name).to_config()

    def cluster(self, name: str) -> ClusterConfig:
        from blocks.slurm_cluster import SlurmClusterBlock

        return _load(SlurmClusterBlock, name, "; create it (docs/cluster.md)").to_config()

    def ssh(self, name: str) -> SSHConfig:
        from blocks.cluster_ssh import ClusterSSHBlock

        return _load(ClusterSSHBlock, name, "; create it (docs/cluster.md)").to_config(name)


def resolve_launcher_config(launch: LaunchSpec) -> LauncherConfig:
    """The blocks a spec's launcher section names, read into plain settings (none for a local launcher).
    Flows call this before `launcher_for(spec, config)`; raises InputError naming a block that is missing."""
    return resolve_names(launch, SavedBlocks())
