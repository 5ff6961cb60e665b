"""EndpointBlock: an already running OpenAI-compatible server (URL, API key, metrics URL)."""

from __future__ import annotations

from prefect.blocks.core import Block
from pydantic import Field, SecretStr

from tasks.launch.config import EndpointConfig


class EndpointBlock(Block):
    """A server specgauge measures but does not launch or stop (a shared deployment, a gateway)."""

    _block_type_name = "Serving Endpoint"
    _block_type_slug = "specgauge-endpoint"
    _description = "An already running OpenAI-compatible server for specgauge's endpoint launcher."

    base_url: str = Field(
        description="Server root, e.g. https://api.example.org (without /v1). A user:password@ in it is sent "
        "as basic auth and never written by specgauge, but this page shows it: prefer api_key."
    )
    api_key: SecretStr | None = Field(default=None, description="Bearer key, if the server wants one.")
    metrics_url: str | None = Field(
        default=None,
        description="Prometheus /metrics URL; default BASE_URL/metrics (gateways often lack it).",
    )
    served_model_name: str | None = Field(
        default=None, description="Model id the server serves; default: derived from the spec's target."
    )

    def to_config(self) -> EndpointConfig:
        return EndpointConfig(
            base_url=self.base_url,
            api_key=self.api_key,
            metrics_url=self.metrics_url,
            served_model_name=self.served_model_name,
        )
