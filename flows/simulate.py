"""The simulate flow: replay a campaign's greedy captures offline (trees, grafts, two drafters), validate
the replay against the served counters, project each shape's cost from the campaign's measured cells,
store the tree_sim tables, then re-render the campaign's report with its "Trees and drafter combinations
(offline)" section.

Thin: analysis.simulate.whole_campaign.simulate_campaign does the work; this flow adds the writer's global
concurrency limit, a retry on lock contention, and the analyze flow for the report.
"""

from typing import Any

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE
from pydantic import BaseModel, Field

from analysis.simulate.whole_campaign import simulate_campaign
from flows.ingest import ensure_writer_limit, only_lock_contention, writer_slot
from specgauge.flow_paths import flow_path


@task(
    name="simulate-campaign",
    cache_policy=NO_CACHE,
    retries=2,
    retry_delay_seconds=[10, 30],
    retry_condition_fn=only_lock_contention,
)
def simulate_task(
    campaign_id: str, shapes: str | None, db: str | None, proposers: list[str] | None, tail: int, dtype: str
) -> dict[str, Any]:
    logger = get_run_logger()
    result = simulate_campaign(
        campaign_id,
        shapes,
        db_path=db,
        proposers=proposers,
        tail=tail,
        dtype=dtype,
        store=True,
        on_wait=logger.warning,
        on_warning=logger.warning,
        write_guard=lambda: writer_slot(db),
    )
    logger.info(
        "simulated %s in %.1f s: %d validated (%s), %d projections; %s",
        result.campaign_id,
        result.seconds,
        result.validation.height,
        "a miss" if result.missed_target else "all within 5%",
        result.projections.height,
        result.cost.describe() if result.cost else "no cost model",
    )
    for note in result.notes:
        logger.warning("%s", note)
    return result.as_dict()


class SimulationRequest(BaseModel):
    """What to simulate: the run form of the `simulate` deployment (each field's description is its help)."""

    campaign_id: str = Field(
        description="The campaign whose greedy captures to replay (it must be in the warehouse)."
    )
    shapes: str | None = Field(
        default=None,
        description="Shapes to project beside the served chains, comma-separated: chain:k=5, "
        "tree:b=2:budget=8, graft:b=2:budget=8:k=3@eagle3+ngram, union:k=3@draft+eagle3 (docs/simulate.md).",
    )
    db: str | None = Field(
        default=None,
        description="Another warehouse file on the worker's machine. Empty: the worker's default.",
    )
    reports_dir: str | None = Field(
        default=None, description="Where report folders go. Empty: SPECGAUGE_HOME/reports."
    )
    proposers: list[str] | None = Field(
        default=None,
        description="Proposers for shapes without `@` (ngram, suffix, draft, eagle3). Empty: those served.",
    )
    tail: int = Field(
        default=8,
        ge=0,
        le=4096,  # tokens generated offline per output: a bound on the run's time and memory
        description="Tokens of the target's continuation past each output, for the last step's drafts.",
    )
    dtype: str = Field(
        default="bfloat16", description="The models' dtype offline (bfloat16, as the engine serves them)."
    )
    report: bool = Field(
        default=True, description="Re-render the campaign's report with its offline section afterwards."
    )


@flow(name="simulate", log_prints=True)
def simulate(request: SimulationRequest) -> dict[str, Any]:
    """Simulate a campaign that is in the warehouse, store its tree_sim rows and (with `report`) re-render
    its report. Returns the simulation's summary, with "report" when it was rendered."""
    flow_path(request.db, "db")  # from a deployment: only under SPECGAUGE_HOME (specgauge.flow_paths)
    flow_path(request.reports_dir, "reports_dir")
    ensure_writer_limit()
    summary = simulate_task(
        request.campaign_id, request.shapes, request.db, request.proposers, request.tail, request.dtype
    )
    if request.report:
        from flows.analyze import AnalysisRequest, analyze

        analysis = AnalysisRequest(
            campaign_id=summary["campaign_id"], db=request.db, reports_dir=request.reports_dir
        )
        summary["report"] = analyze(analysis)["report"]
    return summary
