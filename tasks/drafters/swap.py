"""Hot swap: load another EAGLE-3 head into a running deployment, without a restart.

The engine must have been launched with `hot_swap: true` (experiments/spec.py): vLLM's dev mode
(`VLLM_SERVER_DEV_MODE=1`) and specgauge's worker extension (`engine_side/specgauge_swap.py`, named by
`--worker-extension-cls`). `swap_head`:

1. checks the new head against the target's drafter contract and against the serving head's structure
   (what the running drafter was built from: sizes, aux layers, norms, its set of tensors); a head that does
   not fit is refused (`SwapRefused`) before the engine is touched;
2. makes sure nothing is in flight (`vllm:num_requests_running` and `_waiting` are 0: a swap belongs
   between requests, the caller quiesces its load first);
3. calls the extension through `POST /collective_rpc`, which stages the whole head in new memory, refuses
   it there if it does not fit (the old head keeps serving), then copies it into the live parameters and
   packed weights and checks the live kernels compute with it; the RPC runs in the engine core between two
   engine steps;
4. verifies the head's digest as the engine read it equals `drafter_digest(head_dir)` computed here, resets
   the prefix cache (cached prefixes hold draft KV computed by the old head), and records the swap in the
   deployment's facts (deployment.json): its drafter becomes the new head, with the swap appended to
   `drafter.swaps`. Cells measured afterwards copy those facts, so they carry the new hash.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from artifacts import layout
from artifacts.documents import DeploymentFacts, DrafterFacts, DrafterSwap
from artifacts.store import read_document
from specgauge.checkpoints import drafter_digest, training_card
from specgauge.errors import InputError, MetricsError
from specgauge.provenance import utc_now
from specgauge.settings import REPO_ROOT
from tasks.drafters.contract import check_eagle3_head, head_tensors
from tasks.launch.base import Deployment
from tasks.launch.engine_side import SWAP_METHOD, VERIFY_METHOD
from tasks.metrics.prometheus import gauges, scrape

# Config keys the running drafter was built from (module shapes, norms, rotary embedding, which target
# layers feed it): a new head must agree on each, or it needs a restart.
STRUCTURAL_KEYS = (
    "architectures",
    "hidden_size",
    "target_hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "hidden_act",
    "rms_norm_eps",
    "vocab_size",
    "draft_vocab_size",
    "rope_theta",
    "rope_parameters",
    "rope_scaling",
    "max_position_embeddings",
    "attention_bias",
    "mlp_bias",
    "num_aux_hidden_states",
    "norm_before_fc",
    "fc_norm",
    "norm_output",
    "eagle_config",
    "eagle_aux_hidden_state_layer_ids",
    "tie_word_embeddings",
)


class SwapRefused(InputError):
    """The new head does not fit the running deployment (checked before any RPC, or by the engine while
    staging): nothing was changed. `field` names the rule broken."""

    def __init__(self, head: Path | str, field: str, message: str) -> None:
        self.head, self.field, self.message = str(head), field, message
        super().__init__(f"swap refused: {head}: {field}: {message}")


class SwapFailed(Exception):
    """The swap did not happen or could not be confirmed (RPC error, unreadable head, verification); the
    old head keeps serving unless the message says otherwise."""


@dataclass(frozen=True)
class SwapRecord:
    at: str  # UTC ISO-8601, when the swap was confirmed
    old_sha256: str | None  # drafter_digest of the head served before (None: it was not readable here)
    new_sha256: str
    head: str  # the new head's directory
    seconds: float = 0.0  # the whole swap: checks, RPC (stage, copy, verify), prefix-cache reset, record
    # The extension's answer: stage_s, commit_s (copy and probe), tensors, replaced (live tensors by kind)
    engine: dict[str, Any] = field(default_factory=dict)


def resolve_head(path: str | Path) -> Path:
    """A head path as a spec or a deployment's facts give it (relative paths from the repository root)."""
    candidate = Path(path)
    return candidate if candidate.is_absolute() else (REPO_ROOT / candidate).resolve()


def target_dir(deployment: Deployment) -> Path | None:
    """The target checkpoint the engine was started with (`--model` in its command), if it is a directory
    readable here."""
    command = list(deployment.command)
    for i, arg in enumerate(command[:-1]):
        if arg == "--model":
            path = Path(command[i + 1])
            return path if path.is_dir() else None
        if arg.startswith("--model="):
            path = Path(arg.split("=", 1)[1])
            return path if path.is_dir() else None
    return None


