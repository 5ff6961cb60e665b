"""The blocks that documents of several kinds carry: who wrote them (ToolFacts), on which host (HostFacts),
and the variant they measured (VariantFacts)."""

from __future__ import annotations

from artifacts.documents.base import Configuration, Document, Text, Whole


class ToolFacts(Document):
    """specgauge.provenance.tool_facts()."""

    specgauge_version: Text | None = None
    git_revision: Text | None = None


class HostFacts(Document):
    """specgauge.provenance.host_facts(): hostname, platform, python, cpus."""

    hostname: Text | None = None


class VariantFacts(Configuration):
    """experiments.spec.Variant as JSON (`model_dump(mode="json")`): every field of it is kept."""

    name: Text
    method: Text | None = None
    k: Whole | None = None
    extra_args: list[Text] | None = None
