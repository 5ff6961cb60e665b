"""ClusterSSHBlock: how to reach a cluster's login node over SSH (key as a secret, or a key file path)."""

from __future__ import annotations

from typing import Literal

from prefect.blocks.core import Block
from pydantic import Field, SecretStr

from tasks.launch.config import SSHConfig


class ClusterSSHBlock(Block):
    """SSH access to a cluster login node. The private key is stored as a secret (masked in the UI and
    logs), or named by a path on the machine that runs the flows."""

    _block_type_name = "Cluster SSH"
    _block_type_slug = "specgauge-cluster-ssh"
    _description = "SSH access to a SLURM cluster's login node for specgauge launchers."

    host: str = Field(description="Login node host name or address.")
    port: int = Field(default=22, description="SSH port.")
    user: str = Field(description="Cluster user name.")
    private_key: SecretStr | None = Field(default=None, description="Private key text (OpenSSH or PEM).")
    key_path: str | None = Field(default=None, description="Or: path of a private key file.")
    passphrase: SecretStr | None = Field(default=None, description="Passphrase of the key, if any.")
    known_hosts: str | None = Field(default=None, description="known_hosts file; default ~/.ssh/known_hosts.")
    host_key_policy: Literal["known_hosts", "accept-new", "insecure"] = Field(
        default="known_hosts",
        description="known_hosts: refuse unknown hosts; accept-new: remember unknown hosts, refuse changed "
        "keys; insecure: check nothing (logged loudly).",
    )
    keepalive_s: int = Field(default=15, description="Seconds between keepalive packets (0: off).")
    reconnect_attempts: int = Field(default=3, description="Connection attempts per (re)connect.")

    def to_config(self, name: str | None = None) -> SSHConfig:
        """The plain configuration the launchers take (no Prefect needed past this point)."""
        return SSHConfig(
            host=self.host,
            port=self.port,
            user=self.user,
            private_key=self.private_key,
            key_path=self.key_path,
            passphrase=self.passphrase,
            known_hosts=self.known_hosts,
            host_key_policy=self.host_key_policy,
            keepalive_s=self.keepalive_s,
            reconnect_attempts=self.reconnect_attempts,
            block=name or getattr(self, "_block_document_name", None),
        )
