"""Correctness under sampling, around the statistics (analysis.sampling_check): judging three launches' samples
with a spec's rule, the verdict's artifact (RAW/<campaign>/sampling_checks/<check_id>.json, written once), and
what the report reads back from the warehouse (v_sampling_check) and draws: TV per position, with the band
chance alone gives."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

import altair as alt
import duckdb
import polars as pl

from analysis.charts import titled_facets
from analysis.data import _frame_if_present
from analysis.sampling_check import PREFIX, Rule, Samples, Verdict, as_samples, judge, verdict_rows
from artifacts import layout
from artifacts.documents.sampling_checks import SampledArm, SamplingCheckDocument
from artifacts.store import write_json_atomic
from experiments.spec import SamplingCheckSpec, Variant
from specgauge.errors import InputError
from specgauge.provenance import host_facts, tool_facts, utc_now

WIDTH, HEIGHT = 260, 180


def rule_of(check: SamplingCheckSpec) -> Rule:
    return Rule(alpha=check.alpha, permutations=check.permutations, max_critical_tv=check.max_critical_tv)


def judge_arms(
    plain: SampledArm, treatment: SampledArm, plain_again: SampledArm, check: SamplingCheckSpec
) -> Verdict:
    """analysis.sampling_check.judge on three launches' samples, with the spec's rule."""
    if plain.deployment_id == plain_again.deployment_id:
        raise InputError(
            f"the null arm needs two separately launched plain deployments, got {plain.deployment_id} twice"
        )

    def arrays(arm: SampledArm) -> dict[str, Samples]:
        return {pid: as_samples(rows, check.tokens) for pid, rows in arm.samples.items()}

    return judge(
        treatment.variant, arrays(plain), arrays(treatment), arrays(plain_again), rule=rule_of(check)
    )


def check_id_for(
    treatment: SampledArm, plain: SampledArm, plain_again: SampledArm, check: SamplingCheckSpec
) -> str:
    """`<variant>.<8 hex>` of the three launches and the check's settings: re-judging finds the same file."""
    key = json.dumps(
        [
            treatment.deployment_id,
            plain.deployment_id,
            plain_again.deployment_id,
            check.model_dump(mode="json"),
        ],
        sort_keys=True,
    )
    return f"{treatment.variant}.{hashlib.sha256(key.encode()).hexdigest()[:8]}"


def write_check(
    verdict: Verdict,
    arms: tuple[SampledArm, SampledArm, SampledArm],
    check: SamplingCheckSpec,
    *,
    campaign_id: str,
    raw_campaign_dir: Path,
    variant: Variant | None = None,
) -> Path:
    """Write RAW/<campaign>/sampling_checks/<check_id>.json once (arms: plain, treatment, plain again)."""
    plain, treatment, plain_again = arms
    check_id = check_id_for(treatment, plain, plain_again, check)
    document = SamplingCheckDocument.model_validate(
        {
            "check_id": check_id,
            "campaign_id": campaign_id,
            "created_utc": utc_now(),
            "treatment_variant": verdict.treatment,
            "method": variant.method if variant is not None else None,
            "outcome": verdict.outcome,
            "passed": verdict.passed,
            "claim": verdict.claim,
            "reasons": list(verdict.reasons),
            "rule": asdict(verdict.rule),
            "temperature": check.temperature,
            "top_p": 1.0,
            "samples": verdict.samples,
            "tokens": verdict.tokens,
            "prompt_ids": sorted(plain.samples),
            "arms": [arm.model_dump(mode="json") for arm in arms],
            "rows": verdict_rows(verdict),
            "tool": tool_facts(),
            "host": host_facts(),
        }
    )
    path = layout.sampling_check_file(raw_campaign_dir, check_id)
    write_json_atomic(path, document)
    return path


def load_sampling_checks(con: duckdb.DuckDBPyConnection, campaign_id: str) -> pl.DataFrame:
    """The latest check per treatment of a campaign, per arm and position (v_sampling_check); empty when none."""
    return _frame_if_present(
        con,
        "v_sampling_check",
        "SELECT * FROM v_sampling_check WHERE campaign_id = ? AND check_rank = 1 "
        "ORDER BY treatment_variant, arm, position",
        [campaign_id],
    )


def sampling_chart(view: pl.DataFrame) -> alt.FacetChart | None:
    """Mean TV per position (the prefix as 'all m'), plain vs each treatment as a line, and the band from the
    mean TV chance alone gives to the mean critical TV (a prompt above it is rejected); plain vs plain dashed."""
    if view.is_empty():
        return None
    frame = view.with_columns(
        pl.when(pl.col("position") == PREFIX)
        .then(pl.lit("all m"))
        .otherwise((pl.col("position") + 1).cast(pl.String))
        .alias("token"),
        pl.col("arm")
        .replace_strict({"treatment": "plain vs variant", "null": "plain vs plain"})
        .alias("pair"),
    ).select(
        "treatment_variant",
        "arm",
        "pair",
        "token",
        "mean_tv",
        "mean_null_tv",
        "mean_critical_tv",
        "rejected_in_arm",
    )
    order = [str(i + 1) for i in range(int(view["tokens"].max()))] + ["all m"]
    x = alt.X("token:N", title="generated token (all m: the whole prefix)", sort=order)
    base = alt.Chart(frame)
    band = (
        base.transform_filter(alt.datum.arm == "treatment")
        .mark_area(opacity=0.2, color="gray")
        .encode(x=x, y=alt.Y("mean_null_tv:Q", title="total-variation distance"), y2="mean_critical_tv:Q")
    )
    lines = base.mark_line(point=True).encode(
        x=x,
        y=alt.Y("mean_tv:Q", scale=alt.Scale(domain=[0, 1])),
        strokeDash=alt.StrokeDash("pair:N", title=None),
        color=alt.Color("pair:N", title=None),
        tooltip=[
            "treatment_variant",
            "pair",
            "token",
            alt.Tooltip("mean_tv:Q", format=".3f"),
            "rejected_in_arm",
        ],
    )
    return titled_facets(
        alt.layer(band, lines, data=frame),
        "Correctness under sampling: TV per position",
        "mean over prompts; gray: from what chance gives to what a prompt needs to be rejected",
        width=WIDTH,
        height=HEIGHT,
        column=alt.Column("treatment_variant:N", title="treatment"),
    )


def section_rows(view: pl.DataFrame) -> list[dict[str, Any]]:
    """One row per treatment: its verdict and claim (the report's table)."""
    if view.is_empty():
        return []
    return (
        view.filter(pl.col("arm") == "treatment")
        .unique("treatment_variant", keep="first", maintain_order=True)
        .select(
            "treatment_variant",
            "outcome",
            "passed",
            "n_prompts",
            "samples",
            "tokens",
            "temperature",
            "rejected_prompts",
            "null_rejected_prompts",
            "correction",
            "claim",
            "check_id",
        )
        .to_dicts()
    )
