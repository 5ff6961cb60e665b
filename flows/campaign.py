"""The campaign flow: the study's protocol, top to bottom.

plan (the spec read and planned once, bad input refused before anything is written), reap what a crashed run
left, then one deployment subflow per slot: for every repeat, in a per-repeat random order of variants
(recorded), launch, wait until ready, run every cell, capture greedy outputs, tear down; then the extra plain
launches the correctness gate needs as cross-deployment controls. Then profile one window, gate every
speculative variant (its verdicts are raw artifacts), ingest the raw tree once, analyse, and record the run.
Re-running the same spec resumes: finished cells, captures, profiles and verdicts are skipped.
"""

import logging
from enum import Enum
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE
from pydantic import BaseModel, Field

from analysis.adaptive_repeats import campaign_observations, repeat_decision
from analysis.sequential_verification import spec_decision
from analysis.serve import report_url
from artifacts import layout
from blocks import SavedBlocks, resolve_launcher_config
from experiments.overrides import SpecOverrides, load_spec_with
from experiments.plan import (
    CampaignPlan,
    CellPlan,
    DeploymentPlan,
    campaign_id_for,
    plan_campaign,
    resolve_repo_path,
)
from experiments.spec import ExperimentSpec, UntilDecided
from flows.analyze import AnalysisRequest
from flows.analyze import analyze as analyze_flow
from flows.gate import gate_campaign
from flows.ingest import ingest as ingest_flow
from flows.profile import earlier_profile
from flows.profile import profile as profile_flow
from flows.progress import ArtifactProgress, cell_artifact
from flows.retry import is_transient
from flows.sampling_check import sampling_check as sampling_check_flow
from specgauge import progress
from specgauge.provenance import utc_now
from specgauge.settings import REPO_ROOT
from tasks import campaign_state as state
from tasks.capacity import Point
from tasks.cell import CellOutcome
from tasks.drafters.prelaunch import check_launchable
from tasks.health import wait_ready
from tasks.launch import Launcher, launcher_for, reap_leftovers
from tasks.launch.base import Deployment
from tasks.load.calibration import calibrate_client, calibrated, fmt_ms, fmt_pair, write_calibration
from tasks.metrics.engine_config import observe_engine_config
from tasks.outcome import artifact_key, cell_log_line, failed_cells, report_markdown
from tasks.relaunch import SlotRun, SlotSteps, capture_greedy, measure_cell, run_slot, search_capacity
from tasks.slots import BlockDecision, DecideRepeats, run_blocks, slot_corpora
from workloads.schema import Corpus


# -- the deployment subflow -----------------------------------------------------------------------------------
@task(
    name="launch-until-ready",
    cache_policy=NO_CACHE,
    retries=2,
    retry_delay_seconds=10,
    retry_condition_fn=is_transient,
)
def launch_until_ready(
    spec: ExperimentSpec, launcher: Launcher, slot: DeploymentPlan, directory: Path
) -> Deployment:
    """Launch and wait until ready. A launch that dies (transient) is torn down and retried with a new id."""
    launch_id = state.next_launch_id(directory, slot.deployment_id)
    deployment = launcher.launch(
        spec.target_of(slot.variant),
        slot.variant,
        deployment_id=launch_id,
        directory=layout.deployment_dir(directory, launch_id),
    )
    try:
        waited = wait_ready(deployment, launcher, timeout_s=spec.launcher.ready_timeout_s)
        launcher.collect_facts(deployment)
        observe_engine_config(deployment)
        deployment.save()
    except BaseException:
        launcher.teardown(deployment)
        raise
    get_run_logger().info(
        "%s ready after %.1f s (KV cache %s tokens)", launch_id, waited, deployment.kv_cache_tokens
    )
    return deployment


@task(name="cell", cache_policy=NO_CACHE)
def cell_task(run: SlotRun, deployment: Deployment, cell: CellPlan) -> CellOutcome:
    """One cell, with its progress, its log line and its table artifact."""
    load = run.spec.load
    reporter = progress.current()
    reporter.cell_started(cell.cell_id, load.requests_at(cell.concurrency) + load.warmup_at(cell.concurrency))
    outcome = measure_cell(run, deployment, cell, on_record=lambda record: reporter.request_done())
    reporter.cell_done(cell.cell_id, outcome.status)
    line = cell_log_line(cell.cell_id, outcome.status, outcome.summary)
    get_run_logger().log(logging.INFO if outcome.status == "ok" else logging.ERROR, "%s", line)
    cell_artifact(run.campaign_id, cell.cell_id, state.headline_row(run.slot, cell, outcome.summary), line)
    return outcome


