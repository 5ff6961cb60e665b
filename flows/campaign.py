"""The campaign flow: the study's protocol, top to bottom.

For every repeat, in a per-repeat random order of variants (recorded): launch a deployment, gate its
health, run every cell on it, capture greedy outputs, tear it down. Then the extra plain launches the
correctness gate needs as a cross-deployment control; then ingest into the warehouse, gate every
speculative variant, and analyse. Re-running the same spec resumes: finished cells and captures are skipped.
"""

from __future__ import annotations

from specgauge.prefect_env import configure

configure()

from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

from prefect import flow, get_run_logger, task  # noqa: E402
from prefect.artifacts import create_markdown_artifact, create_table_artifact  # noqa: E402
from prefect.cache_policies import NO_CACHE  # noqa: E402

from artifacts import layout  # noqa: E402
from blocks import SavedBlocks, resolve_launcher_config  # noqa: E402
from experiments.plan import CampaignPlan, DeploymentPlan, plan_campaign, resolve_repo_path  # noqa: E402
from experiments.spec import ExperimentSpec, load_spec  # noqa: E402
from flows.retry import is_transient  # noqa: E402
from specgauge import progress  # noqa: E402
from specgauge.errors import LaunchError  # noqa: E402
from specgauge.provenance import utc_now  # noqa: E402
from tasks import campaign as state  # noqa: E402
from tasks.cell import CellOutcome, run_cell  # noqa: E402
from tasks.health import wait_ready  # noqa: E402
from tasks.launch import Launcher, check_launchable, launcher_for, reap_leftovers  # noqa: E402
from tasks.launch.base import Deployment  # noqa: E402

MAX_LAUNCHES_PER_SLOT = 3  # a deployment that keeps dying is recorded as failed, the campaign goes on


@task(name="reap-leftovers", cache_policy=NO_CACHE)
def reap_task() -> list[dict[str, Any]]:
    done = reap_leftovers(saved=SavedBlocks())
    if done:
        get_run_logger().warning(
            "stopped deployments a crashed run left: %s",
            ", ".join(f"{d['id']} ({d['outcome']})" for d in done),
        )
    return done


@task(
    name="launch-and-gate",
    cache_policy=NO_CACHE,
    retries=2,
    retry_delay_seconds=10,
    retry_condition_fn=is_transient,
)
def launch_and_gate(
    spec: ExperimentSpec, launcher: Launcher, slot: DeploymentPlan, directory: Path
) -> Deployment:
    """Launch and wait until ready. A launch that dies (transient) is torn down and retried with a new id."""
    launch_id = state.next_launch_id(directory, slot.deployment_id)
    deployment = launcher.launch(
        spec.target,
        slot.variant,
        deployment_id=launch_id,
        directory=layout.deployment_dir(directory, launch_id),
    )
    try:
        waited = wait_ready(deployment, launcher, timeout_s=spec.launcher.ready_timeout_s)
        launcher.collect_facts(deployment)
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
    cell,
    spec: ExperimentSpec,
    plan: CampaignPlan,
    slot: DeploymentPlan,
    directory: Path,
) -> CellOutcome:
    reporter = progress.current()
    reporter.cell_started(cell.cell_id, spec.load.requests + spec.load.warmup)
    outcome = run_cell(
        deployment,
        cell,
        campaign_id=plan.campaign_id,
        repeat=slot.repeat,
        corpus=plan.corpora[cell.corpus_file],
        sampling=spec.sampling,
        load=spec.load,
        slo=spec.slo,
        cells_dir=state.cells_dir(directory),
        seed=spec.seed,
        on_record=lambda record: reporter.request_done(),
    )
    reporter.cell_done(cell.cell_id, outcome.status)
    logger = get_run_logger()
    s = outcome.summary
    if outcome.status == "ok" and s.requests and s.latency_s and s.latency_s.ttft and s.latency_s.tpot:
        logger.info(
            "%s: %d/%d ok, %.1f tok/s, TTFT p50 %.3f s, TPOT p50 %s",
            cell.cell_id,
            s.requests.ok,
            s.requests.total,
            s.output_throughput_tok_s or 0,
            s.latency_s.ttft.p50 or 0,
            s.latency_s.tpot.p50,
        )
    elif outcome.status != "ok":
        logger.error("%s failed: %s", cell.cell_id, s.error)
    return outcome


