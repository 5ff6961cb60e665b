"""A confirmation's deployments: the hot-swap deployment of the eagle3 variant, on which the randomised
schedule runs (a block swaps its head in when it is not serving, then runs the stratum's cells; after the
schedule the new head is swapped in once more and the capture corpus captured greedily for the gate; the old
head is swapped back in on every exit path), and the plain launches of the gate's plain side."""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from artifacts import ids, layout
from artifacts.store import read_json
from experiments.plan import resolve_repo_path
from experiments.spec import Variant
from specgauge.provenance import utc_now
from tasks import adapt
from tasks.adapt import Block, PlainCaptures
from tasks.adaptation.inputs import Inputs
from tasks.campaign_state import next_launch_id
from tasks.capture import capture
from tasks.cell import run_cell
from tasks.health import wait_ready
from tasks.launch import Launcher, deployed
from tasks.launch.base import Deployment
from workloads.schema import Corpus, load_corpus

Log = logging.Logger | logging.LoggerAdapter


class ServerSwapper:
    """The real swapper: tasks.drafters.swap against the running deployment."""

    def __init__(self, deployment: Deployment) -> None:
        self.deployment = deployment

    def swap(self, head_dir: Path) -> dict[str, Any]:
        from tasks.drafters.swap import swap_head

        record = swap_head(self.deployment, head_dir)
        return asdict(record)

    def serving(self) -> str | None:
        from tasks.drafters.swap import serving_drafter_sha256

        return serving_drafter_sha256(self.deployment)


def launch_ready(inputs: Inputs, launcher: Launcher, directory: Path, slot: str, variant: Variant):
    """A context manager: the deployment of `variant` in `slot`, launched, torn down on exit."""
    launch_id = next_launch_id(directory, slot)
    return deployed(
        launcher,
        inputs.spec.target_of(variant),
        variant,
        deployment_id=launch_id,
        directory=layout.deployment_dir(directory, launch_id),
    )


def wait_until_ready(deployment: Deployment, launcher: Launcher, inputs: Inputs) -> None:
    wait_ready(deployment, launcher, timeout_s=inputs.spec.launcher.ready_timeout_s)
    launcher.collect_facts(deployment)
    deployment.save()


def capture_greedy(
    deployment: Deployment,
    inputs: Inputs,
    corpus: Corpus,
    directory: Path,
    capture_id: str,
    max_tokens: int | None,
) -> Path:
    return capture(
        deployment,
        corpus,
        sampling=inputs.spec.sampling_of(deployment.variant),
        max_tokens=max_tokens,
        limit=inputs.spec.capture.limit,
        raw_campaign_dir=directory,
        capture_id=capture_id,
        campaign_id=inputs.campaign_id,
    )


@dataclass
class Measurement:
    """What the hot-swap deployment did: the schedule as far as it ran, and why it stopped if it failed."""

    started_utc: str
    deployment_id: str
    schedule: adapt.ScheduleResult
    error: (
        str | None
    )  # the schedule raised (written as a failed confirmation; the deployment went down first)
    max_tokens: int | None  # the captures' cap: the spec's, or the reused plain captures'


def capture_max_tokens(inputs: Inputs, raw: Path) -> int | None:
    """The cap of the new head's capture: the reused plain captures' (the gate compares like with like)."""
    if not (inputs.gate and inputs.plain_from):
        return inputs.spec.capture.max_tokens
    plain = adapt.plain_captures_of(
        raw / inputs.plain_from,
        target_model=str(resolve_repo_path(inputs.spec.target.model)),
        max_tokens=None,
    )
    return read_json(plain.base / layout.META).get("max_tokens")


