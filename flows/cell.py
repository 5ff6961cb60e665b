"""The cell flow: one cell against a server that is already running (an endpoint), outside any campaign.

Useful to measure a shared deployment or a gateway as it is: nothing is launched or torn down. The cell's
artifact lands in RAW/<campaign_id>/cells/ like a campaign's, so `specgauge ingest` takes it as it comes."""

from typing import Any

from prefect import flow, get_run_logger

from artifacts import ids, layout
from blocks import resolve_launcher_config
from experiments.plan import CellPlan, resolve_repo_path
from experiments.spec import SLO, EndpointLaunchSpec, LoadSpec, Sampling, TargetSpec, Variant
from tasks import campaign_state as state
from tasks.cell import run_cell
from tasks.health import wait_ready
from tasks.launch.endpoint import EndpointLauncher
from workloads.schema import load_corpus


@flow(name="cell", flow_run_name="cell-{stratum}-c{concurrency}")
def cell(
    model: str,
    base_url: str | None = None,
    block: str | None = None,
    workload: str = "workloads/smoke.jsonl",
    stratum: str = "chat",
    concurrency: int | None = 1,
    rate: float | None = None,
    requests: int = 16,
    warmup: int = 2,
    campaign_id: str = "adhoc",
    variant: str = "endpoint",
    temperature: float = 0.0,
) -> dict[str, Any]:
    """Measure one cell (closed loop at `concurrency`, or open loop at `rate` requests/s) on an endpoint
    given by `base_url` or by an EndpointBlock named `block` (which also carries its API key)."""
    corpus = load_corpus(resolve_repo_path(workload))
    launch = EndpointLaunchSpec(base_url=base_url, block=block)
    launcher = EndpointLauncher.from_spec(launch, resolve_launcher_config(launch))
    directory = state.campaign_dir(campaign_id)
    deployment_id = state.next_launch_id(directory, f"{campaign_id}.{variant}")
    deployment = launcher.launch(
        TargetSpec(model=model, served_model_name=model),
        Variant(name=variant),
        deployment_id=deployment_id,
        directory=layout.deployment_dir(directory, deployment_id),
    )
    wait_ready(deployment, launcher, timeout_s=120)
    mode = "open" if rate else "closed"
    plan = CellPlan(
        cell_id=ids.cell_id(variant, 0, stratum, ids.load_label(mode, concurrency, rate)),
        workload=stratum,
        mode=mode,
        concurrency=None if rate else concurrency,
        rate=rate,
        corpus_file=workload,
    )
    outcome = run_cell(
        deployment,
        plan,
        campaign_id=campaign_id,
        repeat=0,
        corpus=corpus,
        sampling=Sampling(temperature=temperature),
        load=LoadSpec(
            concurrencies=(concurrency,) if not rate else (),
            rates=(rate,) if rate else (),
            requests=requests,
            warmup=warmup,
            allow_short_cells=True,  # one ad hoc cell: the caller chose both counts
        ),
        slo=SLO(),
        cells_dir=state.cells_dir(directory),
    )
    launcher.teardown(deployment)
    get_run_logger().info("%s: %s (%s)", outcome.cell_id, outcome.status, outcome.path)
    return {
        "cell_id": outcome.cell_id,
        "status": outcome.status,
        "path": str(outcome.path),
        "summary": outcome.summary.model_dump(mode="json"),
    }
