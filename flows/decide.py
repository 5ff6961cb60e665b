"""The decide flow: the decision loop, top to bottom.

sweep (a campaign of the spec, or a finished one) -> recommend (per batch-size range a method and depth, or
off: analysis.recommend) -> verify (a campaign launching plain, the best fixed depth and the recommended
schedule the same way, `decision.verify_repeats` times each) -> decide (from the ingested verification
campaign: per load what the schedule claims, what the launch measured and the verdict on the benefit rule,
with the campaign's validity; a new revision when recomputed with other figures; ingested, in the report) ->
sign off (in the UI: the run pauses for a person's approval, typed input, only for a confirmed decision of a
valid campaign) -> promote (the config files a team deploys; the nightly regression runs the promoted config).
"""

from __future__ import annotations

import json
from typing import Any

from prefect import flow, get_run_logger, pause_flow_run, task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE
from prefect.input import RunInput
from pydantic import BaseModel, Field

from analysis.verification import VerificationPlan, decision_of, plan_verification, write_decision, write_spec
from flows.analyze import AnalysisRequest
from flows.analyze import analyze as analyze_flow
from flows.campaign import CampaignRequest, ExperimentFile, campaign, spec_file_of
from flows.ingest import ingest as ingest_flow
from specgauge.settings import get_settings
from warehouse.db import reader

DECISION_SPEC = ExperimentFile("experiments/decision.yaml")


class DecisionRequest(BaseModel):
    """What to decide: the run form of the `decide` deployment (each field's description is its help)."""

    spec: ExperimentFile = Field(
        default=DECISION_SPEC, description="The sweep's experiment spec, from the repo's experiments/ folder."
    )
    spec_path: str | None = Field(
        default=None,
        description="Another sweep spec instead (repo-relative or absolute, on the worker's machine).",
    )
    sweep_campaign_id: str | None = Field(
        default=None,
        description="Verify the recommendation of this finished campaign instead of running the spec's sweep.",
    )
    label: str | None = Field(default=None, description="A run label: fresh campaigns instead of resuming.")
    workload: str | None = Field(
        default=None, description="The workload (stratum) to decide for, when the sweep measured several."
    )
    traffic: str | None = Field(
        default=None,
        description="A traffic profile weighing the loads when whole deployment options are compared (a list of "
        "{concurrency, share}, or a Prometheus range export of vllm:num_requests_running; on the worker's "
        "machine). Empty: the spec's decision.traffic, else equal over the measured loads.",
    )
    sign_off: bool = Field(
        default=True,
        description="Pause for a person's approval before the verified config is promoted (the nightly "
        "regression runs the promoted config). Off: the decision is recorded, nothing is promoted.",
    )
    sign_off_timeout_s: int = Field(
        default=7 * 24 * 3600, gt=0, description="How long the run waits for the approval before it fails."
    )


class Approval(RunInput):
    """A person's answer to a verified decision (the form the paused run shows)."""

    approve: bool = Field(description="Promote this config: the nightly regression runs it from now on.")
    approver: str = Field(min_length=1, description="Who signs off (name or handle).")
    note: str = Field(default="", description="Why, or what to watch.")


@task(name="recommend", cache_policy=NO_CACHE)
def recommend_task(campaign_id: str, workload: str | None) -> VerificationPlan:
    plan = plan_verification(campaign_id, workload)
    if plan.spec is not None:
        write_spec(plan)
    logger = get_run_logger()
    rec = plan.recommendation
    logger.info("recommended %s on %s: schedule %s", rec.family, rec.workload, rec.schedule)
    for note in plan.notes:
        logger.info("%s", note)
    return plan


@task(name="decision", cache_policy=NO_CACHE)
def decision_task(plan: VerificationPlan, campaign_id: str, traffic: str | None = None) -> dict[str, Any]:
    """The decision from the warehouse as it is now (recomputed on every run: a resumed verification that
    measured a failed load gives a new revision), judged with the campaign's validity from the same data, its
    whole deployment options from the verification and the sweep, weighed by `traffic`."""
    from analysis.data import load_campaign

    with reader() as con:
        data = load_campaign(con, campaign_id)
        sweep = load_campaign(con, plan.source_campaign_id) if plan.spec else None
    path, doc = write_decision(decision_of(plan, data, sweep=sweep, traffic=traffic))
    get_run_logger().info("decision %s (revision %d): %s", doc.decision_id, doc.revision, doc.summary)
    create_markdown_artifact(
        key=f"decision-{doc.decision_id}".lower().replace("_", "-").replace(".", "-"),
        markdown=decision_markdown(doc.model_dump(mode="json")),
        description=doc.summary,
    )
    return {"decision_id": doc.decision_id, "path": str(path), **doc.model_dump(mode="json")}


def refusal_of(decision: dict[str, Any]) -> str | None:
    """Why the decision may not be promoted (DecisionDocument.refusal; None: it may)."""
    from artifacts.documents import DecisionDocument

    return DecisionDocument.model_validate(decision).refusal()


def span(x: float | None, lo: float | None, hi: float | None) -> str:
    """A ratio with its interval, as the decision's tables print it."""
    if x is None:
        return "–"
    return f"{x:.3f}x" + (f" [{lo:.3f}, {hi:.3f}]" if lo is not None else " (no interval)")


