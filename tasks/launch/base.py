"""What every launcher produces (a Deployment) and the start-up facts it reads from an engine log. What every
launcher promises is tasks/launch/protocol.py."""

from __future__ import annotations

import base64
import re
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal

from pydantic import SecretStr

from artifacts import layout
from artifacts.documents import DeploymentFacts
from artifacts.store import read_document, write_json
from experiments.spec import Variant

Status = Literal["starting", "ready", "failed", "stopped"]


@dataclass
class Deployment:
    """One launched (or adopted) engine serving one variant. Its deployment.json is DeploymentFacts."""

    id: str
    launcher: str
    variant: Variant
    served_model_name: str
    base_url: str
    metrics_url: str
    directory: Path
    command: list[str] = field(default_factory=list)
    log_path: Path | None = None
    started_at: str = ""
    status: Status = "starting"
    ready_s: float | None = None
    engine_version: str | None = None
    kv_cache_tokens: int | None = None
    max_model_len: int | None = None
    pid: int | None = None
    job_id: str | None = None
    stopped_at: str | None = None
    teardown: str | None = None
    # The drafter served, {method, path, sha256, card} (specgauge/checkpoints.py); None when plain.
    drafter: dict[str, Any] | None = None
    # What else can change a result: target hash, engine packages, overlays, hardware
    # (tasks/launch/provenance.py, artifacts.documents.ProvenanceFacts); None where not recorded.
    provenance: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    api_key: SecretStr | None = field(default=None, repr=False)
    # user:password of an endpoint's URL, taken out of base_url (tasks/launch/endpoint.py): sent as basic auth
    basic_auth: SecretStr | None = field(default=None, repr=False)

    def facts(self) -> DeploymentFacts:
        """deployment.json's document: every field but the credentials (secrets never reach artifacts)."""
        data = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in _CREDENTIALS}
        data["variant"] = self.variant.model_dump(mode="json")
        data["directory"] = str(self.directory)
        data["log_path"] = str(self.log_path) if self.log_path else None
        data["command"] = list(self.command)
        data["extra"] = dict(self.extra)
        if (
            self.engine_version is not None
        ):  # as a server reported it (an endpoint's /version may be a number)
            data["engine_version"] = str(self.engine_version)
        return DeploymentFacts.model_validate(data)

    def to_json(self) -> dict[str, Any]:
        return self.facts().model_dump(mode="json")

    def save(self) -> None:
        """Write deployment.json (a living record: rewritten at launch, when ready and at teardown)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        tmp = self.directory / f".{layout.DEPLOYMENT_FILE}.tmp"
        write_json(tmp, self.facts())
        tmp.replace(self.directory / layout.DEPLOYMENT_FILE)

    @classmethod
    def load(cls, path: Path) -> Deployment:
        facts = read_document(path, DeploymentFacts)
        data = {f.name: getattr(facts, f.name) for f in fields(cls) if f.name not in _CREDENTIALS}
        data["variant"] = Variant.model_validate(facts.variant.as_written())
        data["directory"] = Path(facts.directory or Path(path).parent)
        data["log_path"] = Path(facts.log_path) if facts.log_path else None
        data["command"] = list(facts.command or [])
        data["extra"] = dict(facts.extra or {})
        data["started_at"] = facts.started_at or ""
        return cls(**data)

    def authorization(self) -> str | None:
        """The Authorization header's value for this deployment's requests (Bearer key or Basic), if any."""
        return self.headers().get("Authorization")

    def headers(self) -> dict[str, str]:
        if self.api_key:
            return {"Authorization": f"Bearer {self.api_key.get_secret_value()}"}
        if self.basic_auth:
            token = base64.b64encode(self.basic_auth.get_secret_value().encode()).decode()
            return {"Authorization": f"Basic {token}"}
        return {}


_CREDENTIALS = ("api_key", "basic_auth")  # in memory only: never in deployment.json


# What the engine prints at start-up that provenance wants (vLLM 0.x, CPU and GPU wording).
_KV_CACHE = re.compile(r"(?:CPU|GPU) KV cache size: ([\d,]+) tokens")
_MAX_LEN = re.compile(r"Using max model len (\d+)")
_VERSION = re.compile(r"LLM engine \(v([^)]+)\)|version (\d+\.\d+\.\d+\S*)")
_MAX_CONCURRENCY = re.compile(r"Maximum concurrency for ([\d,]+) tokens per request: ([\d.]+)x")


def startup_facts(log_text: str) -> dict[str, Any]:
    """KV-cache capacity, max model length and engine version from an engine log (last value wins)."""
    facts: dict[str, Any] = {}
    if found := _KV_CACHE.findall(log_text):
        facts["kv_cache_tokens"] = int(found[-1].replace(",", ""))
    if found := _MAX_LEN.findall(log_text):
        facts["max_model_len"] = int(found[-1])
    if found := _VERSION.findall(log_text):
        facts["engine_version"] = next(v for pair in found for v in pair if v)
    if found := _MAX_CONCURRENCY.findall(log_text):
        facts["max_concurrency_at_len"] = {
            "tokens": int(found[-1][0].replace(",", "")),
            "x": float(found[-1][1]),
        }
    return facts


def tail(path: Path | None, lines: int = 60) -> str:
    if path is None or not path.exists():
        return ""
    with open(path, "rb") as fh:
        fh.seek(0, 2)
        size = fh.tell()
        fh.seek(max(size - 64 * 1024, 0))
        text = fh.read().decode("utf-8", errors="replace")
    return "\n".join(text.splitlines()[-lines:])


def apply_startup_facts(deployment: Deployment, facts: dict[str, Any]) -> dict[str, Any]:
    """Put what `startup_facts` found into the deployment (a fact not found keeps its value); returns facts."""
    deployment.kv_cache_tokens = facts.get("kv_cache_tokens", deployment.kv_cache_tokens)
    deployment.max_model_len = facts.get("max_model_len", deployment.max_model_len)
    deployment.engine_version = facts.get("engine_version", deployment.engine_version)
    return facts
