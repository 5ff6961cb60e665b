"""The sampling-check flow: correctness under sampling, after the gate (docs/gate.md "Under sampling").

It launches plain twice (the second launch is the null arm) and each checked speculative variant once, one at
a time; on each it draws the spec's samples of the capture corpus's first prompts (tasks.sampling_check) and
tears it down; then it judges each variant against plain and the null arm and writes the verdict's artifact
(analysis.sampling_report). A re-run skips variants whose check exists, and launches nothing when all do."""

from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE

from analysis.sampling_report import judge_arms, write_check
from artifacts import layout
from artifacts.documents.sampling_checks import SampledArm
from artifacts.store import read_json
from blocks import resolve_launcher_config
from experiments.plan import resolve_repo_path
from experiments.spec import ExperimentSpec, SamplingCheckSpec, Variant
from tasks.campaign_state import next_launch_id
from tasks.health import ready_deployment
from tasks.launch import launcher_for
from tasks.sampling_check import SEED_STRIDE, draw
from workloads.schema import Prompt, load_corpus


@task(name="sampling-draw", cache_policy=NO_CACHE)
def draw_launch(
    spec: ExperimentSpec, campaign_id: str, directory: Path, variant: Variant, role: str, seed_base: int
) -> SampledArm:
    """Launch `variant` once, draw the check's samples on it, tear it down."""
    check = spec.sampling_check
    assert check is not None
    launcher = launcher_for(spec, resolve_launcher_config(spec.launcher))
    launch_id = next_launch_id(directory, f"{campaign_id}.{variant.name}.sampling")
    with ready_deployment(
        launcher, spec.target_of(variant), variant, directory, launch_id, spec.launcher.ready_timeout_s
    ) as deployment:
        deployment.save()
        arm = draw(deployment, _prompts(spec, check), check, role=role, seed_base=seed_base)
    get_run_logger().info(
        "%s (%s): %d prompts sampled in %.1f s", launch_id, role, len(arm.samples), arm.wall_s
    )
    return arm


def _prompts(spec: ExperimentSpec, check: SamplingCheckSpec) -> list[Prompt]:
    return list(load_corpus(resolve_repo_path(spec.capture.corpus)).prompts[: check.prompts])


def checked_variants(spec: ExperimentSpec) -> list[Variant]:
    check = spec.sampling_check
    assert check is not None
    return [
        v for v in spec.variants if v.speculative and (check.variants is None or v.name in check.variants)
    ]


def _existing(directory: Path, variant: str) -> dict[str, Any] | None:
    for path in sorted(layout.sampling_check_files(directory), reverse=True):
        data = read_json(path)
        if data.get("treatment_variant") == variant:
            return {
                "treatment": variant,
                "outcome": data["outcome"],
                "claim": data["claim"],
                "path": str(path),
            }
    return None


@flow(name="sampling-check")
def sampling_check(spec: ExperimentSpec, campaign_id: str, directory: str) -> list[dict[str, Any]]:
    """Check every chosen speculative variant under sampling; one verdict artifact each."""
    check = spec.sampling_check
    if check is None or not check.enabled:
        return []
    root, logger = Path(directory), get_run_logger()
    variants = checked_variants(spec)
    done = {v.name: _existing(root, v.name) for v in variants}
    todo = [v for v in variants if done[v.name] is None]
    results = [d for d in done.values() if d is not None]
    if not todo:
        return results
    plain = draw_launch(spec, campaign_id, root, spec.plain, "plain", 0)
    plain_again = draw_launch(spec, campaign_id, root, spec.plain, "plain_again", SEED_STRIDE)
    for index, variant in enumerate(todo):
        treatment = draw_launch(spec, campaign_id, root, variant, "treatment", (index + 2) * SEED_STRIDE)
        verdict = judge_arms(plain, treatment, plain_again, check)
        path = write_check(
            verdict,
            (plain, treatment, plain_again),
            check,
            campaign_id=campaign_id,
            raw_campaign_dir=root,
            variant=variant,
        )
        logger.info("sampling check %s: %s: %s", variant.name, verdict.outcome, verdict.claim)
        results.append(
            {"treatment": variant.name, "outcome": verdict.outcome, "claim": verdict.claim, "path": str(path)}
        )
    return results