@task(name="capture", cache_policy=NO_CACHE)
def capture_task(run: SlotRun, deployment: Deployment, capture_id: str) -> Path:
    return capture_greedy(run, deployment, capture_id)


@task(name="capacity-search", cache_policy=NO_CACHE)
def capacity_task(run: SlotRun, deployment: Deployment) -> Path:
    """The slot's capacity search, each point logged as it is measured."""
    search = run.slot.search
    assert search is not None
    logger = get_run_logger()

    def said(point: Point) -> None:
        logger.info(
            "%s: %.3g req/s: p99 TTFT %s, TPOT %s: %s",
            search.search_id,
            point.rate,
            _seconds(point.ttft.observed),
            _seconds(point.tpot.observed),
            point.verdict,
        )

    path = search_capacity(run, deployment, on_point=said)
    logger.info("capacity search %s written: %s", search.search_id, path)
    return path


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g} s"


@task(name="teardown", cache_policy=NO_CACHE)
def teardown_task(launcher: Launcher, deployment: Deployment) -> None:
    launcher.teardown(deployment)


@flow(name="deployment", flow_run_name="{slot.variant.name}-r{slot.repeat}-{slot.role}")
def deployment_flow(
    spec: ExperimentSpec,
    campaign_id: str,
    slot: DeploymentPlan,
    corpora: dict[str, Corpus],
    node: str | None = None,
) -> dict[str, Any]:
    """One deployment slot of a planned campaign: launch, wait until ready, cells, captures, teardown;
    relaunch if the engine dies mid-way (tasks.relaunch). `corpora` holds the workload files its cells and
    captures use; `node` pins the launch to the node the slot's repeat block runs on (None: the scheduler's
    choice)."""
    directory = state.campaign_dir(campaign_id)
    launcher = launcher_for(spec, resolve_launcher_config(spec.launcher))
    launcher.place_on(node)
    run = SlotRun(spec, campaign_id, slot, corpora, directory, launcher)
    steps = SlotSteps(
        launch=lambda: launch_until_ready(spec, launcher, slot, directory),
        cell=lambda deployment, cell: cell_task(run, deployment, cell),
        capture=lambda deployment, capture_id: capture_task(run, deployment, capture_id),
        capacity=lambda deployment: capacity_task(run, deployment),
        teardown=lambda deployment: teardown_task(launcher, deployment),
    )
    return run_slot(run, steps, get_run_logger()).as_dict()


# -- the campaign's steps -------------------------------------------------------------------------------------
def plan_step(
    spec_file: str, label: str | None, overrides: SpecOverrides
) -> tuple[ExperimentSpec, CampaignPlan, Path]:
    """Read and plan the spec once; refuse bad input before anything is written; record campaign.json."""
    spec_path = resolve_repo_path(spec_file)
    experiment = load_spec_with(spec_path, overrides)
    plan = plan_campaign(experiment, label)
    check_launchable(experiment, source=str(spec_path))
    directory = state.record_campaign(plan, experiment)
    get_run_logger().info(
        "campaign %s: %d deployments, %d cells; variant order per repeat %s",
        plan.campaign_id,
        len(plan.deployments),
        len(plan.cells()),
        [list(o) for o in plan.orders],
    )
    progress.current().campaign(len(plan.cells()), len(plan.deployments), plan.campaign_id)
    return experiment, plan, directory


@task(name="client-calibration", cache_policy=NO_CACHE, retries=1, retry_delay_seconds=5)
def calibration_task(experiment: ExperimentSpec, campaign_id: str, directory: Path) -> dict[str, Any]:
    """The client's own error at the campaign's heaviest load, once per campaign (a re-run finds it)."""
    record = calibrated(directory) or write_calibration(directory, calibrate_client(experiment, campaign_id))
    get_run_logger().info(
        "client calibration at %s C=%s: TTFT error p50/p99 %s, TPOT error p50/p99 %s, send lag p99 %s",
        record["mode"],
        record["concurrency"],
        fmt_pair(record, "ttft_error"),
        fmt_pair(record, "tpot_error"),
        fmt_ms(record.get("send_lag_p99_s")),
    )
    return record


@task(name="reap-leftovers", cache_policy=NO_CACHE)
def reap_task() -> list[dict[str, Any]]:
    done = reap_leftovers(saved=SavedBlocks())
    if done:
        get_run_logger().warning(
            "stopped deployments a crashed run left: %s",
            ", ".join(f"{d['id']} ({d['outcome']})" for d in done),
        )
    return done


