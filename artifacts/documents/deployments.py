"""Deployments: deployments/<launch_id>/deployment.json (DeploymentFacts), the drafter it serves and its hot
swaps (DrafterFacts, DrafterSwap), the copy of it a cell, capture or profile keeps (EngineFacts), and the
engine settings it states it runs with (EffectiveEngineConfig, under `extra.effective_config`)."""

from __future__ import annotations

import hashlib
import json
from typing import Any, ClassVar, Literal

from artifacts.documents.base import Configuration, Document, Flag, Number, Text, Time, Whole
from artifacts.documents.blocks import VariantFacts
from artifacts.documents.provenance import ProvenanceFacts


class DrafterSwap(Document):
    """One hot swap of a running deployment's EAGLE-3 head (tasks.drafters.swap.swap_head): when it finished
    (UTC), the `drafter_digest` of the head served before and after, the new head's directory, and how long
    the swap took (contract check, RPC, verification)."""

    at: Time
    old_sha256: Text | None = None
    new_sha256: Text
    head: Text
    seconds: Number | None = None
    engine: dict[str, Any] | None = None  # the extension's answer: stage_s, commit_s, tensors, replaced


class DrafterFacts(Document):
    """The drafter a deployment serves (specgauge.checkpoints.drafter_record): the method, the path as
    the spec gave it, the sha256 over its weights and config.json (`drafter_digest`), and its training card's
    facts when it has one. Two campaigns whose drafters differ in `sha256` are never pooled. After a hot
    swap `path`, `sha256` and `card` are the head now serving and `swaps` lists every swap in order (the
    launched head is the first swap's `old_sha256`); a cell copies these facts as they were when it ran."""

    method: Text
    path: Text
    sha256: Text | None = None  # None where the drafter is not readable from here (a hub id, a cluster path)
    card: dict[str, Any] | None = None
    swaps: list[DrafterSwap] | None = None


class EngineFacts(Configuration):
    """What a cell, capture or profile records of the deployment it ran on: a copy of its DeploymentFacts
    (older and hand-written documents have only some of the fields)."""

    launcher: Text | None = None
    command: list[Text] | None = None
    engine_version: Text | None = None
    kv_cache_tokens: Whole | None = None
    max_model_len: Whole | None = None
    job_id: Text | int | None = None
    drafter: DrafterFacts | None = None
    provenance: ProvenanceFacts | None = None
    extra: dict[str, Any] | None = None


class DeploymentFacts(Configuration):
    """deployments/<launch_id>/deployment.json: one launched (or adopted) engine serving one variant,
    written by tasks.launch.base.Deployment.save at launch, when ready and at teardown (a living record).
    `id` is the launch id (artifacts.ids.launch_id); times are UTC ISO-8601; `ready_s` is how long the
    readiness check waited; `extra` holds launcher-specific facts (port, kv_cache_gib, node, ...). The API key
    is never written."""

    id: Text
    launcher: Text
    variant: VariantFacts
    served_model_name: Text | None = None
    base_url: Text | None = None
    metrics_url: Text | None = None
    directory: Text | None = None
    command: list[Text] | None = None
    log_path: Text | None = None
    started_at: Time | Literal[""] | None = None
    status: Text  # starting | ready | failed | stopped
    ready_s: Number | None = None
    engine_version: Text | None = None
    kv_cache_tokens: Whole | None = None
    max_model_len: Whole | None = None
    pid: Whole | None = None
    job_id: Text | int | None = None
    stopped_at: Time | None = None
    teardown: Text | None = None
    drafter: DrafterFacts | None = None
    # target hash, engine package lock, overlays, hardware (artifacts.documents.provenance); None: older
    provenance: ProvenanceFacts | None = None
    extra: dict[str, Any] | None = None


class EffectiveEngineConfig(Document):
    """deployment.json's `extra.effective_config`: the settings the engine states it runs with (its
    /server_info, start-up log and /metrics info gauges: tasks.metrics.engine_config), not the flags it was
    given. A setting no source stated is absent (unknown), never assumed. `sources`: what was read."""

    async_scheduling: Flag | None = None
    max_num_batched_tokens: Whole | None = None
    max_num_scheduled_tokens: Whole | None = None
    max_num_seqs: Whole | None = None
    chunked_prefill: Flag | None = None
    prefix_caching: Flag | None = None
    compilation_mode: Text | None = None
    cudagraph_mode: Text | None = None
    enforce_eager: Flag | None = None
    kv_cache_tokens: Whole | None = None
    dtype: Text | None = None
    kv_cache_dtype: Text | None = None
    tensor_parallel_size: Whole | None = None
    data_parallel_size: Whole | None = None
    speculative_method: Text | None = None
    speculative_tokens: Whole | None = None
    # how the launcher ran the engine's CPU threads (tasks/launch/cpu_runtime.py runtime_label: OpenMP runtime,
    # wait policy, binding, pages), stated by the local launcher: one launched otherwise is not alike
    cpu_runtime: Text | None = None
    sources: list[Text] = []  # noqa: RUF012 (a pydantic field)

    # what speculation itself changes: never a confound
    SPECULATIVE: ClassVar[frozenset[str]] = frozenset({"speculative_method", "speculative_tokens"})

    def stated(self) -> dict[str, Any]:
        """The settings a source stated, speculation's own left out."""
        data = self.model_dump(exclude_unset=True, exclude={"sources"})
        return {k: v for k, v in data.items() if k not in self.SPECULATIVE and k in type(self).model_fields}

    def key(self) -> str | None:
        """A hash of `stated()`: two deployments with equal keys ran with equal settings beyond speculation
        (None: nothing was stated)."""
        stated = self.stated()
        if not stated:
            return None
        return hashlib.sha256(json.dumps(stated, sort_keys=True).encode()).hexdigest()[:16]

    def differences(self, other: EffectiveEngineConfig) -> list[str]:
        """'setting: mine -> other's' for each setting beyond speculation that differs, and 'setting: not
        stated by <side>' where only one side states it (vLLM logs a change, not the value it kept)."""
        mine, theirs = self.stated(), other.stated()
        out = []
        for name in type(self).model_fields:
            if name in self.SPECULATIVE or name == "sources":
                continue
            if name in mine and name in theirs:
                if mine[name] != theirs[name]:
                    out.append(f"{name}: {mine[name]} -> {theirs[name]}")
            elif name in mine or name in theirs:
                out.append(f"{name}: not stated by {'plain' if name not in mine else 'speculative'}")
        return out
