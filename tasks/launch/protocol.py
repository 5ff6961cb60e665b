"""What every launcher backend implements. Callers use only these methods; the registry
(tasks/launch/registry.py) finds the backend for a spec's launcher kind."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar, Protocol, Self, runtime_checkable

from experiments.spec import ExperimentSpec, LaunchSpec, TargetSpec, Variant
from tasks.launch.base import Deployment
from tasks.launch.config import LauncherConfig, SavedSettings


@runtime_checkable
class Launcher(Protocol):
    kind: ClassVar[str]  # the spec's `launcher.kind` this backend serves

    @classmethod
    def from_spec(cls, spec: LaunchSpec, config: LauncherConfig) -> Self:
        """The launcher for a spec's launcher section, given the saved settings it names, already read
        (`blocks.resolve_launcher_config`). Raises InputError when a named setting was not given."""

    @classmethod
    def check_inputs(cls, experiment: ExperimentSpec) -> None:
        """Input problems this backend can see before anything starts (InputError naming the input)."""

    def launch(
        self, target: TargetSpec, variant: Variant, *, deployment_id: str, directory: Path
    ) -> Deployment:
        """Start the engine and return at once (the readiness check waits). Records itself in the ledger.
        The node it runs on is in `deployment.extra["node"]` once it is known (at the latest when ready)."""

    def place_on(self, node: str | None) -> None:
        """Launch the next deployments on this node (a repeat block stays on one node, so that its
        speedups are paired within a node); None: wherever the backend puts them."""

    def alive(self, deployment: Deployment) -> bool | None:
        """False when the engine (or its job) has ended; None when it cannot be known."""

    def log_tail(self, deployment: Deployment, lines: int = 60) -> str:
        """The end of the engine's log (and whatever says how it ended), for error messages."""

    def collect_facts(self, deployment: Deployment) -> dict[str, Any]:
        """Start-up facts (engine version, KV-cache tokens, max model length) into the deployment; returns
        them. Called once the engine is ready."""

    def teardown(self, deployment: Deployment) -> None:
        """Stop everything the launch started. Idempotent; never raises for an already stopped engine."""

    @staticmethod
    def stop_leftover(entry: dict[str, Any], saved: SavedSettings | None = None) -> str:
        """Stop what a crashed run left, from its ledger entry, if it is still ours; say what was done.
        `saved` reads settings the entry names (an SSH block); without it such an entry cannot be reached."""
