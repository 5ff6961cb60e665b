"""The readiness check: a deployment is ready when /health answers, the served model is listed, and one short
chat completion succeeds. A dead engine ends the wait at once, with its log tail. (Not to be confused with
the correctness gate, tasks/gate.py, which judges greedy outputs.)"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from artifacts import layout
from experiments.spec import TargetSpec, Variant
from specgauge.errors import EngineDied, ReadinessTimeout
from tasks.launch import deployed
from tasks.launch.base import Deployment
from tasks.launch.protocol import Launcher

# Start-up deaths that trying again cannot cure: the engine could not build or load its model or drafter
# from what it was given (a missing or wrong path, a checkpoint whose tensors do not fit, an unknown
# architecture, an invalid speculative config, a missing package). Wording from vLLM 0.32's sources:
# transformers_utils/config.py, model_loader/{weight_utils,default_loader}.py, models/{registry,utils}.py,
# config/speculative.py, v1/worker/gpu_model_runner.py. Anything else (an OOM kill, a port taken, a lost
# node) stays transient.
_PERMANENT_START_FAILURE = re.compile(
    r"Invalid repository ID or local directory specified"
    r"|Attempted to load weight \("
    r"|There is no module or parameter named"
    r"|Cannot find any model weights with"
    r"|Model architectures \[.*\] are not supported for now"
    r"|Arctic Inference is required for suffix decoding"
    r"|Model does not support EAGLE3 interface"
    r"|^(?:\([\w-]+ pid=\d+\)\s*)?KeyError: '[\w.]+\.(?:weight|bias)'"
)
# The engine refused its config outright; its own reason, on the next lines, is named when listed above.
_INVALID_CONFIG = re.compile(r"validation errors? for (?:SpeculativeConfig|ModelConfig|VllmConfig)")
# Lines read from a dead engine's log to find its cause: vLLM prints the root cause of an engine-core
# failure above the front end's own, longer traceback.
CAUSE_LINES = 400


def permanent_start_failure(log_text: str) -> str | None:
    """The first line of an engine's log that says its start-up failed for good, or None."""
    lines = [line.strip() for line in log_text.splitlines()]
    for pattern in (_PERMANENT_START_FAILURE, _INVALID_CONFIG):
        if found := next((line for line in lines if pattern.search(line)), None):
            return found
    return None


def _check(client: httpx.Client, deployment: Deployment) -> str | None:
    """None when ready; otherwise what is still missing."""
    try:
        health = client.get(f"{deployment.base_url}/health")
        if health.status_code != 200:
            return f"/health answered {health.status_code}"
        models = client.get(f"{deployment.base_url}/v1/models")
        if models.status_code != 200:
            return f"/v1/models answered {models.status_code}"
        served = [m.get("id") for m in models.json().get("data", [])]
        if deployment.served_model_name not in served:
            return f"/v1/models lists {served}, not {deployment.served_model_name!r}"
        chat = client.post(
            f"{deployment.base_url}/v1/chat/completions",
            json={
                "model": deployment.served_model_name,
                "messages": [{"role": "user", "content": "Say hello."}],
                "max_tokens": 4,
                "temperature": 0,
            },
        )
        if chat.status_code != 200:
            return f"chat completion answered {chat.status_code}: {chat.text[:200]}"
        if not chat.json().get("choices"):
            return "chat completion returned no choices"
    except (httpx.TransportError, ValueError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def wait_ready(
    deployment: Deployment,
    launcher: Launcher,
    *,
    timeout_s: float = 600.0,
    poll_s: float = 1.0,
    request_timeout_s: float = 30.0,
) -> float:
    """Block until the deployment is ready; return seconds waited. Raises EngineDied or ReadinessTimeout."""
    started = time.monotonic()
    last = "not polled yet"
    with httpx.Client(timeout=request_timeout_s, headers=deployment.headers()) as client:
        while True:
            if launcher.alive(deployment) is False:
                deployment.status = "failed"
                cause = permanent_start_failure(launcher.log_tail(deployment, CAUSE_LINES))
                raise EngineDied(
                    f"deployment {deployment.id} ended before it was ready (last check: {last})"
                    + (f"; it cannot start with this model or drafter: {cause}" if cause else ""),
                    log_tail=launcher.log_tail(deployment),
                    transient=cause is None,
                )
            last = _check(client, deployment) or ""
            if not last:
                waited = time.monotonic() - started
                deployment.status = "ready"
                deployment.ready_s = round(waited, 3)
                return waited
            if time.monotonic() - started > timeout_s:
                deployment.status = "failed"
                raise ReadinessTimeout(
                    f"deployment {deployment.id} at {deployment.base_url} not ready after {timeout_s:.0f} s "
                    f"(last check: {last})",
                    log_tail=launcher.log_tail(deployment),
                    transient=True,
                )
            time.sleep(poll_s)


@contextmanager
def ready_deployment(
    launcher: Launcher,
    target: TargetSpec,
    variant: Variant,
    raw_dir: Path,
    deployment_id: str,
    timeout_s: float,
) -> Iterator[Deployment]:
    """`deployed` under raw_dir's deployments/, waited ready (`wait_ready`) and its facts collected; torn down
    on every exit path."""
    directory = layout.deployment_dir(raw_dir, deployment_id)
    with deployed(launcher, target, variant, deployment_id=deployment_id, directory=directory) as deployment:
        wait_ready(deployment, launcher, timeout_s=timeout_s)
        launcher.collect_facts(deployment)
        yield deployment
