"""A campaign's repeat blocks, up to `parallel_deployments` in flight at once: each block's slots run in their
recorded order on one node, adaptive repeats decide after each finished block whether to launch more, and a
failed or cancelled campaign launches nothing more and stops the engines of the blocks in flight. Plain code:
the campaign flow (flows/campaign.py) passes the function that runs one slot (its deployment subflow)."""

from __future__ import annotations

import contextvars
import logging
import threading
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Executor, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any

from experiments.plan import CampaignPlan, DeploymentPlan
from experiments.spec import ExperimentSpec
from tasks.launch import reap_leftovers
from tasks.launch.config import SavedSettings
from tasks.outcome import SKIPPED, SlotOutcome
from workloads.schema import Corpus

# Runs one slot, pinned to a node (None: the scheduler's choice); returns its SlotOutcome as a dict.
RunSlot = Callable[[DeploymentPlan, str | None], dict[str, Any]]


@dataclass(frozen=True)
class BlockDecision:
    """The adaptive-repeats rule's answer after a finished block: stop launching arm blocks or not, why, and
    the decision as the campaign's run record keeps it."""

    stop: bool
    reason: str
    record: dict[str, Any]


# The adaptive rule on the repeat blocks finished so far (their repeat numbers): the campaign flow passes it
# (analysis.adaptive_repeats judges), so this module measures and never analyses.
DecideRepeats = Callable[[list[int]], BlockDecision]


def run_block(
    block: tuple[DeploymentPlan, ...], run_slot: RunSlot, stop: threading.Event
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
        outcome = run_slot(slot, node)
        outcomes.append(outcome)
        node = node or outcome.get("node")
    return outcomes


def run_blocks(
    spec: ExperimentSpec,
    plan: CampaignPlan,
    run_slot: RunSlot,
    *,
    decide_repeats: DecideRepeats | None,
    saved: SavedSettings,
    log: logging.Logger | logging.LoggerAdapter,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Every repeat block, then the gate's controls, with up to `parallel_deployments` blocks in flight at
    once (each a thread running deployment subflows). With adaptive repeats (`decide_repeats`), after each
    finished block the rule decides whether to launch more: once it stops, the blocks not yet launched are recorded as not run
    (blocks already in flight finish). Returns the slot outcomes in plan order and the rule's decisions.
    `saved` reads the launcher settings the engines of a failed campaign are stopped with."""
    blocks = plan.blocks()
    queue = list(range(len(blocks)))
    outcomes: dict[int, list[dict[str, Any]]] = {}
    decisions: list[dict[str, Any]] = []
    finished: list[int] = []
    stop = threading.Event()
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
                    running[pool.submit(context.run, run_block, blocks[index], run_slot, stop)] = index
                done, _ = wait(running, return_when=FIRST_COMPLETED)
                for future in done:
                    index = running.pop(future)
                    outcomes[index] = future.result()
                    if blocks[index][0].role == "arm":
                        finished.append(blocks[index][0].repeat)
                if decide_repeats is None or not any(blocks[i][0].role == "arm" for i in queue):
                    continue
                decision = decide_repeats(finished)
                decisions.append(decision.record)
                log.info("adaptive repeats: %s", decision.reason)
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
                reap_leftovers(include_own=True, id_prefix=plan.campaign_id + ".", saved=saved)
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


def slot_corpora(spec: ExperimentSpec, plan: CampaignPlan, slot: DeploymentPlan) -> dict[str, Corpus]:
    """The workload files one slot needs (its cells', its search's, and the capture corpus if it captures)."""
    files = {c.corpus_file for c in slot.cells} | ({spec.capture.corpus} if slot.captures else set())
    if slot.search is not None:
        files.add(slot.search.corpus_file)
    return {f: plan.corpora[f] for f in sorted(files)}