@task(name="capture", cache_policy=NO_CACHE)
def capture_task(
    deployment: Deployment, capture_id: str, spec: ExperimentSpec, plan: CampaignPlan, directory: Path
) -> Path:
    from tasks.capture import capture

    corpus = plan.corpora[spec.capture.corpus]
    return capture(
        deployment,
        corpus,
        sampling=spec.sampling,
        max_tokens=spec.capture.max_tokens,
        limit=spec.capture.limit,
        raw_campaign_dir=directory,
        capture_id=capture_id,
        campaign_id=plan.campaign_id,
    )


@task(name="teardown", cache_policy=NO_CACHE)
def teardown_task(launcher: Launcher, deployment: Deployment) -> None:
    launcher.teardown(deployment)


@flow(name="deployment", flow_run_name="{slot_id}")
def deployment_flow(spec_path: str, label: str | None, slot_id: str) -> dict[str, Any]:
    """One deployment slot: launch, gate, cells, captures, teardown; relaunch if the engine dies mid-way."""
    spec = load_spec(spec_path)
    plan = plan_campaign(spec, label)
    slot = next(d for d in plan.deployments if d.deployment_id == slot_id)
    directory = state.campaign_dir(plan.campaign_id)
    launcher = launcher_for(spec, resolve_launcher_config(spec.launcher))
    logger = get_run_logger()
    reporter = progress.current()
    outcome: dict[str, Any] = {"slot": slot.deployment_id, "cells": {}, "captures": [], "launches": []}
    for _ in range(MAX_LAUNCHES_PER_SLOT):
        todo_cells = [c for c in slot.cells if not state.cell_done(directory, c)]
        todo_captures = [c for c in slot.captures if not state.capture_done(directory, c)]
        for cell in slot.cells:
            if cell not in todo_cells:
                outcome["cells"].setdefault(cell.cell_id, "ok (earlier run)")
                reporter.cell_done(cell.cell_id, "ok")
        if not todo_cells and not todo_captures:
            break
        reporter.deployment(slot.deployment_id, "launching")
        try:
            deployment = launch_and_gate(spec, launcher, slot, directory)
        except LaunchError as exc:
            logger.error("%s could not be launched: %s", slot.deployment_id, exc)
            outcome["error"] = str(exc).splitlines()[0]
            for cell in todo_cells:
                outcome["cells"][cell.cell_id] = "not run (launch failed)"
            return outcome
        outcome["launches"].append(deployment.id)
        reporter.deployment(deployment.id, f"ready in {deployment.ready_s:.0f} s")
        died = False
        try:
            for cell in todo_cells:
                result = cell_task(deployment, cell, spec, plan, slot, directory)
                outcome["cells"][cell.cell_id] = result.status
                if result.status != "ok" and launcher.alive(deployment) is False:
                    logger.error("engine of %s died during %s; relaunching", deployment.id, cell.cell_id)
                    died = True
                    break
            if not died:
                for capture_id in todo_captures:
                    capture_task(deployment, capture_id, spec, plan, directory)
                    outcome["captures"].append(capture_id)
        finally:
            teardown_task(launcher, deployment)
        if not died:
            break
    else:
        outcome["error"] = f"engine died {MAX_LAUNCHES_PER_SLOT} times"
    return outcome


def _reap_on_exit(flow, flow_run, state) -> None:
    """on_cancellation/on_crashed hook: whatever this process launched and did not tear down is stopped.
    The parameters keep Prefect's names: a runner (serve, worker) calls hooks by keyword. Only this
    campaign's deployments: the process may hold others (a test session's shared engines)."""
    try:
        parameters = flow_run.parameters
        experiment = load_spec(resolve_repo_path(parameters.get("spec", "experiments/demo.yaml")))
        prefix = plan_campaign(experiment, parameters.get("label")).campaign_id + "."
    except Exception:  # a spec that cannot be read any more: stop everything this process left
        prefix = ""
    reap_leftovers(include_own=True, id_prefix=prefix, saved=SavedBlocks())


