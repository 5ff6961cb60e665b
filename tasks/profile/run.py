"""Profile one variant end to end: launch it with vLLM's torch profiler on, wait until it is ready, run one
profiled window, write the artifact, tear the deployment down (on every exit path). The plain function the
`profile` flow and `specgauge profile run` call."""

from __future__ import annotations

import json
from pathlib import Path

from artifacts import ids, layout
from experiments.plan import plan_campaign, resolve_repo_path
from experiments.spec import ExperimentSpec, Variant, load_spec
from specgauge.errors import InputError
from specgauge.provenance import utc_stamp
from specgauge.settings import get_settings
from tasks.campaign_state import next_launch_id, record_campaign
from tasks.health import wait_ready
from tasks.launch import deployed, launcher_for
from tasks.profile.window import ProfileResult, WindowPlan, WorkloadInfo, profile_id_for, run_window
from workloads.schema import load_corpus

TRACE_SUBDIR = "torch-traces"


def profiled_variant(variant: Variant, trace_dir: Path) -> Variant:
    """The variant with vLLM's torch profiler switched on, writing its traces into `trace_dir` (absolute)."""
    if "--profiler-config" in variant.extra_args:
        raise InputError(f"variant {variant.name!r} already sets --profiler-config; profiling sets its own")
    config = {"profiler": "torch", "torch_profiler_dir": str(Path(trace_dir).resolve())}
    return variant.model_copy(
        update={
            "extra_args": (
                *variant.extra_args,
                "--profiler-config",
                json.dumps(config, separators=(",", ":")),
            )
        }
    )


def profile_variant(
    spec: ExperimentSpec | Path | str,
    variant_name: str,
    *,
    plan: WindowPlan = WindowPlan(),
    workload_file: str | None = None,
    stratum: str | None = None,
    label: str | None = None,
    raw_dir: Path | None = None,
    campaign_id: str | None = None,
) -> ProfileResult:
    """Launch `variant_name` of the spec with profiling, run one window, write the artifact, tear down.

    Prompts: the spec's first workload file (or `workload_file`), restricted to `stratum` when given. The
    artifact goes to RAW/<campaign_id>/profiles/<profile_id>/, the deployment's own files (log, command,
    deployment.json, the engine's traces) to RAW/<campaign_id>/deployments/<campaign_id>.<variant>.profile.l<n>/.
    The campaign's campaign.json is written if this is the campaign's first artifact; a campaign flow that
    planned and recorded the campaign already passes its `campaign_id` instead (no second planning).
    """
    if not isinstance(spec, ExperimentSpec):
        spec = load_spec(spec)
    variant = next((v for v in spec.variants if v.name == variant_name), None)
    if variant is None:
        names = ", ".join(v.name for v in spec.variants)
        raise InputError(f"spec {spec.name!r} has no variant {variant_name!r} (variants: {names})")
    if spec.launcher.kind != "local":
        raise InputError(
            f"profiling launches the engine itself with vLLM's torch profiler: launcher kind "
            f"{spec.launcher.kind!r} is not supported (on clusters use the Nsight path, docs/profiling.md)"
        )
    file = workload_file or spec.workloads[0].file
    corpus = load_corpus(resolve_repo_path(file))
    prompts = list(corpus.stratum(stratum) if stratum else corpus.prompts)
    if not prompts:
        raise InputError(f"{file}: no prompts in stratum {stratum!r} (strata: {', '.join(corpus.strata)})")
    raw = Path(raw_dir) if raw_dir is not None else get_settings().raw_dir
    if campaign_id is None:
        campaign = plan_campaign(spec, label)
        campaign_id = campaign.campaign_id
        record_campaign(campaign, spec, raw)  # once per campaign: the warehouse needs it beside the profiles
    stamp = utc_stamp()
    campaign_dir = layout.campaign_dir(raw, campaign_id)
    deployment_id = next_launch_id(campaign_dir, ids.profile_slot_id(campaign_id, variant.name))
    directory = layout.deployment_dir(campaign_dir, deployment_id)
    trace_dir = directory / TRACE_SUBDIR
    launcher = launcher_for(spec)
    with deployed(
        launcher,
        spec.target_of(variant),
        profiled_variant(variant, trace_dir),
        deployment_id=deployment_id,
        directory=directory,
    ) as deployment:
        wait_ready(deployment, launcher, timeout_s=spec.launcher.ready_timeout_s)
        launcher.collect_facts(deployment)
        deployment.save()
        return run_window(
            deployment,
            prompts,
            campaign_id=campaign_id,
            raw_dir=raw,
            trace_dir=trace_dir,
            plan=plan,
            sampling=spec.sampling_of(variant),
            workload=WorkloadInfo(file=file, sha256=corpus.sha256, stratum=stratum),
            profile_id=profile_id_for(variant.name, stratum, plan.concurrency, stamp),
        )
