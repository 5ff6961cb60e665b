"""One deployment slot of a planned campaign: launch, cells, captures, capacity search, teardown; relaunched
while the engine dies mid-way (at most MAX_LAUNCHES_PER_SLOT launches), resuming what is not done yet. Plain
code: the campaign's deployment subflow (flows/campaign.py) passes its steps as Prefect tasks."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from experiments.plan import CellPlan, DeploymentPlan
from experiments.spec import ExperimentSpec
from specgauge import progress
from specgauge.errors import LaunchError
from tasks import campaign_state as state
from tasks.capacity import EngineGone, Point, search_deployment
from tasks.capture import capture
from tasks.cell import CellOutcome, run_cell, warm_engine
from tasks.launch import Launcher
from tasks.launch.base import Deployment
from tasks.load.records import RequestRecord
from tasks.outcome import SlotOutcome
from workloads.schema import Corpus

MAX_LAUNCHES_PER_SLOT = 3  # a deployment that keeps dying is recorded as failed, the campaign goes on


@dataclass(frozen=True)
class SlotRun:
    """What every step of one slot works with: the spec, the campaign, the slot, its workload files."""

    spec: ExperimentSpec
    campaign_id: str
    slot: DeploymentPlan
    corpora: dict[str, Corpus]  # workload file -> corpus, the files the slot's cells and captures use
    directory: Path  # RAW/<campaign_id>
    launcher: Launcher


@dataclass(frozen=True)
class SlotSteps:
    """The slot's steps (the flow's tasks: named in the UI, the launch retried when transient)."""

    launch: Callable[[], Deployment]  # launched and ready; raises LaunchError when it could not be
    cell: Callable[[Deployment, CellPlan], CellOutcome]
    capture: Callable[[Deployment, str], Path]
    capacity: Callable[[Deployment], Path]  # raises EngineGone when the engine died during the search
    teardown: Callable[[Deployment], None]


def run_slot(run: SlotRun, steps: SlotSteps, log: logging.Logger | logging.LoggerAdapter) -> SlotOutcome:
    """Launch, cells, captures, search, teardown; relaunch when the engine died during a cell or the search.
    What an earlier launch (or run) finished is skipped; a launch that fails ends the slot, recorded."""
    slot, directory = run.slot, run.directory
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
            deployment = steps.launch()
        except LaunchError as exc:
            log.error("%s could not be launched: %s", slot.deployment_id, exc)
            outcome.error = str(exc).splitlines()[0]
            outcome.not_run([c.cell_id for c in todo_cells], "launch failed")
            return outcome
        outcome.launches.append(deployment.id)
        outcome.node = deployment.extra.get("node")
        reporter.deployment(deployment.id, f"ready in {deployment.ready_s:.0f} s")
        try:
            died = _measure(run, steps, deployment, todo_cells, todo_captures, todo_search, outcome, log)
        finally:
            steps.teardown(deployment)
        if not died:
            break
    else:
        outcome.error = f"engine died {MAX_LAUNCHES_PER_SLOT} times"
    return outcome


def _measure(
    run: SlotRun,
    steps: SlotSteps,
    deployment: Deployment,
    cells: list[CellPlan],
    captures: list[str],
    search: bool,
    outcome: SlotOutcome,
    log: logging.Logger | logging.LoggerAdapter,
) -> bool:
    """One launch's work: the cells, then the captures and the search; True when the engine died."""
    warm_launch(run, deployment, cells, log)
    for cell in cells:
        result = steps.cell(deployment, cell)
        outcome.cells[cell.cell_id] = result.status
        if result.status != "ok" and run.launcher.alive(deployment) is False:
            log.error("engine of %s died during %s; relaunching", deployment.id, cell.cell_id)
            return True
    for capture_id in captures:
        steps.capture(deployment, capture_id)
        outcome.captures.append(capture_id)
    if search and run.slot.search is not None:
        try:
            steps.capacity(deployment)
        except EngineGone as exc:
            log.error("%s; relaunching", exc)
            return True
    return False


def warm_launch(
    run: SlotRun, deployment: Deployment, cells: list[CellPlan], log: logging.Logger | logging.LoggerAdapter
) -> None:
    """Before a launch's first cell, C unmeasured requests at each closed-loop concurrency C of its cells, on
    the first cell's prompts: a fresh engine's first batches at a size are slower, and the first cell at that
    load would pay for them in its measured window (its own warm-up runs before that window, at its load only).
    A failure is logged, not raised: an engine that is gone fails the first cell, as it would have."""
    loads = sorted({c.concurrency for c in cells if c.concurrency is not None})
    if not run.spec.load.engine_warmup or not loads:
        return
    first = cells[0]
    try:
        warmed = warm_engine(
            deployment,
            loads,
            run.corpora[first.corpus_file].stratum(first.workload),
            run.spec.sampling_of(run.slot.variant),
            timeout_s=run.spec.load.request_timeout_s,
            time_cap_s=run.spec.load.time_cap_s,
        )
    except Exception as exc:  # the first cell finds out what is wrong, and records it
        log.warning("%s: engine warm-up failed (%s: %s)", deployment.id, type(exc).__name__, exc)
        return
    complete = all(ok == n for _, n, ok in warmed.loads)
    level = logging.INFO if complete else logging.WARNING  # a failed burst: the first cell will say why
    log.log(level, "%s: engine warmed up on %s (%s)", deployment.id, first.workload, warmed.describe())


def measure_cell(
    run: SlotRun, deployment: Deployment, cell: CellPlan, on_record: Callable[[RequestRecord], None]
) -> CellOutcome:
    """One cell of the slot on its deployment, written under the campaign's cells/."""
    spec = run.spec
    return run_cell(
        deployment,
        cell,
        campaign_id=run.campaign_id,
        repeat=run.slot.repeat,
        corpus=run.corpora[cell.corpus_file],
        sampling=spec.sampling_of(run.slot.variant),
        load=spec.load,
        slo=spec.slo,
        cells_dir=state.cells_dir(run.directory),
        seed=spec.seed,
        on_record=on_record,
    )


def capture_greedy(run: SlotRun, deployment: Deployment, capture_id: str) -> Path:
    """The slot's greedy capture `capture_id` of the spec's capture corpus."""
    spec = run.spec
    return capture(
        deployment,
        run.corpora[spec.capture.corpus],
        sampling=spec.sampling_of(deployment.variant),
        max_tokens=spec.capture.max_tokens,
        limit=spec.capture.limit,
        raw_campaign_dir=run.directory,
        capture_id=capture_id,
        campaign_id=run.campaign_id,
    )


def search_capacity(run: SlotRun, deployment: Deployment, on_point: Callable[[Point], None]) -> Path:
    """The slot's capacity search on its deployment; EngineGone when the engine died during it."""
    search = run.slot.search
    assert search is not None
    return search_deployment(
        deployment,
        search,
        run.spec,
        campaign_id=run.campaign_id,
        repeat=run.slot.repeat,
        corpus=run.corpora[search.corpus_file],
        directory=run.directory,
        alive=lambda: run.launcher.alive(deployment),
        on_point=on_point,
    )
