"""The campaign flow: the study's protocol, top to bottom.

plan (the spec read and planned once, bad input refused before anything is written), reap what a crashed run
left, then one deployment subflow per slot: for every repeat, in a per-repeat random order of variants
(recorded), launch, wait until ready, run every cell, capture greedy outputs, tear down; then the extra plain
launches the correctness gate needs as cross-deployment controls. Then profile one window, gate every
speculative variant (its verdicts are raw artifacts), ingest the raw tree once, analyse, and record the run.
Re-running the same spec resumes: finished cells, captures, profiles and verdicts are skipped.
"""

import contextvars
import logging
import threading
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Executor, Future, ThreadPoolExecutor, wait
from dataclasses import asdict
from enum import Enum
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE

from analysis.adaptive import RepeatDecision, campaign_observations, repeat_decision
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
from experiments.spec import AdaptiveRepeats, ExperimentSpec
from flows.analyze import analyze as analyze_flow
from flows.gate import gate_campaign
from flows.ingest import ingest as ingest_flow
from flows.profile import earlier_profile
from flows.profile import profile as profile_flow
from flows.progress import ArtifactProgress, cell_artifact
from flows.retry import is_transient
from specgauge import progress
from specgauge.errors import LaunchError
from specgauge.provenance import utc_now
from specgauge.settings import REPO_ROOT
from tasks import campaign as state
from tasks.capacity import EngineGone, Point, search_deployment
from tasks.capture import capture
from tasks.cell import CellOutcome, run_cell
from tasks.health import wait_ready
from tasks.launch import Launcher, check_launchable, launcher_for, reap_leftovers
from tasks.launch.base import Deployment
from tasks.load.calibration import calibrate_client, calibrated, fmt_ms, fmt_pair, write_calibration
from tasks.metrics.engine_config import observe_engine_config
from tasks.outcome import SKIPPED, SlotOutcome, artifact_key, cell_log_line, failed_cells, report_markdown
from workloads.schema import Corpus

MAX_LAUNCHES_PER_SLOT = 3  # a deployment that keeps dying is recorded as failed, the campaign goes on


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
def cell_task(
    deployment: Deployment,
    cell: CellPlan,
    spec: ExperimentSpec,
    campaign_id: str,
    slot: DeploymentPlan,
    corpus: Corpus,
    directory: Path,
) -> CellOutcome:
    reporter = progress.current()
    reporter.cell_started(
        cell.cell_id, spec.load.requests_at(cell.concurrency) + spec.load.warmup_at(cell.concurrency)
    )
    outcome = run_cell(
        deployment,
        cell,
        campaign_id=campaign_id,
        repeat=slot.repeat,
        corpus=corpus,
        sampling=spec.sampling_of(slot.variant),
        load=spec.load,
        slo=spec.slo,
        cells_dir=state.cells_dir(directory),
        seed=spec.seed,
        on_record=lambda record: reporter.request_done(),
    )
    reporter.cell_done(cell.cell_id, outcome.status)
    line = cell_log_line(cell.cell_id, outcome.status, outcome.summary)
    get_run_logger().log(logging.INFO if outcome.status == "ok" else logging.ERROR, "%s", line)
    cell_artifact(campaign_id, cell.cell_id, state.headline_row(slot, cell, outcome.summary), line)
    return outcome


@task(name="capture", cache_policy=NO_CACHE)
def capture_task(
    deployment: Deployment,
    capture_id: str,
    spec: ExperimentSpec,
    campaign_id: str,
    corpus: Corpus,
    directory: Path,
) -> Path:
    return capture(
        deployment,
        corpus,
        sampling=spec.sampling_of(deployment.variant),
        max_tokens=spec.capture.max_tokens,
        limit=spec.capture.limit,
        raw_campaign_dir=directory,
        capture_id=capture_id,
        campaign_id=campaign_id,
    )


