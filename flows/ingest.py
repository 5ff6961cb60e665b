"""The ingest flow: raw artifacts into the DuckDB warehouse, one writer at a time.

Writers are serialised twice over: the Prefect global concurrency limit below (so a UI-triggered and a
scheduled flow queue instead of failing) and the warehouse's own file lock (which also covers the CLI)."""

from typing import Any

from prefect import flow, get_run_logger
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate
from prefect.exceptions import ObjectNotFound

from specgauge.flow_paths import flow_path
from tasks.ingest import ingest_task, writer_slot
from warehouse.lock import WRITER_LIMIT_NAME


def ensure_writer_limit() -> None:
    """Create the writer limit (1 slot) on the API in use if it does not exist yet."""
    with get_client(sync_client=True) as client:
        try:
            client.read_global_concurrency_limit_by_name(WRITER_LIMIT_NAME)
        except ObjectNotFound:
            client.create_global_concurrency_limit(
                GlobalConcurrencyLimitCreate(name=WRITER_LIMIT_NAME, limit=1)
            )


@flow(name="ingest")
def ingest(
    raw_dir: str | None = None, db: str | None = None, campaign_id: str | None = None
) -> dict[str, Any]:
    """Ingest every raw artifact under raw_dir (default: the configured raw dir); already ingested ones are
    skipped, corrupt ones quarantined with the reason."""
    flow_path(raw_dir, "raw_dir")  # from a deployment: only under SPECGAUGE_HOME (specgauge.flow_paths)
    flow_path(db, "db")
    ensure_writer_limit()
    with writer_slot(db):
        report = ingest_task(raw_dir, db)
    if campaign_id:
        get_run_logger().info("ingest for campaign %s done", campaign_id)
    return report
