"""What can change a deployment's results besides its variant: deployment.json's `provenance` block
(ProvenanceFacts, written by tasks.launch.provenance), copied into every cell, capture and profile with the
rest of the deployment's facts.

Each of its four parts either carries its fact or says why it is absent (`absent`: a reason in words). An
absent fact is never written as an empty value: an empty overlay list means no overlay was applied, a
missing GPU list with `gpus_absent` means none could be seen, and neither is the other."""

from __future__ import annotations

from artifacts.documents.base import Document, Number, Text, Whole


class TargetProvenance(Document):
    """The target model's weights, config and tokenizer (tasks.launch.provenance.target_digest): `sha256`
    over its identity files in name order, each entering as its name, its size and its own sha256; `path`
    the engine's `--model` (an absolute folder where it is local); `files` and `bytes` what was hashed;
    `rehashed` how many files were read this time (the others came from the cache, matched on path, size
    and mtime)."""

    path: Text
    sha256: Text | None = None
    absent: Text | None = None  # why there is no sha256 (a hub id, a cluster path, no weights)
    files: Whole | None = None
    bytes: Whole | None = None
    rehashed: Whole | None = None
    seconds: Number | None = None


class EnvironmentProvenance(Document):
    """The engine's Python packages: `sha256` of its `pip freeze` text (redacted of URL credentials), stored
    once per hash in RAW/<campaign>/environments/<sha256>.txt; `python` the interpreter asked."""

    sha256: Text | None = None
    absent: Text | None = None
    python: Text | None = None
    packages: Whole | None = None


class OverlayProvenance(Document):
    """vLLM source overlays (patches/, tasks.launch.overlay) the engine ran with: each patch's name and
    sha256 and each patched file's sha256; `sha256` over them (the sha256 of nothing, e3b0c442...: none
    applied); `absent` where it cannot be known (an endpoint that specgauge did not launch)."""

    sha256: Text | None = None
    absent: Text | None = None
    patches: list[dict[str, str]] | None = None
    files: list[dict[str, str]] | None = None


class HardwareProvenance(Document):
    """The engine host's CPU model, logical CPUs and physical cores, and its GPUs (name, driver, memory in
    MiB, from `nvidia-smi --query-gpu`). `gpus` is None with `gpus_absent` saying why (no nvidia-smi on PATH,
    or it failed); `absent` when the engine's host could not be probed at all (a cluster node, an endpoint)."""

    absent: Text | None = None
    cpu_model: Text | None = None
    cpus: Whole | None = None
    cpu_cores: Whole | None = None
    gpus: list[dict[str, str | int]] | None = None
    gpus_absent: Text | None = None


class ProvenanceFacts(Document):
    """deployment.json's `provenance`: the target's content hash, the engine's package lock, the overlays
    applied and the hardware. Two arms of one comparison that differ in any of them are flagged by the
    validity verdict (analysis.validity, docs/analysis.md "Validity")."""

    target: TargetProvenance
    environment: EnvironmentProvenance
    overlays: OverlayProvenance
    hardware: HardwareProvenance
