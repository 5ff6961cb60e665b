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

import polars as pl
import yaml

from analysis.data import AnalysisSettings, CampaignData, load_campaign
from analysis.decision import decision_rule, gate_status
from analysis.options import deployment_options, measured, resolve_traffic_path, traffic_profile
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
from analysis.sequential_verification import report_confidence
from analysis.speedup import speedup_table
from analysis.validity import validity_table, verdict_of
from artifacts import layout
from artifacts.documents import DecisionDocument, DecisionLoad
from artifacts.documents.decisions import INCONCLUSIVE, REFUTED, DeploymentOption
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
        spec = verification_spec(
            data.spec,
            rec,
            fixed_k,
            repeats=rule.verify_repeats,
            gate=rule.verify_gate,
            max_launches=rule.max_launches,
            aa_control=rule.verify_aa_control,
        )
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
        data = load_campaign(con, campaign_id)
    return verification(data, verdict_settings(data))


def verdict_settings(data: CampaignData) -> AnalysisSettings:
    """The verification's verdicts at the level its launches were decided at: a verification that launched
    until it decided stopped on corrected intervals (analysis.sequential_verification), and only those keep
    their coverage; a fixed count of launches is judged at the usual 95%."""
    return AnalysisSettings(confidence=report_confidence(data.spec))


def launches_of(data: CampaignData, plan: VerificationPlan) -> dict[str, int | None]:
    """How many launches per arm the verification took (the schedule's repeat blocks launched) and the most it
    could take (its until-decided rule's max; None for a fixed count): the decision says both."""
    if not plan.spec or data.deployments.is_empty():
        return {"launches": None, "max_launches": None}
    arm = data.deployments.filter((pl.col("variant") == RECOMMENDED) & pl.col("control").is_null())
    repeats = data.spec.get("repeats")
    cap = repeats.get("max") if isinstance(repeats, dict) and repeats.get("until") == "decided" else None
    return {"launches": arm["repeat"].n_unique() or None, "max_launches": cap}


NOT_JUDGED = "not enough repeats to judge"  # a point or a zero-width interval: no verdict, no alert


def promoted_losses(verdicts: list[Verdict]) -> tuple[list[Verdict], list[Verdict]]:
    """The nightly re-verification of a promoted schedule, judged on intervals: (loads where it drafts and the
    interval of its throughput over plain lies wholly below 1, loads where it drafts that have no interval
    to judge by: one launch or a zero-width interval, NOT_JUDGED). A point estimate below 1 is neither."""
    drafted = [v for v in verdicts if v.k > 0]
    lost = [v for v in drafted if v.outcome == REFUTED]
    unjudged = [
        v
        for v in drafted
        if v.over_plain_low is None or v.over_plain_high is None or not v.over_plain_high > v.over_plain_low
    ]
    return lost, unjudged


# -- the decision -------------------------------------------------------------------------------------------
def invalid_reasons(validity: pl.DataFrame) -> str:
    """What makes a campaign invalid, in words (analysis.validity lists the verdict's own reasons first)."""
    reasons = str(validity["reasons"][0]) if not validity.is_empty() else ""
    named = [r for r in reasons.split("; ") if r.startswith("invalid:")]
    return "; ".join(r.removeprefix("invalid: ") for r in named) or reasons


def decision_loads(
    plan: VerificationPlan, verdicts: dict[int, Verdict], invalid: str | None
) -> list[DecisionLoad]:
    """Per measured load of the recommendation: its verdict (`verdicts` by concurrency), inconclusive where it
    was not measured, and inconclusive at every load of an invalid campaign (`invalid`: why), whose figures are
    kept but judge nothing."""
    rec = plan.recommendation
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
            claim = "beats plain" if choice.k else "no worse than plain"
            loads.append(DecisionLoad(**base, k=choice.k, claim=claim, outcome=INCONCLUSIVE, reason=missing))
            continue
        outcome, reason = verdict.outcome, verdict.reason
        if invalid is not None:
            outcome, reason = (
                INCONCLUSIVE,
                f"the verification campaign is invalid ({invalid}); measured: {reason}",
            )
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
                outcome=outcome,
                reason=reason,
            )
        )
    return loads


