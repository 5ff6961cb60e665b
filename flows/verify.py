"""The verify-recommendation flow: launch a campaign's recommended depth schedule beside plain and the best
fixed depth (a campaign of its own, gated, ingested and analysed like any other), then say per load, with
intervals, whether the schedule beats both (tasks.verify, analysis.recommend)."""

from typing import Any

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE

from flows.campaign import campaign
from tasks.verify import verdicts_of, write_verification_spec


@task(name="verification-spec", cache_policy=NO_CACHE)
def verification_spec_task(campaign_id: str | None, workload: str | None) -> str:
    return str(write_verification_spec(campaign_id, workload))


@task(name="verdicts", cache_policy=NO_CACHE)
def verdicts_task(campaign_id: str) -> list[str]:
    return [verdict.text() for verdict in verdicts_of(campaign_id)]


@flow(name="verify-recommendation")
def verify_recommendation(campaign_id: str | None = None, workload: str | None = None) -> dict[str, Any]:
    """Verify the recommendation of `campaign_id` (default: the latest campaign) on `workload` (needed when
    the campaign has several)."""
    spec = verification_spec_task(campaign_id, workload)
    result = campaign(spec_path=spec)
    verdicts = verdicts_task(result["campaign_id"])
    for line in verdicts:
        get_run_logger().info("%s", line)
    create_markdown_artifact(
        "\n".join([f"# Verification {result['campaign_id']}", "", *(f"- {line}" for line in verdicts)]),
        description="the recommended schedule against plain and the best fixed depth",
    )
    return {"spec": spec, "campaign_id": result["campaign_id"], "verdicts": verdicts}