@task(name="capacity-search", cache_policy=NO_CACHE)
def capacity_task(
    deployment: Deployment,
    launcher: Launcher,
    spec: ExperimentSpec,
    campaign_id: str,
    slot: DeploymentPlan,
    corpus: Corpus,
    directory: Path,
) -> Path:
    search = slot.search
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

    path = search_deployment(
        deployment,
        search,
        spec,
        campaign_id=campaign_id,
        repeat=slot.repeat,
        corpus=corpus,
        directory=directory,
        alive=lambda: launcher.alive(deployment),
        on_point=said,
    )
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
    relaunch if the engine dies mid-way. `corpora` holds the workload files its cells and captures use;
    `node` pins the launch to the node the slot's repeat block runs on (None: the scheduler's choice)."""
    directory = state.campaign_dir(campaign_id)
    launcher = launcher_for(spec, resolve_launcher_config(spec.launcher))
    launcher.place_on(node)
    logger = get_run_logger()
    reporter = progress.current()
    outcome = SlotOutcome(slot=slot.deployment_id)
    for _ in range(MAX_LAUNCHES_PER_SLOT):
        todo_cells = [c for c in slot.cells if not state.cell_done(directory, c)]
        todo_captures = [c for c in slot.captures if not state.capture_done(directory, c)]
        todo_search = slot.search is not None and not state.search_done(directory, slot.search.search_id)
        for cell in slot.cells:
            if cell not in todo_cells:
                outcome.cells.setdefault(cell.cell_id, "ok (earlier run)")
                reporter.cell_done(cell.cell_id, "ok")
        if not todo_cells and not todo_captures and not todo_search:
            break
        reporter.deployment(slot.deployment_id, "launching")
        try:
            deployment = launch_until_ready(spec, launcher, slot, directory)
        except LaunchError as exc:
            logger.error("%s could not be launched: %s", slot.deployment_id, exc)
            outcome.error = str(exc).splitlines()[0]
            outcome.not_run([c.cell_id for c in todo_cells], "launch failed")
            return outcome.as_dict()
        outcome.launches.append(deployment.id)
        outcome.node = deployment.extra.get("node")
        reporter.deployment(deployment.id, f"ready in {deployment.ready_s:.0f} s")
        died = False
        try:
            for cell in todo_cells:
                corpus = corpora[cell.corpus_file]
                result = cell_task(deployment, cell, spec, campaign_id, slot, corpus, directory)
                outcome.cells[cell.cell_id] = result.status
                if result.status != "ok" and launcher.alive(deployment) is False:
                    logger.error("engine of %s died during %s; relaunching", deployment.id, cell.cell_id)
                    died = True
                    break
            if not died:
                for capture_id in todo_captures:
                    corpus = corpora[spec.capture.corpus]
                    capture_task(deployment, capture_id, spec, campaign_id, corpus, directory)
                    outcome.captures.append(capture_id)
            if not died and todo_search and slot.search is not None:
                corpus = corpora[slot.search.corpus_file]
                try:
                    capacity_task(deployment, launcher, spec, campaign_id, slot, corpus, directory)
                except EngineGone as exc:
                    logger.error("%s; relaunching", exc)
                    died = True
        finally:
            teardown_task(launcher, deployment)
        if not died:
            break
    else:
        outcome.error = f"engine died {MAX_LAUNCHES_PER_SLOT} times"
    return outcome.as_dict()


# -- repeat blocks ---------------------------------------------------------------------------------------------
def run_block(
    spec: ExperimentSpec, plan: CampaignPlan, block: tuple[DeploymentPlan, ...], stop: threading.Event
) -> list[dict[str, Any]]:
    """One repeat block: its slots in their recorded order, each pinned to the node the block's first launch
    ran on, so that every speedup of the block is paired within one node. Once `stop` is set (the campaign
    failed or was cancelled) it launches nothing more."""
    outcomes: list[dict[str, Any]] = []
    node: str | None = None
    for slot in block:
        if stop.is_set():
            skipped = SlotOutcome(slot=slot.deployment_id, error="not launched: the campaign stopped")
            skipped.not_run([c.cell_id for c in slot.cells], "campaign stopped")
            outcomes.append(skipped.as_dict())
            continue
        outcome = deployment_flow(spec, plan.campaign_id, slot, slot_corpora(spec, plan, slot), node=node)
        outcomes.append(outcome)
        node = node or outcome.get("node")
    return outcomes


def repeat_decision_now(directory: Path, rule: AdaptiveRepeats, finished: list[int]) -> RepeatDecision:
    """The adaptive rule on the repeat blocks finished so far (cells of blocks still in flight left out)."""
    return repeat_decision(campaign_observations(directory).restricted_to(finished), rule)


def run_blocks(
    spec: ExperimentSpec, plan: CampaignPlan, directory: Path
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Every repeat block, then the gate's controls, with up to `parallel_deployments` blocks in flight at
    once (each a thread running deployment subflows). With adaptive repeats, after each finished block the
    rule decides whether to launch more: once it stops, the blocks not yet launched are recorded as not run
    (blocks already in flight finish). Returns the slot outcomes in plan order and the rule's decisions."""
    rule = spec.adaptive_repeats
    blocks = plan.blocks()
    queue = list(range(len(blocks)))
    outcomes: dict[int, list[dict[str, Any]]] = {}
    decisions: list[dict[str, Any]] = []
    finished: list[int] = []
    stop = threading.Event()
    logger = get_run_logger()
    parallel = spec.parallel_deployments > 1
    with (
        ThreadPoolExecutor(spec.parallel_deployments, thread_name_prefix="repeat-block")
        if parallel
        else InThisThread()
    ) as pool:
        running: dict[Future[list[dict[str, Any]]], int] = {}
        try:
            while queue or running:
                while queue and len(running) < spec.parallel_deployments:
                    index = queue.pop(0)
                    context = contextvars.copy_context()  # the subflows' parent: this flow run
                    running[pool.submit(context.run, run_block, spec, plan, blocks[index], stop)] = index
                done, _ = wait(running, return_when=FIRST_COMPLETED)
                for future in done:
                    index = running.pop(future)
                    outcomes[index] = future.result()
                    if blocks[index][0].role == "arm":
                        finished.append(blocks[index][0].repeat)
                if rule is None or not any(blocks[i][0].role == "arm" for i in queue):
                    continue
                decision = repeat_decision_now(directory, rule, finished)
                decisions.append(decision_record(decision))
                logger.info("adaptive repeats: %s", decision.reason)
                if decision.stop:
                    for index in [i for i in queue if blocks[i][0].role == "arm"]:
                        queue.remove(index)
                        outcomes[index] = [
                            skipped(slot, "adaptive repeats stopped") for slot in blocks[index]
                        ]
        except BaseException:
            # Blocks in flight launch nothing more, and their engines stop now (their threads then fail fast
            # and end): a cancelled run's process may be killed before the threads reach their teardown.
            stop.set()
            if running:
                reap_leftovers(include_own=True, id_prefix=plan.campaign_id + ".", saved=SavedBlocks())
            raise
    return [o for i in sorted(outcomes) for o in outcomes[i]], decisions


