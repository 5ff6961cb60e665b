"""Launchers are plug-ins: every launcher kind a spec accepts has a registered backend that implements the
whole `Launcher` protocol, settings named in a spec reach the launcher only as plain configs, and
tasks/launch/ never reaches back into blocks/ or Prefect."""

from __future__ import annotations

import ast
import inspect
import subprocess
import sys
import typing
from pathlib import Path
from typing import Any

import pytest
from pydantic import TypeAdapter

from experiments.spec import LaunchSpec
from specgauge.errors import InputError, LaunchError
from tasks.launch import launcher_class
from tasks.launch.config import ClusterConfig, EndpointConfig, LauncherConfig, SSHConfig, resolve_names
from tasks.launch.protocol import Launcher
from tasks.launch.registry import BACKENDS

REPO = Path(__file__).resolve().parent.parent
# The least each kind's spec section needs (only the endpoint has a required field: where it is).
MINIMAL: dict[str, dict[str, Any]] = {"endpoint": {"base_url": "http://127.0.0.1:9"}}


def spec_kinds() -> set[str]:
    """The `kind` literals of the spec's launcher union, read from the union itself."""
    union = typing.get_args(LaunchSpec)[0]
    kinds = set()
    for spec_class in typing.get_args(union):
        kinds.update(typing.get_args(spec_class.model_fields["kind"].annotation))
    return kinds


def launch_spec(kind: str, **fields: Any) -> Any:
    return TypeAdapter(LaunchSpec).validate_python({"kind": kind, **MINIMAL.get(kind, {}), **fields})


def protocol_members() -> list[str]:
    return [name for name in vars(Launcher) if not name.startswith("_")]


def test_the_registry_covers_every_launcher_kind_of_the_spec() -> None:
    assert spec_kinds() == set(BACKENDS)
    assert {"local", "endpoint", "slurm", "sml"} <= spec_kinds()
    for kind in spec_kinds():
        backend = launcher_class(kind)
        assert backend.kind == kind and backend.__module__ == BACKENDS[kind]
    with pytest.raises(NotImplementedError, match="launcher kind 'carrier-pigeon'"):
        launcher_class("carrier-pigeon")


@pytest.mark.parametrize("kind", sorted(BACKENDS))
def test_every_backend_implements_the_whole_protocol(kind: str) -> None:
    backend = launcher_class(kind)
    assert {"from_spec", "check_inputs", "launch", "alive", "log_tail", "collect_facts", "teardown"} <= set(
        protocol_members()
    )
    for name in protocol_members():
        wanted = inspect.getattr_static(Launcher, name)
        found = next((vars(c)[name] for c in backend.__mro__ if name in vars(c)), None)
        assert found is not None, f"{backend.__qualname__} lacks {name}"
        assert type(found) is type(wanted), (
            f"{backend.__qualname__}.{name}: {type(found)} is not {type(wanted)}"
        )
        mine = inspect.signature(getattr(backend, name))
        theirs = inspect.signature(getattr(Launcher, name))
        assert [(p.name, p.kind, p.default) for p in mine.parameters.values()] == [
            (p.name, p.kind, p.default) for p in theirs.parameters.values()
        ], f"{backend.__qualname__}.{name}{mine} differs from the protocol's {theirs}"
    launcher = backend.from_spec(launch_spec(kind), LauncherConfig())
    assert isinstance(launcher, Launcher) and isinstance(launcher, backend)
    assert isinstance(backend.kind, str)


@pytest.mark.parametrize(
    ("kind", "fields", "block"),
    [
        ("endpoint", {"block": "shared"}, "EndpointBlock 'shared'"),
        ("slurm", {"cluster": "alps"}, "SlurmClusterBlock 'alps'"),
        ("sml", {"ssh": "login"}, "ClusterSSHBlock 'login'"),
    ],
)
def test_a_named_block_that_was_not_read_is_refused(kind: str, fields: dict[str, Any], block: str) -> None:
    """A launcher never falls back to defaults for settings the spec names: the flow must read them."""
    with pytest.raises(InputError, match=f"{block} was not read"):
        launcher_class(kind).from_spec(launch_spec(kind, **fields), LauncherConfig())


class PlainSettings:
    """Saved settings from dicts (what blocks.SavedBlocks reads from Prefect)."""

    def __init__(self, **by_kind: dict[str, Any]) -> None:
        self.by_kind = by_kind
        self.asked: list[tuple[str, str]] = []

    def _get(self, kind: str, name: str) -> Any:
        self.asked.append((kind, name))
        if name not in self.by_kind.get(kind, {}):
            raise InputError(f"no {kind} settings named {name!r}")
        return self.by_kind[kind][name]

    def endpoint(self, name: str) -> EndpointConfig:
        return self._get("endpoint", name)

    def cluster(self, name: str) -> ClusterConfig:
        return self._get("cluster", name)

    def ssh(self, name: str) -> SSHConfig:
        return self._get("ssh", name)


def test_names_in_a_spec_resolve_to_plain_settings_and_reach_the_launcher(tmp_path: Path) -> None:
    login = SSHConfig(host="login.example", user="me", key_path=tmp_path / "key", block="login")
    saved = PlainSettings(
        cluster={"alps": ClusterConfig(name="alps", partition="normal", ssh_block="login")},
        ssh={"login": login},
        endpoint={"shared": EndpointConfig(base_url="https://api.example/v1", served_model_name="m")},
    )
    spec = launch_spec("slurm", cluster="alps", partition="debug")
    config = resolve_names(spec, saved)
    assert saved.asked == [("cluster", "alps"), ("ssh", "login")]  # the SSH block the cluster names
    slurm = launcher_class("slurm").from_spec(spec, config)
    assert (slurm.cluster.name, slurm.cluster.partition, slurm.ssh) == ("alps", "debug", login)

    shared = launch_spec("endpoint", block="shared", base_url=None)
    endpoint = launcher_class("endpoint").from_spec(shared, resolve_names(shared, saved))
    assert (endpoint.config.base_url, endpoint.config.served_model_name) == ("https://api.example", "m")
    assert resolve_names(launch_spec("local"), saved) == LauncherConfig()


def test_a_leftover_on_a_cluster_reached_through_a_block_needs_the_saved_settings() -> None:
    entry = {
        "id": "c.plain.r0",
        "launcher": "slurm",
        "job_id": "7",
        "remote": {"host": "h", "user": "u", "block": "login"},
    }
    with pytest.raises(LaunchError, match="ClusterSSHBlock 'login' was not given"):
        launcher_class("slurm").stop_leftover(entry)
    saved = PlainSettings()
    with pytest.raises(InputError, match="no ssh settings named 'login'"):
        launcher_class("sml").stop_leftover({**entry, "launcher": "sml"}, saved)
    assert saved.asked == [("ssh", "login")]
    assert launcher_class("endpoint").stop_leftover({"id": "x", "launcher": "endpoint"}) == (
        "endpoint: nothing was launched"
    )


def test_tasks_launch_never_imports_blocks_or_prefect() -> None:
    for path in sorted((REPO / "tasks" / "launch").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                assert top not in ("blocks", "prefect"), f"{path.relative_to(REPO)} imports {name}"


def test_the_local_path_imports_neither_paramiko_nor_prefect() -> None:
    code = (
        "import sys\n"
        "from experiments.spec import load_spec\n"
        "from tasks.drafters.prelaunch import check_launchable\n"
        "from tasks.launch import launcher_for\n"
        "spec = load_spec('experiments/demo.yaml')\n"
        "check_launchable(spec)\n"
        "launcher_for(spec)\n"
        "print(sorted(m for m in ('paramiko', 'prefect') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
