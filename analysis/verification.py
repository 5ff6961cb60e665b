"""Verifying a recommendation, as plain functions (flows/decide.py runs them): choose the recommendation to verify
from a sweep (analysis.recommend), write the campaign that launches it beside plain and the best fixed depth,
and once that campaign is in the warehouse, write the decision: per load what the schedule claims, what the
launch measured and whether it confirmed or refuted the claim (artifacts.documents.DecisionDocument).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from analysis.data import AnalysisSettings, CampaignData, load_campaign
from analysis.decision import decision_rule, gate_status
from analysis.recommend import (
    RECOMMENDED,
    Recommendation,
    Verdict,
    best_family,
    best_fixed_k,
    boundaries,
    overall,
    recommend,
    verification,
    verification_spec,
)
from analysis.speedup import speedup_table
from artifacts import layout
from artifacts.documents import DecisionDocument, DecisionLoad
from artifacts.store import read_document, write_json_atomic
from specgauge.errors import InputError
from specgauge.provenance import tool_facts, utc_now
from specgauge.settings import get_settings
from warehouse.db import reader


@dataclass
class VerificationPlan:
    """What a sweep recommends for one workload, and the campaign that verifies it."""

    source_campaign_id: str
    recommendation: Recommendation
    notes: list[str]  # where another family measured higher (analysis.recommend.best_family)
    fixed_k: int
    spec: dict[str, Any] | None  # the verification campaign's spec; None: speculation off at every load
    spec_path: Path | None = None
    source_spec: dict[str, Any] = field(default_factory=dict)

    @property
    def decision_id(self) -> str:
        """Names this recommendation: its workload and a hash of the sweep, family and schedule."""
        rec = self.recommendation
        key = json.dumps([self.source_campaign_id, rec.family, rec.schedule, self.fixed_k], sort_keys=True)
        return f"{rec.workload}-{hashlib.sha256(key.encode()).hexdigest()[:10]}"


def specs_dir() -> Path:
    return get_settings().home / "specs"


def plan_verification(
    campaign_id: str | None, workload: str | None = None, db: Path | str | None = None
) -> VerificationPlan:
    """The recommendation of `campaign_id` (the latest campaign when None) on `workload` (needed when the
    sweep measured several) and its verification campaign's spec, with the spec's `decision.verify_repeats`
    launches of each arm. Refuses (InputError) when the sweep has nothing to recommend from."""
    with reader(db) as con:
        data = load_campaign(con, campaign_id)
    settings = AnalysisSettings()
    speedups = speedup_table(data, settings)  # once: the recommendation and the best fixed depth read it
    found = recommend(data, settings, speedups=speedups)
    workloads = sorted({r.workload for r in found})
    if workload is None and len(workloads) > 1:
        raise InputError(
            f"campaign {data.campaign_id} recommends for {len(workloads)} workloads ({', '.join(workloads)}): "
            "give --workload"
        )
    found = [r for r in found if workload in (None, r.workload)]
    if not found:
        raise InputError(
            f"campaign {data.campaign_id}: no recommendation to verify"
            + (f" on workload {workload!r}" if workload else "")
            + " (it needs closed-loop speedups of a speculative variant)"
        )
    rec, notes = best_family(found)
    fixed_k = best_fixed_k(rec, data, settings, speedups=speedups)
    spec = None
    if rec.config is not None:
        rule = decision_rule(data)
        spec = verification_spec(data.spec, rec, fixed_k, repeats=rule.verify_repeats, gate=rule.verify_gate)
    return VerificationPlan(data.campaign_id, rec, notes, fixed_k, spec, source_spec=data.spec)


def write_verification_spec(
    campaign_id: str | None, workload: str | None = None, db: Path | str | None = None
) -> Path:
    """Write the verification campaign's spec under SPECGAUGE_HOME/specs/ and return its path. The same
    recommendation gives the same file."""
    plan = plan_verification(campaign_id, workload, db)
    if plan.spec is None:
        raise InputError(
            f"campaign {plan.source_campaign_id}: speculation is off at every load on "
            f"{plan.recommendation.workload}: nothing to launch"
        )
    return write_spec(plan)


def write_spec(plan: VerificationPlan) -> Path:
    """The plan's spec as a file (whole or not at all); sets and returns plan.spec_path."""
    assert plan.spec is not None
    path = specs_dir() / f"{plan.source_campaign_id}-verify-{plan.recommendation.workload}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(f".yaml.{os.getpid()}.tmp")
    partial.write_text(yaml.safe_dump(plan.spec, sort_keys=False))
    partial.replace(path)
    plan.spec_path = path
    return path