@flow(name="campaign", on_cancellation=[_reap_on_exit], on_crashed=[_reap_on_exit], log_prints=True)
def campaign(
    spec: str = "experiments/demo.yaml",
    label: str | None = None,
    ingest: bool = True,
    gate: bool = True,
    analyze: bool = True,
) -> dict[str, Any]:
    """Run a campaign from an experiment spec (a YAML path relative to the repo root, or absolute)."""
    logger = get_run_logger()
    spec_path = resolve_repo_path(spec)
    experiment = load_spec(spec_path)
    plan = plan_campaign(experiment, label)
    # bad input is refused before anything is written or launched
    check_launchable(experiment, source=str(spec_path))
    directory = state.record_campaign(plan, experiment)
    started = utc_now()
    logger.info(
        "campaign %s: %d deployments, %d cells; variant order per repeat %s",
        plan.campaign_id,
        len(plan.deployments),
        len(plan.cells()),
        [list(o) for o in plan.orders],
    )
    progress.current().campaign(len(plan.cells()), len(plan.deployments))
    reap_task()
    slots = [deployment_flow(str(spec_path), label, slot.deployment_id) for slot in plan.deployments]

    result: dict[str, Any] = {
        "campaign_id": plan.campaign_id,
        "directory": str(directory),
        "deployments": slots,
    }
    if experiment.profile is not None:
        from flows.profile import earlier_profile
        from flows.profile import profile as profile_flow

        p = experiment.profile
        result["profile"] = earlier_profile(directory, p.variant)
        if result["profile"] is not None:
            logger.info("profile of %s exists (%s): skipped", p.variant, result["profile"]["path"])
        else:
            result["profile"] = profile_flow(
                spec=str(spec_path),
                variant=p.variant,
                concurrency=p.concurrency,
                requests=p.requests,
                warmup=p.warmup,
                stratum=p.stratum,
                label=label,
            )
    if ingest:
        from flows.ingest import ingest as ingest_flow

        result["ingest"] = ingest_flow(raw_dir=str(directory.parent), campaign_id=plan.campaign_id)
    if gate and experiment.capture.enabled:
        from flows.gate import gate_campaign

        result["gates"] = gate_campaign(campaign_id=plan.campaign_id, directory=str(directory))
        if ingest:
            result["ingest_gates"] = ingest_flow(raw_dir=str(directory.parent), campaign_id=plan.campaign_id)
    if analyze and ingest:
        from flows.analyze import analyze as analyze_flow

        result["analysis"] = analyze_flow(campaign_id=plan.campaign_id)
    failed = {
        cell: status for s in slots for cell, status in s["cells"].items() if not status.startswith("ok")
    }
    result["failed_cells"] = failed
    state.record_run(
        directory,
        {
            "campaign_id": plan.campaign_id,
            "started_utc": started,
            "ended_utc": utc_now(),
            "deployments": slots,
            "failed_cells": failed,
        },
    )
    create_table_artifact(
        key=_artifact_key(plan.campaign_id),
        table=state.headline_rows(directory, plan),
        description=f"Cells of campaign {plan.campaign_id} and their headline figures",
    )
    report = result.get("analysis", {}).get("report") if isinstance(result.get("analysis"), dict) else None
    create_markdown_artifact(
        key=_artifact_key(plan.campaign_id) + "-report",
        markdown=_report_markdown(plan, directory, report, failed),
        description=f"Where the results of {plan.campaign_id} are",
    )
    return result


def _artifact_key(campaign_id: str) -> str:
    # Prefect artifact keys: lowercase letters, digits and dashes only.
    return "".join(ch if ch.isalnum() else "-" for ch in campaign_id.lower())


def _report_markdown(plan: CampaignPlan, directory: Path, report: str | None, failed: dict[str, str]) -> str:
    lines = [f"# Campaign {plan.campaign_id}", "", f"Raw artifacts: `{directory}`"]
    if report:
        lines.append(f"Report: [{report}](file://{report})  (open it in a browser; it renders offline)")
    if failed:
        lines += ["", "## Cells not ok", *[f"- `{cell}`: {status}" for cell, status in failed.items()]]
    return "\n".join(lines)
