"""The confirm-adaptation flow: does a new EAGLE-3 head pay on a running server, and for which strata?

One deployment of the spec's eagle3 variant, launched with hot_swap and the old head. Then a randomised
schedule (tasks.adapt.schedule): per repeat every (head, stratum) block once in a seeded order; a block swaps
the head in when it is not serving (tasks.drafters.swap, no restart) and runs the stratum's cells. After the
schedule the new head is swapped in once more and the capture corpus is captured greedily; the old head is
swapped back in at the end on every exit path, and the deployment torn down. The gate compares that capture
with plain captures (an earlier campaign's, `plain_from`, or two plain launches of its own); the new head's
cells against the old head's, paired by repeat, give the ratios and the benefit rule's verdict per stratum
(analysis.adaptation), written as RAW/<campaign>/adaptations/<id>.json and ingested. docs/adaptation.md.
"""

from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE

from analysis.adaptation import cells_frame, confirm, write_adaptation_report
from blocks import SavedBlocks, resolve_launcher_config
from flows.ingest import ingest as ingest_flow
from flows.retry import is_transient
from tasks.adapt import PlainCaptures
from tasks.adaptation.deployment import Measurement, plain_captures, run_schedule_on_deployment
from tasks.adaptation.inputs import AdaptationRequest, Inputs
from tasks.adaptation.verdict import (
    cell_rows,
    earlier_confirmation,
    gate_new_head,
    record_confirmation_campaign,
    write_verdict_document,
)
from tasks.launch import Launcher, launcher_for, reap_leftovers


# -- the steps ------------------------------------------------------------------------------------------------
@task(name="confirmation-inputs", cache_policy=NO_CACHE)
def inputs_task(request: AdaptationRequest) -> Inputs:
    """The spec, heads, strata and load resolved and checked (tasks.adaptation.inputs): bad input is refused
    before anything is written or launched."""
    return Inputs(request)


@task(name="earlier-confirmation", cache_policy=NO_CACHE)
def earlier_task(inputs: Inputs) -> dict[str, Any] | None:
    return earlier_confirmation(inputs)


@task(name="record-campaign", cache_policy=NO_CACHE)
def record_task(inputs: Inputs) -> Path:
    return record_confirmation_campaign(inputs)


@task(name="reap-leftovers", cache_policy=NO_CACHE)
def reap_task() -> None:
    reap_leftovers(saved=SavedBlocks())


@task(name="hot-swap-schedule", cache_policy=NO_CACHE)
def schedule_task(inputs: Inputs, launcher: Launcher, directory: Path) -> Measurement:
    """One deployment: every block under its head, the new head's capture for the gate, the old head back."""
    return run_schedule_on_deployment(inputs, launcher, directory, log=get_run_logger())


@task(
    name="plain-captures",
    cache_policy=NO_CACHE,
    retries=2,
    retry_delay_seconds=10,
    retry_condition_fn=is_transient,
)
def plain_captures_task(
    inputs: Inputs, launcher: Launcher, directory: Path, max_tokens: int | None
) -> PlainCaptures:
    """The gate's plain side; a retry launches again and takes only the captures still missing."""
    return plain_captures(inputs, launcher, directory, max_tokens)


@task(name="gate-new-head", cache_policy=NO_CACHE)
def gate_task(
    inputs: Inputs, directory: Path, plain: PlainCaptures | None, error: str | None
) -> dict[str, Any]:
    return gate_new_head(inputs, directory, plain, error)


@task(name="adaptation-verdict", cache_policy=NO_CACHE)
def verdict_task(
    inputs: Inputs, directory: Path, measured: Measurement, gate_facts: dict[str, Any] | None
) -> dict[str, Any]:
    """The benefit rule per stratum on the cells, paired by repeat (analysis.adaptation.confirm), written as
    the confirmation's document."""
    rows, requests = cell_rows(directory, measured.schedule.blocks)
    verdict = confirm(
        cells_frame(rows),
        target_stratum=inputs.target_stratum,
        gate_passed=None if gate_facts is None else gate_facts.get("passed"),
        rule=inputs.rule,
        requests=requests,
    )
    return write_verdict_document(inputs, directory, measured, gate_facts, rows, verdict)


@task(name="adaptation-report", cache_policy=NO_CACHE)
def report_task(campaign_id: str, adaptation_id: str) -> Path:
    return write_adaptation_report(campaign_id, adaptation_id=adaptation_id)


def _reap_on_exit(flow: Any, flow_run: Any, state: Any) -> None:
    """on_cancellation/on_crashed: stop what this run launched and did not tear down (by the confirmation's
    campaign id when its inputs can still be read, else everything this process left)."""
    try:
        request = AdaptationRequest.model_validate(flow_run.parameters["request"])
        prefix = Inputs(request).campaign_id + "."
    except Exception:
        prefix = ""
    reap_leftovers(include_own=True, id_prefix=prefix, saved=SavedBlocks())


# -- the protocol ---------------------------------------------------------------------------------------------
@flow(name="confirm-adaptation", on_cancellation=[_reap_on_exit], on_crashed=[_reap_on_exit], log_prints=True)
def confirm_adaptation(request: AdaptationRequest) -> dict[str, Any]:
    """Confirm that a new EAGLE-3 head pays on a running server: old and new head measured in a randomised
    schedule of hot swaps on one deployment, the gate after the swap, the benefit rule per stratum."""
    # issue 34: from a deployment (the UI), specs only under experiments/ or SPECGAUGE_SPEC_DIRS
    from experiments.loader import flow_spec_path
    from specgauge.flow_paths import flow_path, input_roots

    flow_spec_path(request.spec_path)
    flow_path(request.new_head, "new_head", input_roots())
    flow_path(request.old_head, "old_head", input_roots())
    inputs = inputs_task(request)
    document = earlier_task(inputs) or _confirm(inputs)
    if request.ingest:
        ingest_flow(raw_dir=str(Path(document["path"]).parents[2]), campaign_id=inputs.campaign_id)
        document["report"] = str(report_task(inputs.campaign_id, document["adaptation_id"]))
    get_run_logger().info("confirmation %s: %s", document["adaptation_id"], document["summary"])
    return document


def _confirm(inputs: Inputs) -> dict[str, Any]:
    """A new confirmation: its campaign recorded, the schedule on one hot-swap deployment, the gate (the new
    head's capture against plain captures), the verdict written."""
    directory = record_task(inputs)
    reap_task()
    launcher = launcher_for(inputs.spec, resolve_launcher_config(inputs.spec.launcher))
    measured = schedule_task(inputs, launcher, directory)
    gate_facts = None
    if inputs.gate and measured.error is None:
        plain, plain_error = None, None
        try:
            plain = plain_captures_task(inputs, launcher, directory, measured.max_tokens)
        except Exception as exc:  # no plain side: no verdict, said so
            plain_error = f"{type(exc).__name__}: {exc}"
        gate_facts = gate_task(inputs, directory, plain, plain_error)
    return verdict_task(inputs, directory, measured, gate_facts)
