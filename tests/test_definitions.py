"""Every definition loads: each prefect.yaml entrypoint is a flow, every block type and CLI command imports."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
DEPLOYMENTS = yaml.safe_load((REPO / "prefect.yaml").read_text())["deployments"]


@pytest.mark.parametrize("deployment", DEPLOYMENTS, ids=lambda d: d["name"])
def test_prefect_yaml_entrypoints_are_flows_with_their_parameters(deployment: dict) -> None:
    from prefect import Flow

    module_path, name = deployment["entrypoint"].split(":")
    module = importlib.import_module(module_path.removesuffix(".py").replace("/", "."))
    flow = getattr(module, name)
    assert isinstance(flow, Flow)
    accepted = set(flow.parameters.properties)
    assert set(deployment.get("parameters") or {}) <= accepted
    for spec in (deployment.get("parameters") or {}).get("spec", []) and [deployment["parameters"]["spec"]]:
        assert (REPO / spec).exists(), f"{deployment['name']}: spec {spec} missing"


def test_every_block_module_defines_a_block() -> None:
    from prefect.blocks.core import Block

    from cli.commands.blocks import block_modules

    for name in block_modules():
        module = importlib.import_module(name)
        assert any(
            isinstance(o, type) and issubclass(o, Block) and o.__module__ == name
            for o in vars(module).values()
        )


def test_the_cli_help_lists_every_command_group() -> None:
    out = subprocess.run([sys.executable, "-m", "cli", "--help"], capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 0, out.stderr
    for command in (
        "workloads",
        "campaign",
        "demo",
        "metrics-delta",
        "sql",
        "ingest",
        "gate",
        "profile",
        "reap",
    ):
        assert command in out.stdout, command
