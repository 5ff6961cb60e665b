"""The ingest flow and the Prefect face of warehouse ingest: raw artifacts into the DuckDB warehouse, one
writer at a time.

Writers are serialised twice over: the Prefect global concurrency limit WRITER_LIMIT_NAME (so a UI-triggered
and a scheduled flow queue instead of failing; `writer_slot`) and the warehouse's own file lock (which also
covers the CLI). The ingest task retries only lock contention (WarehouseBusy: another writer kept the
warehouse past `lock_timeout_s`); a quarantined artifact is not an error of the task (it is in the report and
the quarantine table), and anything else fails at once. Other flows that write hold `writer_slot` too.
"""

import logging
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate
from prefect.exceptions import MissingContextError, ObjectNotFound

from artifacts import layout
from specgauge.errors import InputError
from specgauge.flow_paths import flow_path
from warehouse.db import writer
from warehouse.errors import WarehouseBusy
from warehouse.ingest import IngestReport, ingest_artifacts, ingest_raw
from warehouse.kinds.drafters import KIND as DRAFTERS
from warehouse.lock import WRITER_LIMIT_LEASE_S, WRITER_LIMIT_NAME, writer_active

__all__ = [
    "WRITER_LIMIT_NAME",
    "ingest_drafter",
    "ingest_task",
    "only_lock_contention",
    "run_ingest",
    "writer_slot",
]


def _logger() -> logging.Logger | logging.LoggerAdapter:
    try:
        return get_run_logger()
    except MissingContextError:
        return logging.getLogger("specgauge.warehouse")


WRITER_SLOT_WAIT_S = 30.0  # how long to wait for the Prefect writer slot before asking who holds it


@contextmanager
def writer_slot(db_path: Path | str | None = None, *, wait_s: float = WRITER_SLOT_WAIT_S) -> Iterator[None]:
    """Hold the Prefect writer slot (global concurrency limit WRITER_LIMIT_NAME) around a warehouse write.

    The slot queues flows visibly in the UI; what keeps writers apart is the warehouse's file lock, which
    dies with its holder. A slot does not: a writer SIGKILLed mid-ingest leaves it taken until its lease
    expires, and forever on an API that does not expire leases (the local profile's ephemeral server). So a
    waiter that got no slot within `wait_s` while no process holds the file lock frees the slot (a crashed
    writer left it) and goes on; while a live writer holds the file lock it keeps waiting.
    """
    from prefect.client.schemas.actions import GlobalConcurrencyLimitUpdate
    from prefect.concurrency.sync import concurrency

    from specgauge.settings import get_settings

    db = Path(db_path) if db_path else get_settings().warehouse_path
    with ExitStack() as held:
        while True:
            try:
                held.enter_context(
                    concurrency(
                        WRITER_LIMIT_NAME,
                        occupy=1,
                        lease_duration=WRITER_LIMIT_LEASE_S,
                        timeout_seconds=wait_s,
                    )
                )
                break
            except TimeoutError:
                if writer_active(db):
                    continue  # a live writer: keep waiting
                _logger().warning(
                    "the warehouse writer slot %s is taken but no process writes %s: a writer that "
                    "crashed left it; freeing it",
                    WRITER_LIMIT_NAME,
                    db,
                )
                with get_client(sync_client=True) as client:
                    client.update_global_concurrency_limit(
                        WRITER_LIMIT_NAME, GlobalConcurrencyLimitUpdate(active_slots=0)
                    )
        yield


def only_lock_contention(task, task_run, state) -> bool:
    """Retry when, and only when, the task failed because another writer held the warehouse."""
    try:
        state.result(raise_on_failure=True)
    except WarehouseBusy:
        return True
    except BaseException:
        return False
    return False


def run_ingest(
    raw_dir: Path | str | None = None,
    db_path: Path | str | None = None,
    *,
    lock_timeout_s: float | None = 300.0,
) -> IngestReport:
    """ingest_raw with its waiting and its outcome logged (to the Prefect run log inside a run)."""
    logger = _logger()
    report = ingest_raw(raw_dir, db_path, lock_timeout_s=lock_timeout_s, on_wait=logger.warning)
    counts = "; ".join(f"{kind}: {dict(c)}" for kind, c in report.counts().items())
    logger.info("ingested %s into %s in %.2f s (%s)", report.raw_dir, report.db_path, report.seconds, counts)
    for outcome in report.quarantined:
        logger.warning("quarantined %s", outcome.message)
    for outcome in report.errors:
        logger.error("%s", outcome.message)
    return report


@task(
    name="ingest-raw",
    retries=3,
    retry_delay_seconds=[10, 30, 60],
    retry_condition_fn=only_lock_contention,
)
def ingest_task(
    raw_dir: str | None = None, db_path: str | None = None, lock_timeout_s: float | None = 300.0
) -> dict[str, Any]:
    """Ingest raw artifacts into the warehouse; returns the report as a dict (counts, rows, quarantined)."""
    return run_ingest(raw_dir, db_path, lock_timeout_s=lock_timeout_s).as_dict()


def ingest_drafter(path: Path, db: str | None = None, *, lock_timeout_s: float | None = 300.0) -> str:
    """The drafter artifact's `drafters` row into the warehouse (idempotent: an unchanged one is skipped)."""
    path = Path(path)
    refs = [ref for ref in DRAFTERS.discover(path.parent, layout.DRAFTERS) if ref.path == path]
    if not refs:
        raise InputError(f"{path}: not a finished drafter artifact (RAW/drafters/<drafter_id>/card.json)")
    with writer(db, timeout_s=lock_timeout_s) as con:
        outcome = ingest_artifacts(con, DRAFTERS, refs)[0]
    if outcome.action == "quarantined":
        raise InputError(f"{path}: quarantined by the warehouse: {outcome.message}")
    return outcome.action


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
