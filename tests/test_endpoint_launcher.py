"""The endpoint launcher: an already running server (here the embedded engine, directly and behind a
key-checking gateway stand-in). Nothing is launched or stopped; the key never reaches artifacts."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from pydantic import SecretStr
from stand_ins.gateway import Gateway

from experiments.spec import EndpointLaunchSpec, TargetSpec, Variant
from specgauge.errors import InputError, ReadinessTimeout
from tasks.health import wait_ready
from tasks.launch import ledger
from tasks.launch.config import EndpointConfig
from tasks.launch.endpoint import EndpointLauncher, resolve_endpoint

TARGET = TargetSpec(model="models/tiny-target", served_model_name="tiny")
PLAIN = Variant(name="plain")


def test_settings_come_from_the_block_and_the_spec_overrides_them() -> None:
    block = EndpointConfig(base_url="https://api.example.org/v1/", api_key=SecretStr("block-key"))
    merged = resolve_endpoint(
        EndpointLaunchSpec(block="shared", metrics_url="http://10.0.0.5:8080/metrics"), block
    )
    assert merged.base_url == "https://api.example.org"  # /v1 is added by the callers
    assert merged.api_key is not None and merged.api_key.get_secret_value() == "block-key"
    assert merged.metrics_url == "http://10.0.0.5:8080/metrics"
    spec_key = resolve_endpoint(
        EndpointLaunchSpec(base_url="http://h:1", api_key=SecretStr("spec-key")), block
    )
    assert spec_key.base_url == "http://h:1" and spec_key.api_key.get_secret_value() == "spec-key"  # type: ignore[union-attr]
    with pytest.raises(ValueError, match="must start with http"):
        EndpointConfig(base_url="api.example.org")
    with pytest.raises(InputError, match="needs a spec section or an EndpointConfig"):
        EndpointLauncher()


def test_the_key_is_sent_but_never_saved(tmp_path: Path) -> None:
    config = EndpointConfig(base_url="http://127.0.0.1:9", api_key=SecretStr("sk-very-secret"))
    launcher = EndpointLauncher(config=config)
    deployment = launcher.launch(TARGET, PLAIN, deployment_id="ep.plain.r0", directory=tmp_path)
    assert deployment.headers() == {"Authorization": "Bearer sk-very-secret"}
    assert deployment.metrics_url == "http://127.0.0.1:9/metrics" and deployment.served_model_name == "tiny"
    assert "sk-very-secret" not in (tmp_path / "deployment.json").read_text()
    assert launcher.alive(deployment) is None
    launcher.teardown(deployment)
    assert "sk-very-secret" not in (tmp_path / "deployment.json").read_text()
    assert not any(e["id"] == "ep.plain.r0" for e in ledger.entries())  # nothing to reap: nothing launched


@pytest.mark.engine
def test_gates_a_running_engine_and_leaves_it_running(engines, tmp_path: Path) -> None:
    engine = engines.get("plain")
    config = EndpointConfig(base_url=f"{engine.base_url}/v1", served_model_name=engine.served_model_name)
    launcher = EndpointLauncher(config=config)
    deployment = launcher.launch(TARGET, PLAIN, deployment_id="ep.direct.r0", directory=tmp_path)
    assert deployment.base_url == engine.base_url and deployment.served_model_name == "tiny-plain"
    wait_ready(deployment, launcher, timeout_s=30)
    facts = launcher.collect_facts(deployment)
    assert facts["max_model_len"] == 2048
    launcher.teardown(deployment)
    assert httpx.get(f"{engine.base_url}/health", timeout=10).status_code == 200  # still serving
    saved = json.loads((tmp_path / "deployment.json").read_text())
    assert saved["teardown"].startswith("endpoint: left running") and saved["launcher"] == "endpoint"


@pytest.mark.engine
def test_a_key_protected_gateway_needs_the_key(engines, tmp_path: Path) -> None:
    engine = engines.get("plain")
    with Gateway(engine.base_url, api_key="sk-gateway-key") as gateway:
        config = EndpointConfig(
            base_url=f"{gateway.url}/v1",
            api_key=SecretStr("sk-gateway-key"),
            metrics_url=engine.metrics_url,  # the gateway has no /metrics: straight to the replica head
            served_model_name=engine.served_model_name,
        )
        launcher = EndpointLauncher(config=config)
        deployment = launcher.launch(TARGET, PLAIN, deployment_id="ep.gateway.r0", directory=tmp_path / "ok")
        wait_ready(deployment, launcher, timeout_s=30)
        assert httpx.get(deployment.metrics_url, timeout=10).status_code == 200
        assert httpx.get(f"{gateway.url}/metrics", timeout=10).status_code == 404
        launcher.teardown(deployment)

        keyless = EndpointLauncher(config=config.model_copy(update={"api_key": None}))
        deployment = keyless.launch(TARGET, PLAIN, deployment_id="ep.nokey.r0", directory=tmp_path / "nokey")
        with pytest.raises(ReadinessTimeout, match="/health answered 401"):
            wait_ready(deployment, keyless, timeout_s=2, poll_s=0.5)
