"""The endpoint launcher: a server that already runs (a shared deployment, a gateway). Nothing is launched
or torn down; the deployment record only says where it is and how to authenticate."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
from pydantic import BaseModel, ConfigDict, SecretStr, field_validator

from experiments.spec import EndpointLauncher as EndpointLauncherSpec
from experiments.spec import TargetSpec, Variant
from specgauge.errors import InputError
from specgauge.provenance import utc_now
from tasks.launch.base import Deployment


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
        """The server root: the health gate and the client add /v1/... themselves."""
        if not value.startswith(("http://", "https://")):
            raise ValueError(f"base_url {value!r} must start with http:// or https://")
        value = value.rstrip("/")
        return value.removesuffix("/v1")


def resolve_endpoint(spec: EndpointLauncherSpec, config: EndpointConfig | None = None) -> EndpointConfig:
    """The block's settings (or `config`), overridden by the spec's base_url/metrics_url/api_key."""
    if config is None and spec.block:
        from blocks.endpoint import EndpointBlock

        try:
            config = EndpointBlock.load(spec.block).to_config()
        except (ValueError, RuntimeError) as exc:
            raise InputError(f"no EndpointBlock named {spec.block!r} could be loaded ({exc})") from None
    data: dict[str, Any] = config.model_dump() if config else {}
    for name in ("base_url", "metrics_url", "api_key"):
        if getattr(spec, name) is not None:
            data[name] = getattr(spec, name)
    if not data.get("base_url"):
        raise InputError("launcher: the endpoint launcher needs base_url (in the spec or its block)")
    return EndpointConfig.model_validate(data)


class EndpointLauncher:
    kind = "endpoint"

    def __init__(
        self, spec: EndpointLauncherSpec | None = None, *, config: EndpointConfig | None = None
    ) -> None:
        if spec is None and config is None:
            raise InputError("the endpoint launcher needs a spec section or an EndpointConfig")
        self.spec = spec or EndpointLauncherSpec(base_url=config.base_url)  # type: ignore[union-attr]
        self.config = resolve_endpoint(self.spec, config)

    def launch(
        self, target: TargetSpec, variant: Variant, *, deployment_id: str, directory: Path
    ) -> Deployment:
        """Record where the server is; start nothing. The served name is the server's, not per variant."""
        config = self.config
        deployment = Deployment(
            id=deployment_id,
            launcher=self.kind,
            variant=variant,
            served_model_name=config.served_model_name or target.served_model_name or target.model,
            base_url=config.base_url,
            metrics_url=config.metrics_url or f"{config.base_url}/metrics",
            directory=directory,
            started_at=utc_now(),
            extra={"block": self.spec.block, "authenticated": config.api_key is not None},
            api_key=config.api_key,
        )
        deployment.save()
        return deployment

    def alive(self, deployment: Deployment) -> bool | None:
        return None  # not ours: the gate's HTTP checks are all there is

    def log_tail(self, deployment: Deployment, lines: int = 60) -> str:
        return f"(endpoint {deployment.base_url}: its logs are not reachable from specgauge)"

    def collect_facts(self, deployment: Deployment) -> dict[str, Any]:
        """What the server tells about itself: /version and the model's max_model_len (best effort)."""
        facts: dict[str, Any] = {}
        try:
            with httpx.Client(timeout=10, headers=deployment.headers()) as client:
                version = client.get(f"{deployment.base_url}/version")
                if version.status_code == 200:
                    facts["engine_version"] = version.json().get("version")
                models = client.get(f"{deployment.base_url}/v1/models")
                if models.status_code == 200:
                    for model in models.json().get("data", []):
                        if model.get("id") == deployment.served_model_name and model.get("max_model_len"):
                            facts["max_model_len"] = int(model["max_model_len"])
        except (httpx.HTTPError, ValueError):
            pass
        deployment.engine_version = facts.get("engine_version", deployment.engine_version)
        deployment.max_model_len = facts.get("max_model_len", deployment.max_model_len)
        return facts

    def teardown(self, deployment: Deployment) -> None:
        deployment.status = "failed" if deployment.status == "failed" else "stopped"
        deployment.stopped_at = utc_now()
        deployment.teardown = "endpoint: left running (not launched by specgauge)"
        deployment.save()
