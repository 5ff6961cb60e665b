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
    schema = flow.parameters.model_dump()
    parameters = deployment.get("parameters") or {}
    assert set(parameters) <= set(schema["properties"])
    request = parameters.get("request") or {}
    if request:  # a typed request (one model per flow): its fields are the model's
        typed = schema["properties"]["request"]
        ref = next(t["$ref"] for t in [typed, *typed.get("anyOf", [])] if "$ref" in t)
        assert set(request) <= set(schema["definitions"][ref.rsplit("/", 1)[-1]]["properties"])
    for values in (parameters, request):
        for spec in (values.get(name) for name in ("spec", "spec_path") if values.get(name)):
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


def test_the_local_profile_waits_for_prefects_ephemeral_api(tmp_path: Path) -> None:
    """Flows run by the CLI (`make demo`) start Prefect's ephemeral API; its first start in a fresh home
    migrates a new database and took 24 s on 2 cores, past Prefect's 20 s default, and the demo died. The
    repo's `local` profile, which the CLI selects, gives it longer."""
    import os

    probe = (
        "from specgauge.prefect_env import configure; configure()\n"
        "from prefect.settings import get_current_settings\n"
        "s = get_current_settings()\n"
        "print(s.server.ephemeral.enabled, s.server.ephemeral.startup_timeout_seconds)"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env["SPECGAUGE_HOME"] = str(tmp_path)
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=REPO, env=env)
    assert out.returncode == 0, out.stderr
    enabled, timeout_s = out.stdout.split()
    assert enabled == "True" and int(timeout_s) >= 120