def profile_step(experiment: ExperimentSpec, plan: CampaignPlan, directory: Path) -> dict[str, Any] | None:
    """The spec's profiled window, unless an earlier run of the campaign has it already."""
    p = experiment.profile
    if p is None:
        return None
    earlier = earlier_profile(directory, p.variant)
    if earlier is not None:
        get_run_logger().info("profile of %s exists (%s): skipped", p.variant, earlier["path"])
        return earlier
    return profile_flow(
        spec=experiment,
        variant=p.variant,
        concurrency=p.concurrency,
        requests=p.requests,
        warmup=p.warmup,
        stratum=p.stratum,
        campaign_id=plan.campaign_id,
    )


def record_step(plan: CampaignPlan, directory: Path, started: str, result: dict[str, Any]) -> dict[str, Any]:
    """The run's immutable record, and the Prefect artifacts: a table of cells, where the results are."""
    failed = failed_cells(result["deployments"])
    result["failed_cells"] = failed
    state.record_run(
        directory,
        {
            "campaign_id": plan.campaign_id,
            "started_utc": started,
            "ended_utc": utc_now(),
            "deployments": result["deployments"],
            "failed_cells": failed,
        },
    )
    create_table_artifact(
        key=artifact_key(plan.campaign_id),
        table=state.headline_rows(directory, plan),
        description=f"Cells of campaign {plan.campaign_id} and their headline figures",
    )
    analysis = result.get("analysis")
    report = analysis.get("report") if isinstance(analysis, dict) else None
    create_markdown_artifact(
        key=artifact_key(plan.campaign_id) + "-report",
        markdown=report_markdown(plan, directory, report_url(report) if report else None, failed),
        description=f"Where the results of {plan.campaign_id} are",
    )
    return result


def _reap_on_exit(flow, flow_run, state) -> None:
    """on_cancellation/on_crashed hook: whatever this process launched and did not tear down is stopped.
    The parameters keep Prefect's names: a runner (serve, worker) calls hooks by keyword, often in another
    process than the flow's, so the campaign id is derived from the run's parameters (the spec's digest and
    the label: no planning). Only this campaign's deployments: the process may hold others (a test
    session's shared engines)."""
    try:
        request = CampaignRequest.model_validate(flow_run.parameters.get("request") or {})
        experiment = load_spec_with(resolve_repo_path(request.spec_file()), request.overrides())
        prefix = campaign_id_for(experiment, request.label) + "."
    except Exception:  # a spec that cannot be read any more: stop everything this process left
        prefix = ""
    reap_leftovers(include_own=True, id_prefix=prefix, saved=SavedBlocks())


# -- the run form -----------------------------------------------------------------------------------------------
# The repo's experiment specs, as the select of the UI's run form (the schema is taken at `prefect deploy`).
ExperimentFile = Enum(  # type: ignore[misc]
    "ExperimentFile",
    {p.stem: f"experiments/{p.name}" for p in sorted((REPO_ROOT / "experiments").glob("*.yaml"))},
    type=str,
)
DEMO = ExperimentFile("experiments/demo.yaml")


def spec_file_of(parameters: dict[str, Any]) -> str:
    """The spec file a campaign run's parameters name: spec_path when given, else the selected spec."""
    chosen = parameters.get("spec_path") or parameters.get("spec") or DEMO
    return chosen.value if isinstance(chosen, Enum) else str(chosen)


class CampaignRequest(BaseModel):
    """What to run: the run form of the `campaign` deployment (each field's description is its help)."""

    spec: ExperimentFile = Field(
        default=DEMO, description="The experiment spec, from the repo's experiments/ folder."
    )
    spec_path: str | None = Field(
        default=None,
        description="Another spec file instead (repo-relative or absolute, on the worker's machine), e.g. one "
        "that `specgauge decide` wrote.",
    )
    label: str | None = Field(
        default=None,
        description="A run label: a new campaign id instead of resuming the last run of the same spec.",
    )
    variants: list[str] | None = Field(
        default=None,
        description="Run only these variants (names as in the report, e.g. draft-k3); plain baselines are "
        "always kept. Empty: all.",
    )
    strata: list[str] | None = Field(
        default=None,
        description="Run only these strata of the spec's workloads (e.g. code, chat). Empty: all.",
    )
    concurrencies: list[int] | None = Field(
        default=None,
        description="Closed-loop concurrencies instead of the spec's (e.g. 1, 4). Empty: the spec's.",
    )
    repeats: int | None = Field(
        default=None, description="Independently launched deployments per variant instead of the spec's."
    )
    ingest: bool = Field(default=True, description="Load the raw artifacts into the warehouse afterwards.")
    gate: bool = Field(default=True, description="Run the greedy-correctness gate afterwards.")
    analyze: bool = Field(default=True, description="Analyse and write the report afterwards (needs ingest).")

    def spec_file(self) -> str:
        return spec_file_of({"spec": self.spec, "spec_path": self.spec_path})

    def overrides(self) -> SpecOverrides:
        return SpecOverrides.of(self.variants, self.strata, self.concurrencies, self.repeats)