def verdicts_of(campaign_id: str, db: Path | str | None = None) -> list[Verdict]:
    with reader(db) as con:
        return verification(load_campaign(con, campaign_id), AnalysisSettings())


# -- the decision -------------------------------------------------------------------------------------------
def decision_of(plan: VerificationPlan, data: CampaignData) -> DecisionDocument:
    """The decision document from the plan and its verification campaign's data (in the warehouse)."""
    rec = plan.recommendation
    verdicts = {v.concurrency: v for v in verification(data, AnalysisSettings())} if plan.spec else {}
    missing = (
        "not measured in the verification campaign (a failed cell: see its report)"
        if plan.spec
        else "speculation is off at every load: nothing was launched to verify"
    )
    loads_measured = [c.concurrency for c in rec.choices]
    ranges = dict(zip(loads_measured, boundaries(loads_measured), strict=True))
    loads = []
    for choice in rec.choices:
        verdict = verdicts.get(choice.concurrency)
        start, end = ranges[choice.concurrency]
        base = {
            "concurrency": choice.concurrency,
            "batch_from": start,
            "batch_to": end,
            "sweep_speedup": choice.speedup,
            "sweep_interval": f"best depth k={choice.best_k}: {choice.speedup_interval}",
        }
        if verdict is None:
            loads.append(
                DecisionLoad(
                    **base,
                    k=choice.k,
                    claim="beats plain" if choice.k else "no worse than plain",
                    outcome="inconclusive",
                    reason=missing,
                )
            )
            continue
        loads.append(
            DecisionLoad(
                **base,
                k=verdict.k,
                claim=verdict.claim,
                over_plain=verdict.over_plain,
                over_plain_low=verdict.over_plain_low,
                over_plain_high=verdict.over_plain_high,
                over_plain_interval=verdict.over_plain_interval,
                n_repeats=verdict.n_repeats,
                over_fixed=verdict.over_fixed,
                over_fixed_low=verdict.over_fixed_low,
                over_fixed_high=verdict.over_fixed_high,
                outcome=verdict.outcome,
                reason=verdict.reason,
            )
        )
    outcome = overall(loads)
    gate = gate_status(data).get(RECOMMENDED)
    caveats = [*plan.notes, *rec.caveats]
    if gate and gate["passed"] is False:  # a schedule that changes the greedy output is never confirmed
        outcome = "refuted"
        caveats.insert(0, f"the schedule failed its greedy-correctness gate ({gate['outcome']})")
    variant = next(v for v in plan.spec["variants"] if v["name"] == RECOMMENDED) if plan.spec else None
    doc = DecisionDocument(
        decision_id=plan.decision_id,
        campaign_id=data.campaign_id,
        source_campaign_id=plan.source_campaign_id,
        workload=rec.workload,
        family=rec.family,
        method=rec.method,
        schedule=rec.schedule,
        speculative_config=rec.deployable_config(),
        variant=variant,
        target=plan.source_spec["target"],
        verification_spec=str(plan.spec_path or ""),
        fixed_k=plan.fixed_k,
        tolerance=decision_rule(data).guardrail,
        confidence=AnalysisSettings().confidence,
        loads=loads,
        outcome=outcome,
        gate_passed=gate["passed"] if gate else None,
        gate_claim=gate["outcome"] if gate else None,
        summary="",
        caveats=caveats,
        created_utc=utc_now(),
        tool=tool_facts(),
    )
    doc.summary = summary_line(doc)
    return doc


def summary_line(doc: DecisionDocument) -> str:
    """One sentence: the schedule, the method, and what the launch said."""
    ranges = ", ".join(
        f"batch {start}-{end}: " + (f"k={k}" if k else "off") for start, end, k in doc.schedule
    )
    confirmed = sum(load.outcome == "confirmed" for load in doc.loads)
    gate = {True: "gate passed", False: "GATE FAILED", None: "no gate verdict"}[doc.gate_passed]
    return (
        f"{doc.method} on {doc.workload} ({ranges}): {doc.outcome.upper()} by launch "
        f"({confirmed} of {len(doc.loads)} loads confirmed; {gate})"
    )


def write_decision(doc: DecisionDocument) -> tuple[Path, DecisionDocument]:
    """The decision under its verification campaign's raw folder, written once: a re-run of the same decision
    (the verification resumed from the same cells) keeps and returns the first file's document."""
    path = layout.decision_file(get_settings().raw_dir / doc.campaign_id, doc.decision_id)
    if path.exists():
        return path, read_document(path, DecisionDocument)
    write_json_atomic(path, doc)
    return path, doc
