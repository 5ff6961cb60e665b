"""The regression flow: run the regression spec as a fresh campaign, compare it with the spec's reference
run, and end Failed (with an event and an artifact saying what moved) when a guarded figure regressed."""

from typing import Any

from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact
from prefect.states import Failed
from pydantic import BaseModel, Field

from analysis.regression import (
    NOT_JUDGED,
    as_rows,
    compare_campaigns,
    current_reference,
    markdown,
    set_reference,
)
from analysis.run import report_path
from analysis.serve import report_url
from experiments.plan import resolve_repo_path
from experiments.spec import load_spec
from flows.alerts import PROMOTED_REGRESSED, REGRESSION_DETECTED, REGRESSION_FAILED, alert
from flows.campaign import CampaignRequest, campaign
from specgauge.provenance import utc_stamp
from specgauge.settings import get_settings
from warehouse.db import reader

REGRESSED = "regressed against"  # in the Failed message of a detected regression
NIGHTLY_SPEC = "experiments/nightly.yaml"


class RegressionRequest(BaseModel):
    """What to check: the run form of the `regression` deployment (each field's description is its help)."""

    spec: str = Field(
        default=NIGHTLY_SPEC,
        description="The regression spec (repo-relative or absolute on the worker's machine).",
    )
    label: str | None = Field(
        default=None, description="The new campaign's label. Empty: the UTC time of the run."
    )
    tolerance: float = Field(
        default=0.10,
        description="How far a guarded figure (speedup, acceptance) may fall below the reference's before it "
        "counts as a regression, as a fraction (0.10: 10%), beyond its interval.",
    )
    reference: str | None = Field(
        default=None,
        description="The campaign to compare with. Empty: the spec's stored reference (the first run).",
    )


@flow(name="regression-check")
def regression_check(
    current: str, spec_name: str, reference: str | None = None, tolerance: float = 0.10
) -> Any:
    """Compare campaign `current` with `reference` (default: the spec's stored reference) in the warehouse.

    With no reference yet, `current` becomes it. A regression ends the run Failed, emits the event
    `specgauge.regression.detected` and leaves a markdown artifact with what moved and by how much."""
    logger = get_run_logger()
    home = get_settings().home
    key = "regression-" + "".join(c if c.isalnum() else "-" for c in spec_name.lower())
    reference = reference or current_reference(home, spec_name)
    if reference is None:
        set_reference(home, spec_name, current, "first regression run of this spec")
        create_markdown_artifact(
            key=key,
            markdown=f"# Regression: `{current}` is now the reference of `{spec_name}`\n\n"
            "There was no reference run yet; later runs are compared with this one.",
        )
        logger.info("no reference for %s: %s becomes it", spec_name, current)
        return {"campaign_id": current, "reference": current, "regressed": [], "checked": 0}
    with reader() as con:
        changes = compare_campaigns(con, current, reference, tolerance=tolerance)
    create_markdown_artifact(
        key=key,
        markdown=markdown(current, reference, changes, tolerance),
        description=f"{current} vs {reference}",
    )
    regressed = [c for c in changes if c.regressed]
    unjudged = [c for c in changes if not c.judged]
    outcome = {
        "campaign_id": current,
        "reference": reference,
        "regressed": as_rows(regressed),
        "checked": len(changes),
        "not_judged": len(unjudged),
    }
    if unjudged:  # a point or a zero-width interval: said, never alerted on
        logger.warning("%d of %d figures: %s", len(unjudged), len(changes), NOT_JUDGED)
    if not regressed:
        logger.info("no regression against %s (%d figures checked)", reference, len(changes))
        return outcome
    moved = "; ".join(
        f"{c.variant}/{c.workload}/{c.load} {c.figure} x{c.ratio:.2f} [{c.low:.2f}, {c.high:.2f}]"
        for c in regressed
    )
    alert(
        REGRESSION_DETECTED,
        current,
        title=f"{len(regressed)} figure(s) of {spec_name} regressed against {reference}",
        summary=moved,
        report=report_url(report) if (report := report_path(current)).exists() else None,
        reference=reference,
        regressed=outcome["regressed"],
        checked=outcome["checked"],
    )
    logger.error("regressed against %s: %s", reference, moved)
    return Failed(message=f"{len(regressed)} figure(s) {REGRESSED} {reference}: {moved}", data=outcome)


