"""The analyze flow: answer the five research questions for one campaign of the warehouse, store the results
in its `analysis_*` tables, and write the report (SPECGAUGE_HOME/reports/<campaign_id>/index.html).

Thin: analysis.run.analyze_campaign does the work; this flow adds the writer's global concurrency limit, a
retry on lock contention, and Prefect artifacts pointing at the report.
"""

from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_link_artifact, create_markdown_artifact
from prefect.cache_policies import NO_CACHE
from pydantic import BaseModel, Field

from analysis.run import analyze_campaign
from analysis.serve import report_url
from flows.alerts import CAMPAIGN_INVALID, alert
from flows.ingest import ensure_writer_limit, only_lock_contention, writer_slot
from specgauge.flow_paths import flow_path

KEY_CHARTS = ("speedup_closed", "speedup_open", "acceptance_positions", "latency")
"""Charts shown inline in the run's summary artifact (the report has them all)."""


def _artifact_key(campaign_id: str) -> str:
    # Prefect artifact keys: lowercase letters, digits and dashes only.
    return "".join(ch if ch.isalnum() else "-" for ch in campaign_id.lower()) + "-analysis"


@task(
    name="analyze-campaign",
    cache_policy=NO_CACHE,
    retries=2,
    retry_delay_seconds=[10, 30],
    retry_condition_fn=only_lock_contention,
)
def analyze_task(campaign_id: str | None, db: str | None, reports_dir: str | None) -> dict[str, Any]:
    logger = get_run_logger()
    result = analyze_campaign(
        campaign_id,
        db,
        reports_dir=reports_dir,
        on_wait=logger.warning,
        write_guard=lambda: writer_slot(db),
    )
    summary = result.as_dict()
    logger.info(
        "analysed %s in %.1f s: %s; report %s",
        result.campaign_id,
        result.seconds,
        ", ".join(f"{t} {n}" for t, n in result.rows.items()),
        result.report,
    )
    for note in result.results.notes:
        logger.warning("%s", note)
    return summary


class AnalysisRequest(BaseModel):
    """What to analyse: the run form of the `analyze` deployment (each field's description is its help)."""

    campaign_id: str | None = Field(
        default=None,
        description='The campaign to analyse (`specgauge sql "SELECT campaign_id FROM campaigns"`). Empty: '
        "the latest one in the warehouse.",
    )
    db: str | None = Field(
        default=None,
        description="Another warehouse file (DuckDB) on the worker's machine. Empty: the worker's default.",
    )
    reports_dir: str | None = Field(
        default=None,
        description="Where report folders go on the worker's machine. Empty: SPECGAUGE_HOME/reports, which "
        "the report server serves.",
    )


@flow(name="analyze", log_prints=True)
def analyze(request: AnalysisRequest | None = None) -> dict[str, Any]:
    """Analyse a campaign already in the warehouse (default: the latest) and write its report.

    Returns {"campaign_id", "analysis_id", "report": <index.html>, "tables": [...], "charts", "winners",
    "notes", ...}."""
    request = request or AnalysisRequest()
    flow_path(request.db, "db")  # from a deployment: only under SPECGAUGE_HOME (specgauge.flow_paths)
    flow_path(request.reports_dir, "reports_dir")
    ensure_writer_limit()
    summary = analyze_task(request.campaign_id, request.db, request.reports_dir)
    report = summary["report"]
    key = _artifact_key(summary["campaign_id"])
    winners = summary["winners"]
    folder = Path(request.reports_dir) if request.reports_dir else None
    link = report_url(report, folder)
    served = not link.startswith("file:")
    create_link_artifact(
        key=key,
        link=link,
        link_text=f"report of {summary['campaign_id']}",
        description=f"Analysis {summary['analysis_id']} of campaign {summary['campaign_id']}"
        + ("" if served else " (a file on the worker's machine: start `specgauge reports serve` to link it)"),
    )
    charts = [  # the key charts inline, where the report server can serve their images
        f"![{name}]({report_url(files['png'], folder)})"
        for name, files in summary["charts"].items()
        if served and name in KEY_CHARTS and Path(files["png"]).exists()
    ]
    create_markdown_artifact(
        key=key + "-summary",
        markdown="\n".join(
            [
                f"# Analysis of {summary['campaign_id']}",
                "",
                f"Report: [{link}]({link})"
                + ("" if served else " (a self-contained page on the worker's disk)"),
                "",
                f"Winners under the decision rule: {', '.join(winners) if winners else 'none'}",
                "",
                *(charts and [*charts, ""]),
                f"Tables: {', '.join(f'`{t}`' for t in summary['tables'])}",
                *(["", "## Notes", *[f"- {n}" for n in summary["notes"]]] if summary["notes"] else []),
            ]
        ),
        description=f"What the analysis of {summary['campaign_id']} found",
    )
    if not summary["valid"]:
        alert(
            CAMPAIGN_INVALID,
            summary["campaign_id"],
            title=f"campaign {summary['campaign_id']} is invalid: nothing is recommended from it",
            summary=summary["invalid_reasons"],
            report=link,
        )
    return summary