def decision_markdown(doc: dict[str, Any]) -> str:
    """The decision as the run's artifact and the sign-off form's description."""
    lines = [
        f"# Decision {doc['decision_id']}: {doc['outcome'].upper()}",
        "",
        doc["summary"],
        "",
        f"Validity of the verification campaign: {doc.get('validity') or 'not judged'}"
        + (f" ({doc['validity_reasons']})" if doc.get("validity_reasons") else ""),
        "",
        "| batch sizes | k | claim | sweep | launched: over plain | over fixed depth | outcome |",
        "|---|---|---|---|---|---|---|",
    ]
    for load in doc["loads"]:
        lines.append(
            f"| {load['batch_from']}-{load['batch_to']} (C={load['concurrency']}) | {load['k'] or 'off'} | "
            f"{load['claim']} | {span(load['sweep_speedup'], None, None)} | "
            f"{span(load['over_plain'], load['over_plain_low'], load['over_plain_high'])} | "
            f"{span(load['over_fixed'], load['over_fixed_low'], load['over_fixed_high'])} | "
            f"{load['outcome']}: {load['reason']} |"
        )
    lines += options_markdown(doc)
    if doc.get("speculative_config"):
        lines += ["", "`--speculative-config`:", "", "```json", json.dumps(doc["speculative_config"]), "```"]
    lines += ["", *(f"- {note}" for note in doc.get("caveats") or [])]
    return "\n".join(lines)


def options_markdown(doc: dict[str, Any]) -> list[str]:
    """The whole deployment options weighed by traffic, and the choice (none in older decisions)."""
    if not doc.get("options"):
        return []
    lines = [
        "",
        f"Deployment options, weighed by traffic ({doc.get('traffic')}):",
        "",
        "| option | expected gain over plain | worst load | may be chosen |",
        "|---|---|---|---|",
    ]
    for option in doc["options"]:
        worst = (
            f"C={option['worst_concurrency']}: "
            + span(option["worst"], option["worst_low"], option["worst_high"])
            if option.get("worst_concurrency") is not None
            else "–"
        )
        lines.append(
            f"| {option['name']} ({option['description']}) | "
            f"{span(option['gain'], option['gain_low'], option['gain_high'])} | {worst} | "
            f"{'yes' if option['eligible'] else 'no'}: {option['reason']} |"
        )
    return [*lines, "", f"**Deploy: {doc['choice']}**. {doc.get('choice_reason', '')}"]


@task(name="promote", cache_policy=NO_CACHE)
def promote_task(decision: dict[str, Any], approval: Approval | None, via: str) -> dict[str, Any]:
    from tasks.promote import promote_decision

    if approval is None:
        refusal = refusal_of(decision) if decision.get("speculative_config") else None
        why = f"not promotable: {refusal}" if refusal else "no sign-off asked (sign_off off)"
        return {"promoted": False, "why": why}
    return promote_decision(decision["decision_id"], approval.approve, approval.approver, approval.note, via)


def sign_off(decision: dict[str, Any], timeout_s: int) -> Approval:
    """Pause the run until a person answers in the UI (Prefect's typed run input)."""
    get_run_logger().info("waiting for a sign-off of %s (resume the run in the UI)", decision["decision_id"])
    return pause_flow_run(
        wait_for_input=Approval.with_initial_data(
            description=decision_markdown(decision), approve=False, approver="", note=""
        ),
        timeout=timeout_s,
        key=f"sign-off-{decision['decision_id']}",
    )


@flow(name="decide", log_prints=True)
def decide(request: DecisionRequest | None = None) -> dict[str, Any]:
    """Decide whether and how to turn speculative decoding on: sweep, recommend, verify the schedule by a
    launch, record the verdict per load, and (with sign-off) promote the config after a person's approval."""
    request = request or DecisionRequest()
    spec = spec_file_of({"spec": request.spec, "spec_path": request.spec_path})
    # issue 34: from a deployment (the UI), specs only under experiments/ or SPECGAUGE_SPEC_DIRS
    from experiments.loader import flow_spec_path

    flow_spec_path(spec)
    sweep_id = (
        request.sweep_campaign_id
        or campaign(CampaignRequest(spec_path=spec, label=request.label))["campaign_id"]
    )
    plan = recommend_task(sweep_id, request.workload)
    campaign_id = sweep_id
    if plan.spec_path is not None:  # speculation on somewhere: launch the schedule
        verification = CampaignRequest(spec_path=str(plan.spec_path), label=request.label, analyze=False)
        campaign_id = campaign(verification)["campaign_id"]
    # The campaign flow ingested its cells; the decision reads them, and judges their validity, from the
    # warehouse (analysis.validity on the same data the analysis below reads).
    decision = decision_task(plan, campaign_id, request.traffic)
    ingest_flow(raw_dir=str(get_settings().raw_dir), campaign_id=campaign_id)  # the decision: in the report
    analysis = analyze_flow(AnalysisRequest(campaign_id=campaign_id))
    report = analysis["report"]
    refusal = refusal_of(decision) if plan.spec else None
    if refusal is not None:  # the run ends saying why instead of asking for a sign-off
        get_run_logger().info("not promotable, no sign-off asked: %s", refusal)
    approval = (
        sign_off(decision, request.sign_off_timeout_s)
        if request.sign_off and plan.spec and refusal is None
        else None
    )
    promotion = promote_task(decision, approval, via="prefect-ui")
    if approval is not None:  # the answer is a raw artifact too: v_decision shows who signed off
        ingest_flow(raw_dir=str(get_settings().raw_dir), campaign_id=campaign_id)
    return {
        "sweep_campaign_id": sweep_id,
        "campaign_id": campaign_id,
        "decision": decision,
        "report": report,
        "promotion": promotion,
        # the verification campaign's own validity (analysis/validity.py), as the decision was judged with it
        "validity": {"verdict": decision.get("validity"), "reasons": decision.get("validity_reasons")},
    }
