"""The endpoint launcher: a server that already runs (a shared deployment, a gateway). Nothing is launched
or torn down; the deployment record only says where it is and how to authenticate."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

import httpx
from pydantic import SecretStr

from experiments.spec import EndpointLaunchSpec, ExperimentSpec, TargetSpec, Variant
from specgauge.errors import InputError
from specgauge.provenance import utc_now
from specgauge.redact import redact_url
from tasks.launch.base import Deployment
from tasks.launch.config import EndpointConfig, LauncherConfig, SavedSettings
from tasks.launch.provenance import remote_provenance
from tasks.launch.registry import register


def resolve_endpoint(spec: EndpointLaunchSpec, config: EndpointConfig | None = None) -> EndpointConfig:
    """The block's settings (`config`, read by the flow), overridden by the spec's base_url/metrics_url/api_key."""
    if config is None and spec.block:
        raise InputError(
            f"launcher: EndpointBlock {spec.block!r} was not read; the flow resolves it first "
            "(blocks.resolve_launcher_config)"
        )
    data: dict[str, Any] = config.model_dump() if config else {}
    for name in ("base_url", "metrics_url", "api_key"):
        if getattr(spec, name) is not None:
            data[name] = getattr(spec, name)
    if not data.get("base_url"):
        raise InputError("launcher: the endpoint launcher needs base_url (in the spec or its block)")
    return EndpointConfig.model_validate(data)


def split_userinfo(url: str) -> tuple[str, SecretStr | None]:
    """The URL without its `user:password@`, and that userinfo (decoded) as a secret: the deployment sends it
    as basic auth, so that the URL it carries (into messages, files, logs) holds no password."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url, None
    userinfo, _, host = parts.netloc.rpartition("@")
    user, colon, password = userinfo.partition(":")
    clean = urlunsplit((parts.scheme, host, parts.path, parts.query, parts.fragment))
    return clean, SecretStr(f"{unquote(user)}{colon}{unquote(password)}")


@register
class EndpointLauncher:
    kind = "endpoint"

    def __init__(
        self, spec: EndpointLaunchSpec | None = None, *, config: EndpointConfig | None = None
    ) -> None:
        if spec is None and config is None:
            raise InputError("the endpoint launcher needs a spec section or an EndpointConfig")
        self.spec = spec or EndpointLaunchSpec(base_url=config.base_url)  # type: ignore[union-attr]
        self.config = resolve_endpoint(self.spec, config)

    @classmethod
    def from_spec(cls, spec: EndpointLaunchSpec, config: LauncherConfig) -> EndpointLauncher:
        return cls(spec, config=config.endpoint)

    @classmethod
    def check_inputs(cls, experiment: ExperimentSpec) -> None:
        """Nothing to check before: the server is not ours (the readiness check asks it)."""

    @staticmethod
    def stop_leftover(entry: dict[str, Any], saved: SavedSettings | None = None) -> str:
        return "endpoint: nothing was launched"

    def launch(
        self, target: TargetSpec, variant: Variant, *, deployment_id: str, directory: Path
    ) -> Deployment:
        """Record where the server is; start nothing. The served name is the server's, not per variant."""
        config = self.config
        base_url, basic_auth = split_userinfo(config.base_url)
        metrics_url, metrics_auth = split_userinfo(config.metrics_url or f"{config.base_url}/metrics")
        deployment = Deployment(
            id=deployment_id,
            launcher=self.kind,
            variant=variant,
            served_model_name=config.served_model_name or target.served_model_name or target.model,
            base_url=base_url,
            metrics_url=metrics_url,
            directory=directory,
            started_at=utc_now(),
            extra={
                "block": self.spec.block,
                "authenticated": config.api_key is not None or basic_auth is not None,
                "node": urlsplit(base_url).hostname,
            },
            api_key=config.api_key,
            basic_auth=basic_auth or metrics_auth,
        )
        deployment.save()
        return deployment

    def place_on(self, node: str | None) -> None:
        """Nothing to choose: the server is where it is."""

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
        if deployment.provenance is None:  # a server specgauge did not launch: only its address is known
            deployment.provenance = remote_provenance(
                deployment.served_model_name,
                f"behind the endpoint {redact_url(deployment.base_url)}",
                None,
                overlays_known=False,
            )
        return facts

    def teardown(self, deployment: Deployment) -> None:
        deployment.status = "failed" if deployment.status == "failed" else "stopped"
        deployment.stopped_at = utc_now()
        deployment.teardown = "endpoint: left running (not launched by specgauge)"
        deployment.save()