def _config(head_dir: Path) -> dict[str, Any]:
    try:
        data = json.loads((head_dir / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise SwapRefused(head_dir, "config", f"config.json is not readable ({exc})") from None
    if not isinstance(data, dict):
        raise SwapRefused(head_dir, "config", "config.json is not a JSON object")
    return data


def serving_head_dir(deployment: Deployment) -> Path | None:
    """The directory of the head the deployment's facts say it serves (None: plain, or not local)."""
    drafter = current_drafter(deployment)
    if drafter is None or not drafter.get("path"):
        return None
    path = resolve_head(drafter["path"])
    return path if path.is_dir() else None


def check_swap(deployment: Deployment, head_dir: Path | str) -> None:
    """Raise SwapRefused naming the field when `head_dir` cannot be swapped into `deployment`."""
    head = Path(head_dir).resolve()
    if deployment.variant.method != "eagle3":
        raise SwapRefused(head, "method", f"the deployment serves {deployment.variant.method!r}, not eagle3")
    if not deployment.variant.hot_swap:
        raise SwapRefused(
            head, "hot_swap", f"variant {deployment.variant.name!r} was launched without hot_swap: true"
        )
    if deployment.status != "ready":
        raise SwapRefused(head, "status", f"deployment {deployment.id} is {deployment.status}, not ready")
    target = target_dir(deployment)
    if target is None:
        raise SwapRefused(head, "target", "the target checkpoint is not a directory readable here")
    try:
        check_eagle3_head(target, head)
    except InputError as exc:
        field, _, message = str(exc).partition(": ")
        raise SwapRefused(head, field, message) from None
    serving = serving_head_dir(deployment)
    if serving is None:
        raise SwapRefused(head, "serving head", "the serving head's directory is not readable here")
    old, new = _config(serving), _config(head)
    for key in STRUCTURAL_KEYS:
        if old.get(key) != new.get(key):
            raise SwapRefused(
                head,
                key,
                f"{new.get(key)!r} where the serving head ({serving}) has {old.get(key)!r}: the running "
                "drafter was built for the latter (a restart is needed)",
            )
    old_tensors, new_tensors = head_tensors(serving), head_tensors(head)
    if set(old_tensors) != set(new_tensors):
        differ = sorted(set(old_tensors) ^ set(new_tensors))
        raise SwapRefused(
            head, "tensors", f"{', '.join(differ)} present in only one of it and the serving head ({serving})"
        )


def _as_dict(drafter: Any) -> dict[str, Any] | None:
    """A deployment's drafter as JSON (a loaded Deployment holds DrafterFacts, a launched one a dict)."""
    if not drafter:
        return None
    if hasattr(drafter, "model_dump"):
        return drafter.model_dump(mode="json", exclude_none=True)
    return json.loads(json.dumps(drafter))


def current_drafter(deployment: Deployment) -> dict[str, Any] | None:
    """The drafter the deployment serves now: the object's, unless its deployment.json records more swaps
    (a swap made through another Deployment object of the same deployment)."""
    memory = _as_dict(deployment.drafter)
    path = deployment.directory / layout.DEPLOYMENT_FILE
    if not path.is_file():
        return memory
    facts = read_document(path, DeploymentFacts)
    disk = facts.drafter.model_dump(mode="json", exclude_none=True) if facts.drafter else None
    if facts.id != deployment.id or disk is None:
        return memory
    return disk if len(disk.get("swaps") or []) > len((memory or {}).get("swaps") or []) else memory


def _rpc(deployment: Deployment, method: str, args: list[str], timeout_s: float) -> dict[str, Any]:
    try:
        response = httpx.post(
            f"{deployment.base_url}/collective_rpc",
            json={"method": method, "args": args, "timeout": timeout_s},
            headers=deployment.headers(),
            timeout=timeout_s + 10,
        )
    except httpx.HTTPError as exc:
        raise SwapFailed(f"{deployment.id}: /collective_rpc {method}: {type(exc).__name__}: {exc}") from None
    if response.status_code == 404:
        raise SwapFailed(
            f"{deployment.id}: /collective_rpc not found: the engine runs without VLLM_SERVER_DEV_MODE=1"
        )
    if response.status_code != 200:
        raise SwapFailed(
            f"{deployment.id}: /collective_rpc {method}: HTTP {response.status_code}: {response.text[:500]}"
        )
    results = response.json().get("results")
    if not isinstance(results, list) or not results or not all(isinstance(r, dict) for r in results):
        raise SwapFailed(
            f"{deployment.id}: /collective_rpc {method}: unexpected answer {response.text[:500]}"
        )
    failed = [r for r in results if not r.get("ok")]
    if failed:
        raise SwapFailed(f"{deployment.id}: {method}: {failed[0].get('error')}")
    return results[0] if len(results) == 1 else {**results[0], "workers": results}


def requests_in_flight(deployment: Deployment) -> int:
    """Running plus waiting requests on the deployment's engine, from /metrics."""
    figures = gauges(
        scrape(deployment.metrics_url, headers=deployment.headers()), deployment.served_model_name
    )
    return int(figures["running"] or 0) + int(figures["waiting"] or 0)


def swap_head(deployment: Deployment, head_dir: Path, *, timeout_s: float = 300) -> SwapRecord:
    """Load the EAGLE-3 head at `head_dir` into the running deployment and record it (module docstring).
    Raises SwapRefused (nothing touched) or SwapFailed (the old head keeps serving)."""
    started = time.perf_counter()
    head = Path(head_dir).resolve()
    check_swap(deployment, head)
    new_sha = drafter_digest(head)
    old = current_drafter(deployment)
    try:
        in_flight = requests_in_flight(deployment)
    except MetricsError as exc:
        raise SwapFailed(f"{deployment.id}: /metrics unreadable before the swap ({exc})") from None
    if in_flight:
        raise SwapFailed(
            f"{deployment.id}: {in_flight} requests running or waiting: swap between requests (quiesce the "
            "load first)"
        )
    answer = _rpc(deployment, SWAP_METHOD, [str(head)], timeout_s)
    if answer.get("sha256") != new_sha:
        raise SwapFailed(
            f"{deployment.id}: the engine loaded {head} with digest {answer.get('sha256')}, this side reads "
            f"{new_sha}: the head changed under the swap or the engine sees other files (it now serves "
            "what it read)"
        )
    try:
        reset = httpx.post(
            f"{deployment.base_url}/reset_prefix_cache", headers=deployment.headers(), timeout=60
        )
        reset_ok = reset.status_code == 200 and reset.json().get("success") is True
    except (httpx.HTTPError, ValueError):
        reset_ok = False
    if not reset_ok:
        raise SwapFailed(
            f"{deployment.id}: the new head serves but the prefix cache was not reset (cached prefixes keep "
            "draft KV of the old head)"
        )
    record = SwapRecord(
        at=utc_now(),
        old_sha256=(old or {}).get("sha256"),
        new_sha256=new_sha,
        head=str(head),
        seconds=time.perf_counter() - started,
        engine={k: answer[k] for k in ("stage_s", "commit_s", "tensors", "replaced") if k in answer},
    )
    record_swap(deployment, record, old)
    return record


def record_swap(deployment: Deployment, record: SwapRecord, old: dict[str, Any] | None) -> None:
    """The deployment now serves `record.head`: its drafter facts say so, with the swap appended."""
    swaps = list((old or {}).get("swaps") or [])
    swaps.append(
        DrafterSwap(
            at=record.at,
            old_sha256=record.old_sha256,
            new_sha256=record.new_sha256,
            head=record.head,
            seconds=round(record.seconds, 3),
            engine=record.engine,
        ).model_dump(mode="json")
    )
    drafter = DrafterFacts(
        method=deployment.variant.method,
        path=record.head,
        sha256=record.new_sha256,
        card=training_card(record.head),
        swaps=swaps,  # type: ignore[arg-type]
    )
    deployment.drafter = drafter.model_dump(mode="json", exclude_none=True)
    deployment.save()


def serving_drafter_sha256(deployment: Deployment) -> str | None:
    """The `drafter_digest` of the head the deployment serves now (None: it serves no drafter, or its head is
    not readable here). On a hot-swap deployment the engine confirms it computes with that head's weights;
    SwapFailed when it does not."""
    drafter = current_drafter(deployment)
    if drafter is None:
        return None
    if not deployment.variant.hot_swap or deployment.status != "ready":
        return drafter.get("sha256")
    head = serving_head_dir(deployment)
    if head is None:
        return drafter.get("sha256")
    answer = _rpc(deployment, VERIFY_METHOD, [str(head)], 120)
    if not answer.get("matches"):
        raise SwapFailed(
            f"{deployment.id}: the engine does not compute with {head} (its facts' head): "
            f"{answer.get('mismatches')}"
        )
    return str(answer["sha256"])