class InThisThread(Executor):
    """One block at a time runs in the flow's own thread: a cancellation's SIGTERM then interrupts the running
    cell itself (its records kept, the engine torn down in its `finally`), as before parallel slots."""

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        future: Future[Any] = Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except Exception as exc:  # BaseException (SIGTERM, Ctrl-C) propagates at once
            future.set_exception(exc)
        return future


def skipped(slot: DeploymentPlan, why: str) -> dict[str, Any]:
    outcome = SlotOutcome(slot=slot.deployment_id)
    outcome.cells.update({c.cell_id: f"{SKIPPED} ({why})" for c in slot.cells})
    return outcome.as_dict()


def decision_record(decision: RepeatDecision) -> dict[str, Any]:
    return {
        "repeats_done": decision.repeats_done,
        "stop": decision.stop,
        "confidence": decision.confidence,
        "widest": None if decision.widest is None else asdict(decision.widest),
        "widest_halfwidth": decision.widest_halfwidth,
        "reason": decision.reason,
    }


def slot_corpora(spec: ExperimentSpec, plan: CampaignPlan, slot: DeploymentPlan) -> dict[str, Corpus]:
    """The workload files one slot needs (its cells', its search's, and the capture corpus if it captures)."""
    files = {c.corpus_file for c in slot.cells} | ({spec.capture.corpus} if slot.captures else set())
    if slot.search is not None:
        files.add(slot.search.corpus_file)
    return {f: plan.corpora[f] for f in sorted(files)}


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
        parameters = flow_run.parameters
        experiment = load_spec_with(resolve_repo_path(spec_file_of(parameters)), overrides_of(parameters))
        prefix = campaign_id_for(experiment, parameters.get("label")) + "."
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


