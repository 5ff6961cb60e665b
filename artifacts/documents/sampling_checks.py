"""Correctness under sampling: sampling_checks/<check_id>.json (SamplingCheckDocument), written once by
tasks.sampling_check.write_check: one treatment's samples against plain's and a second plain launch's, the
per-prompt, per-position statistics and the verdict (analysis.sampling_check)."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from artifacts.documents.base import Document, Flag, Number, Text, Time, Whole
from artifacts.documents.blocks import HostFacts, ToolFacts


class SamplingRule(Document):
    alpha: Number
    permutations: Whole
    max_critical_tv: Number
    min_prompts: Whole
    correction: Text
    statistic: Text


class SampledArm(Document):
    """One launch's samples: per prompt, `samples` lists of the first `tokens` token ids (-1: ended)."""

    role: Text  # plain | plain_again | treatment
    variant: Text
    deployment_id: Text
    seed_base: Whole
    samples: dict[str, list[list[int]]]
    wall_s: Number | None = None


class StatisticRow(Document):
    """One arm, prompt and statistic (position 0..m-1, or -1 for the whole m-token prefix)."""

    arm: Text  # treatment (plain vs the variant) | null (plain vs plain)
    prompt_id: Text
    position: int
    tv: Number
    p_value: Number
    critical_tv: Number
    null_tv_mean: Number
    prompt_p_value: Number
    prompt_p_holm: Number | None = None
    rejected: Flag


class SamplingCheckDocument(Document):
    """sampling_checks/<check_id>.json (docs/gate.md "Under sampling")."""

    format: Whole = 1
    check_id: Text
    campaign_id: Text
    created_utc: Time
    treatment_variant: Text
    method: Text | None = None
    outcome: Text  # pass | fail | inconclusive
    passed: Flag
    claim: Text
    reasons: list[Text] = Field(default_factory=list)
    rule: SamplingRule
    temperature: Number
    top_p: Number
    samples: Whole
    tokens: Whole
    prompt_ids: list[Text]
    arms: list[SampledArm]
    rows: list[StatisticRow]
    tool: ToolFacts | None = None
    host: HostFacts | None = None
    extra: dict[str, Any] = Field(default_factory=dict)