def decision_options(
    plan: VerificationPlan,
    data: CampaignData,
    sweep: CampaignData | None,
    traffic: str | Path | None,
    invalid: str | None,
) -> tuple[list[DeploymentOption], str, str, str]:
    """The whole deployment options (analysis.options) from the verification campaign (`data`; the sweep's when
    nothing was launched) and the sweep, weighed by `traffic` (a file; None: the spec's `decision.traffic`,
    else equal): (options, choice, why, where the traffic profile came from)."""
    rec, settings, rule = plan.recommendation, AnalysisSettings(), decision_rule(data)
    profile = traffic_profile(
        resolve_traffic_path(traffic or rule.traffic), [c.concurrency for c in rec.choices]
    )
    verified = data if plan.spec else None
    sweep = sweep if plan.spec else (sweep or data)
    sweep_validity = validity_table(sweep) if sweep is not None else None
    sweep_invalid = (
        invalid_reasons(sweep_validity)
        if sweep_validity is not None and verdict_of(sweep_validity) == "invalid"
        else None
    )
    campaigns = [
        m
        for m in (
            measured(verified, rec.workload, settings, invalid),
            measured(sweep, rec.workload, settings, sweep_invalid),
        )
        if m is not None
    ]
    recommended = next((v for v in (plan.spec or {}).get("variants") or [] if v["name"] == RECOMMENDED), None)
    options, choice, why = deployment_options(rec, recommended, campaigns, profile, rule, settings.confidence)
    return options, choice, why, profile.source


def decision_of(
    plan: VerificationPlan,
    data: CampaignData,
    validity: pl.DataFrame | None = None,
    sweep: CampaignData | None = None,
    traffic: str | Path | None = None,
) -> DecisionDocument:
    """The decision document from the plan and its verification campaign's data (in the warehouse), with that
    campaign's validity (analysis.validity.validity_table of the same data, unless given): an invalid campaign
    makes every load inconclusive, naming why. Nothing launched: no validity (None). With the whole
    deployment options (`decision_options`: the sweep's configs too when `sweep` is given) and the choice."""
    rec = plan.recommendation
    settings = verdict_settings(data)
    verdicts = {v.concurrency: v for v in verification(data, settings)} if plan.spec else {}
    if validity is None and plan.spec:
        validity = validity_table(data)
    verdict = verdict_of(validity) if validity is not None else None
    reasons = str(validity["reasons"][0]) if validity is not None and not validity.is_empty() else ""
    invalid = invalid_reasons(validity) if verdict == "invalid" and validity is not None else None
    loads = decision_loads(plan, verdicts, invalid)
    outcome = overall(loads)
    gate = gate_status(data).get(RECOMMENDED)
    caveats = [*plan.notes, *rec.caveats]
    if gate and gate["passed"] is False:  # a schedule that changes the greedy output is never confirmed
        outcome = REFUTED
        caveats.insert(0, f"the schedule failed its greedy-correctness gate ({gate['outcome']})")
    variant = next(v for v in plan.spec["variants"] if v["name"] == RECOMMENDED) if plan.spec else None
    options, choice, choice_reason, weighed = decision_options(plan, data, sweep, traffic, invalid)
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
        confidence=settings.confidence,
        loads=loads,
        outcome=outcome,
        **launches_of(data, plan),
        validity=verdict,
        validity_reasons=reasons,
        gate_passed=gate["passed"] if gate else None,
        gate_claim=gate["outcome"] if gate else None,
        summary="",
        caveats=caveats,
        traffic=weighed,
        options=options,
        choice=choice,
        choice_reason=choice_reason,
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
    validity = f"verification campaign {doc.validity}" if doc.validity else "validity not judged"
    choice = f"; deploy {doc.choice}" if doc.choice else ""
    return (
        f"{doc.method} on {doc.workload} ({ranges}): {doc.outcome.upper()} by launch "
        f"({confirmed} of {len(doc.loads)} loads confirmed; {gate}; {validity}{launches_text(doc)}){choice}"
    )


def launches_text(doc: DecisionDocument) -> str:
    """The summary's "; 4 launches per arm of at most 6" (empty when nothing was launched)."""
    if doc.launches is None:
        return ""
    cap = f" of at most {doc.max_launches}" if doc.max_launches is not None else ""
    return f"; {doc.launches} launch{'es' if doc.launches != 1 else ''} per arm{cap}"


_NOT_COMPARED = {"revision", "created_utc", "tool"}  # what a recomputation changes without a new answer


def write_decision(doc: DecisionDocument) -> tuple[Path, DecisionDocument]:
    """The decision under its verification campaign's raw folder. Raw artifacts are immutable, so a decision
    recomputed with other figures (a resumed verification that measured a failed load) is written as the next
    revision (`<decision_id>.rev<n>.json`; v_decision shows the latest); recomputed with the same figures, the
    latest file and its document are kept and returned."""
    directory = get_settings().raw_dir / doc.campaign_id
    revisions = layout.decision_revisions(directory, doc.decision_id)
    if revisions:
        latest_revision, latest_path = revisions[-1]
        latest = read_document(latest_path, DecisionDocument)
        if latest.model_dump(mode="json", exclude=_NOT_COMPARED) == doc.model_dump(
            mode="json", exclude=_NOT_COMPARED
        ):
            return latest_path, latest
        doc = doc.model_copy(update={"revision": latest_revision + 1})
    path = layout.decision_file(directory, doc.decision_id, doc.revision)
    write_json_atomic(path, doc)
    return path, doc