# -- the protocol ---------------------------------------------------------------------------------------------
@flow(name="campaign", on_cancellation=[_reap_on_exit], on_crashed=[_reap_on_exit], log_prints=True)
def campaign(request: CampaignRequest | None = None) -> dict[str, Any]:
    """Run a campaign: launch each variant, wait until it is ready, measure every cell, capture greedy
    outputs, tear down; then profile, gate, ingest, analyse and write the report. Re-running the same spec
    and overrides resumes: finished cells are skipped."""
    request = request or CampaignRequest()
    spec_file = request.spec_file()
    # issue 34: from a deployment (the UI), specs only under experiments/ or SPECGAUGE_SPEC_DIRS
    from experiments.loader import flow_spec_path

    flow_spec_path(spec_file)
    with progress.reporting(progress.Tee(progress.current(), ArtifactProgress())):
        return _campaign(
            spec_file,
            request.label,
            request.overrides(),
            ingest=request.ingest,
            gate=request.gate,
            analyze=request.analyze,
        )


def _campaign(
    spec_file: str, label: str | None, overrides: SpecOverrides, *, ingest: bool, gate: bool, analyze: bool
) -> dict[str, Any]:
    experiment, plan, directory = plan_step(spec_file, label, overrides)
    # One writer per campaign (tasks.campaign_state): a second run of the same campaign is refused here, naming
    # the first, before it launches or measures anything; a killed run's half-written artifacts go.
    with state.campaign_writer(directory):
        return _run_planned(experiment, plan, directory, ingest=ingest, gate=gate, analyze=analyze)


def repeat_decider(directory: Path, experiment: ExperimentSpec) -> DecideRepeats | None:
    """The spec's rule on the repeat blocks finished so far, for run_blocks: adaptive repeats
    (analysis.adaptive_repeats) or launch-until-decided (analysis.sequential_verification)."""
    rule = experiment.adaptive_repeats
    if rule is None:
        return None

    def decide(finished: list[int]) -> BlockDecision:
        observations = campaign_observations(directory).restricted_to(finished)
        decision = (
            spec_decision(observations, experiment, rule)
            if isinstance(rule, UntilDecided)
            else repeat_decision(observations, rule)
        )
        return BlockDecision(stop=decision.stop, reason=decision.reason, record=decision.record())

    return decide


def _run_planned(
    experiment: ExperimentSpec,
    plan: CampaignPlan,
    directory: Path,
    *,
    ingest: bool,
    gate: bool,
    analyze: bool,
) -> dict[str, Any]:
    started = utc_now()
    result: dict[str, Any] = {"campaign_id": plan.campaign_id, "directory": str(directory)}
    reap_task()
    if experiment.validity.client_calibration:
        result["client_calibration"] = calibration_task(experiment, plan.campaign_id, directory)

    def run_one(slot: DeploymentPlan, node: str | None) -> dict[str, Any]:
        return deployment_flow(
            experiment, plan.campaign_id, slot, slot_corpora(experiment, plan, slot), node=node
        )

    result["deployments"], decisions = run_blocks(
        experiment,
        plan,
        run_one,
        decide_repeats=repeat_decider(directory, experiment),
        saved=SavedBlocks(),
        log=get_run_logger(),
    )
    if experiment.adaptive_repeats is not None:
        result["adaptive_repeats"] = decisions
    if experiment.profile is not None:
        result["profile"] = profile_step(experiment, plan, directory)
    if gate and plan.gate is not None:
        result["gates"] = gate_campaign(
            campaign_id=plan.campaign_id, directory=str(directory), pairs=plan.gate
        )
    if experiment.sampling_check is not None and experiment.sampling_check.enabled:
        result["sampling_checks"] = sampling_check_flow(experiment, plan.campaign_id, str(directory))
    if ingest:  # once, after the gate: its verdicts are raw artifacts too
        result["ingest"] = ingest_flow(raw_dir=str(directory.parent), campaign_id=plan.campaign_id)
    if ingest and analyze:
        result["analysis"] = analyze_flow(AnalysisRequest(campaign_id=plan.campaign_id))
    return record_step(plan, directory, started, result)