def overrides_of(parameters: dict[str, Any]) -> SpecOverrides:
    return SpecOverrides.of(
        parameters.get("variants"),
        parameters.get("strata"),
        parameters.get("concurrencies"),
        parameters.get("repeats"),
    )


# -- the protocol ---------------------------------------------------------------------------------------------
@flow(name="campaign", on_cancellation=[_reap_on_exit], on_crashed=[_reap_on_exit], log_prints=True)
def campaign(
    spec: ExperimentFile = DEMO,
    spec_path: str | None = None,
    label: str | None = None,
    variants: list[str] | None = None,
    strata: list[str] | None = None,
    concurrencies: list[int] | None = None,
    repeats: int | None = None,
    ingest: bool = True,
    gate: bool = True,
    analyze: bool = True,
) -> dict[str, Any]:
    """Run a campaign: launch each variant, wait until it is ready, measure every cell, capture greedy
    outputs, tear down; then profile, gate, ingest, analyse and write the report. Re-running the same spec
    and overrides resumes: finished cells are skipped.

    Args:
        spec: The experiment spec, from the repo's experiments/ folder.
        spec_path: Another spec file instead (repo-relative or absolute, on the worker's machine), e.g. one
            that `specgauge decide` wrote.
        label: A run label: a new campaign id instead of resuming the last run of the same spec.
        variants: Run only these variants (names as in the report, e.g. draft-k3); plain baselines are
            always kept. Empty: all.
        strata: Run only these strata of the spec's workloads (e.g. code, chat). Empty: all.
        concurrencies: Closed-loop concurrencies instead of the spec's (e.g. 1, 4). Empty: the spec's.
        repeats: Independently launched deployments per variant instead of the spec's.
        ingest: Load the raw artifacts into the warehouse afterwards.
        gate: Run the greedy-correctness gate afterwards.
        analyze: Analyse and write the report afterwards (needs ingest).
    """
    overrides = SpecOverrides.of(variants, strata, concurrencies, repeats)
    spec_file = spec_file_of({"spec": spec, "spec_path": spec_path})
    # issue 34: from a deployment (the UI), specs only under experiments/ or SPECGAUGE_SPEC_DIRS
    from experiments.loader import flow_spec_path

    flow_spec_path(spec_file)
    with progress.reporting(progress.Tee(progress.current(), ArtifactProgress())):
        return _campaign(spec_file, label, overrides, ingest=ingest, gate=gate, analyze=analyze)


def _campaign(
    spec_file: str, label: str | None, overrides: SpecOverrides, *, ingest: bool, gate: bool, analyze: bool
) -> dict[str, Any]:
    experiment, plan, directory = plan_step(spec_file, label, overrides)
    # One writer per campaign (tasks.campaign): a second run of the same campaign is refused here, naming
    # the first, before it launches or measures anything; a killed run's half-written artifacts go.
    with state.campaign_writer(directory):
        return _run_planned(experiment, plan, directory, ingest=ingest, gate=gate, analyze=analyze)


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
    result["deployments"], decisions = run_blocks(experiment, plan, directory)
    if experiment.adaptive_repeats is not None:
        result["adaptive_repeats"] = decisions
    if experiment.profile is not None:
        result["profile"] = profile_step(experiment, plan, directory)
    if gate and plan.gate is not None:
        result["gates"] = gate_campaign(
            campaign_id=plan.campaign_id, directory=str(directory), pairs=plan.gate
        )
    if ingest:  # once, after the gate: its verdicts are raw artifacts too
        result["ingest"] = ingest_flow(raw_dir=str(directory.parent), campaign_id=plan.campaign_id)
    if ingest and analyze:
        result["analysis"] = analyze_flow(campaign_id=plan.campaign_id)
    return record_step(plan, directory, started, result)