def _alert_failed_run(flow, flow_run, state) -> None:
    """on_failure/on_crashed hook of the regression flow: a run that ended without a verdict (a launch that
    failed, a crash) tells someone too; a detected regression has already said more."""
    message = state.message or state.name
    if REGRESSED in message or LOST in message:
        return
    spec = (flow_run.parameters.get("request") or {}).get("spec") or NIGHTLY_SPEC
    alert(
        REGRESSION_FAILED,
        f"regression-{flow_run.name}",
        title=f"the regression run {flow_run.name} of {spec} ended {state.name} without a verdict",
        summary=message,
        report=None,
    )


LOST = "stopped beating plain"  # in the Failed message of a promoted config that lost


@flow(name="promoted-check")
def promoted_check(label: str | None = None) -> Any:
    """Re-run the verification of the latest promoted decision (plain, the best fixed depth and the promoted
    schedule, launched as when it was verified) and end Failed, with an alert, when the schedule no longer
    beats plain at a load where it drafts: the interval of its throughput over plain wholly below 1. A load
    without an interval (one launch, or a zero-width interval) says "not enough repeats to judge" instead."""
    from analysis.verification import NOT_JUDGED, promoted_losses, verdicts_of
    from artifacts.documents import read_decision
    from tasks.promote import latest_promoted_decision

    logger = get_run_logger()
    decision_id = latest_promoted_decision(get_settings().home)
    if decision_id is None:
        logger.info("no promoted config: nothing to check")
        return {"decision_id": None, "lost": []}
    _, decision = read_decision(get_settings().raw_dir, decision_id)
    result = campaign(
        CampaignRequest(spec_path=decision.verification_spec, label=label or utc_stamp(), gate=False)
    )
    verdicts = verdicts_of(result["campaign_id"])
    lost, unjudged = promoted_losses(verdicts)
    if unjudged:
        logger.warning("%s at %s", NOT_JUDGED, ", ".join(f"C={v.concurrency}" for v in unjudged))
    create_markdown_artifact(
        key=f"promoted-{decision_id}".lower().replace("_", "-").replace(".", "-"),
        markdown="\n".join(
            [f"# Promoted {decision_id}: {len(lost)} load(s) lost", *(f"- {v.text()}" for v in verdicts)]
        ),
        description=f"the promoted config re-verified in {result['campaign_id']}",
    )
    outcome = {
        "decision_id": decision_id,
        "campaign_id": result["campaign_id"],
        "lost": [v.text() for v in lost],
        "not_judged": [f"C={v.concurrency}: {NOT_JUDGED}" for v in unjudged],
    }
    if not lost:
        logger.info("the promoted %s still beats plain where it drafts", decision_id)
        return outcome
    summary = "; ".join(v.text() for v in lost)
    alert(
        PROMOTED_REGRESSED,
        result["campaign_id"],
        title=f"the promoted config {decision_id} {LOST} at {len(lost)} load(s)",
        summary=summary,
        report=report_url(report) if (report := report_path(result["campaign_id"])).exists() else None,
        decision_id=decision_id,
    )
    return Failed(message=f"promoted {decision_id} {LOST}: {summary}", data=outcome)


@flow(name="regression", on_failure=[_alert_failed_run], on_crashed=[_alert_failed_run])
def regression(request: RegressionRequest | None = None) -> Any:
    """Run the request's spec as a new campaign (labelled with the UTC time) and check it against the
    reference run; then re-verify the promoted speculation config, if one was signed off (`promoted-check`)."""
    # issue 34: from a deployment (the UI), specs only under experiments/ or SPECGAUGE_SPEC_DIRS
    from experiments.loader import flow_spec_path

    request = request or RegressionRequest()
    experiment = load_spec(resolve_repo_path(flow_spec_path(request.spec)))
    stamp = request.label or utc_stamp()
    result = campaign(CampaignRequest(spec_path=request.spec, label=stamp, gate=False))
    check = regression_check(
        result["campaign_id"],
        experiment.name,
        reference=request.reference,
        tolerance=request.tolerance,
        return_state=True,
    )
    promoted = promoted_check(label=stamp, return_state=True)
    return check if check.is_failed() else promoted