def run_schedule_on_deployment(
    inputs: Inputs, launcher: Launcher, directory: Path, log: Log | None = None
) -> Measurement:
    """Launch the eagle3 variant with the old head, run the schedule of swaps and cells on it, capture the
    new head's outputs for the gate, swap the old head back in, tear down. A failed launch raises; a failure
    during the schedule is returned (Measurement.error)."""
    started = utc_now()
    max_tokens = capture_max_tokens(inputs, directory.parent)
    capture_corpus = load_corpus(resolve_repo_path(inputs.spec.capture.corpus)) if inputs.gate else None
    result = adapt.ScheduleResult()
    error: str | None = None
    with launch_ready(inputs, launcher, directory, inputs.slot, inputs.variant) as deployment:
        wait_until_ready(deployment, launcher, inputs)
        if log:
            log.info("%s ready (old head %s); %d blocks", deployment.id, inputs.old.path, len(inputs.blocks))

        def capture_new(tracked: adapt.Swapper) -> None:
            assert capture_corpus is not None
            capture_new_head(tracked, deployment, inputs, capture_corpus, directory, max_tokens)

        try:
            adapt.run_schedule(
                inputs.blocks,
                {"old": inputs.old, "new": inputs.new},
                ServerSwapper(deployment),
                lambda block: run_block_cells(deployment, inputs, directory, block, log),
                after=capture_new if inputs.gate else None,
                result=result,
            )
        except Exception as exc:  # written as a failed confirmation; the deployment goes down first
            error = f"{type(exc).__name__}: {exc}"
    return Measurement(started, deployment.id, result, error, max_tokens)


def run_block_cells(
    deployment: Deployment, inputs: Inputs, directory: Path, block: Block, log: Log | None
) -> list[tuple[str, str]]:
    """One block's cells on the deployment, under the head now serving: (cell id, status) each."""
    out = []
    for plan in inputs.cell_plans(block):
        _, corpus = inputs.corpora[block.stratum]
        outcome = run_cell(
            deployment,
            plan,
            campaign_id=inputs.campaign_id,
            repeat=block.repeat,
            corpus=corpus,
            sampling=inputs.spec.sampling_of(inputs.variant),
            load=inputs.load,
            slo=inputs.spec.slo,
            cells_dir=layout.cells_dir(directory),
            seed=inputs.spec.seed,
        )
        if log:
            speculation = outcome.summary.speculation
            mal = speculation.mean_acceptance_length if speculation else None
            log.info(
                "block %d (%s head): %s %s, MAL %s",
                block.position,
                block.head,
                plan.cell_id,
                outcome.status,
                mal,
            )
        out.append((plan.cell_id, outcome.status))
    return out


def capture_new_head(
    tracked: adapt.Swapper,
    deployment: Deployment,
    inputs: Inputs,
    corpus: Corpus,
    directory: Path,
    max_tokens: int | None,
) -> None:
    """The gate's capture with the new head serving (swapped in unless the last block left it serving)."""
    if layout.capture_complete(layout.capture_dir(directory, inputs.capture_id)):
        return
    if tracked.serving() != inputs.new.sha256:
        tracked.swap(inputs.new.path)
    served = tracked.serving()
    if served is not None and served != inputs.new.sha256:
        raise adapt.AdaptationError(f"after the swap for the gate the server serves {served[:12]}")
    capture_greedy(deployment, inputs, corpus, directory, inputs.capture_id, max_tokens)


def plain_captures(
    inputs: Inputs, launcher: Launcher, directory: Path, max_tokens: int | None
) -> PlainCaptures:
    """The gate's plain side: an earlier campaign's plain captures (`plain_from`), else two plain launches of
    this confirmation (the first captured twice: the same-deployment control; the second once: the
    cross-deployment control). Captures already taken are not taken again."""
    raw = directory.parent
    if inputs.plain_from:
        return adapt.plain_captures_of(
            raw / inputs.plain_from,
            target_model=str(resolve_repo_path(inputs.spec.target.model)),
            max_tokens=max_tokens,
        )
    plain = inputs.spec.plain
    corpus = load_corpus(resolve_repo_path(inputs.spec.capture.corpus))
    taken: list[Path] = []
    for slot, names in (
        (
            ids.slot_id(inputs.campaign_id, plain.name, 0),
            [ids.capture_id(plain.name, 0), ids.repeat_capture_id(plain.name, 0)],
        ),
        (ids.control_slot_id(inputs.campaign_id, plain.name, 1), [ids.control_capture_id(plain.name, 1)]),
    ):
        todo = [n for n in names if not layout.capture_complete(layout.capture_dir(directory, n))]
        if todo:
            with launch_ready(inputs, launcher, directory, slot, plain) as deployment:
                wait_until_ready(deployment, launcher, inputs)
                for name in todo:
                    capture_greedy(deployment, inputs, corpus, directory, name, max_tokens)
        taken += [layout.capture_dir(directory, n) for n in names]
    base, again, other = taken
    return PlainCaptures(base=base, controls=((base, again), (base, other)), campaign_id=inputs.campaign_id)
