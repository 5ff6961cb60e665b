"""`specgauge import seed RESULTS_DIR`: the reference study's results as an imported campaign.

A thin shell over flows.import_reference.import_seed; its errors (a missing folder, a campaign id taken by
a campaign that was not imported, a name from the data that cannot be a folder name, a busy warehouse or
import target past --lock-timeout) go to the CLI's one error boundary (exit 2). A second import of the same
campaign waits for the first, saying whom it waits for, then adds nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from cli.commands.warehouse_options import DbOption, LockTimeout, say_waiting

console = Console(soft_wrap=True)
err_console = Console(stderr=True, soft_wrap=True)

import_app = typer.Typer(
    help="Import results measured by other harnesses into the warehouse, as campaigns marked imported.",
    no_args_is_help=True,
)

SEED_HELP = "\n\n".join(
    [
        "Import the reference study's results (github.com/swiss-ai/apertus-speculative-decoding) as the "
        "campaign seed-<name> (name: the RESULTS_DIR folder's, or --campaign), marked imported "
        "(SELECT * FROM campaigns WHERE imported), then ingest it: its cells appear in v_cells and "
        "v_acceptance like ours.",
        "Reads every reference cell folder under RESULTS_DIR, wherever it is: metadata.json (served model, "
        "variant, workload, concurrency, generation settings, extra), summary.json (request counts, wall "
        "time, latency in ms), requests.jsonl (per request: ttft_ms, tpot_ms, e2e_ms, stream_event_gaps_ms, "
        "tokens) and metrics_before.prom / metrics_after.prom (vLLM /metrics around the measured window). "
        "One deployment per served model (arm and job), numbered as repeats in the order they ran.",
        "Acceptance is recomputed from the two snapshots by specgauge's own code, never copied. Latency "
        "comes from requests.jsonl through specgauge's summary code when present, else from summary.json "
        "(no p90 there). No request rows or gauge samples are imported (the reference has no common "
        "request clock).",
        "Not imported, and listed with the reason: gate verdicts, greedy captures, load-test summaries, "
        "logs and any file the importer does not read. A file that cannot be read or validated is listed "
        "as damaged and its cell skipped; the rest still imports. Raw files already written are never "
        "rewritten: a second import adds nothing; one started while another imports the same campaign waits "
        "for it (--lock-timeout bounds the wait). A variant name or workload that cannot be a folder name "
        "(letters, digits, '.', '_', '-') refuses the whole import, naming the file and field.",
        "Exit 0: imported, nothing damaged; 1: something damaged or quarantined (the rest imported); "
        "2: nothing importable found, or an error.",
    ]
)


def seed(
    results_dir: Annotated[
        Path, typer.Argument(help="The reference results folder (e.g. results/70b/diagnostics-20260919).")
    ],
    campaign: Annotated[
        str | None,
        typer.Option("--campaign", help="Campaign name (seed-<name>); default: RESULTS_DIR's folder name."),
    ] = None,
    raw_dir: Annotated[
        Path | None,
        typer.Option(
            "--raw", help="Raw artifact root to write into. Default: SPECGAUGE_HOME/raw.", file_okay=False
        ),
    ] = None,
    db: DbOption = None,
    lock_timeout: LockTimeout = None,
) -> None:
    from flows.import_reference import import_seed
    from specgauge.settings import get_settings

    result = import_seed(
        results_dir,
        raw_dir if raw_dir is not None else get_settings().raw_dir,
        db,
        campaign,
        lock_timeout_s=lock_timeout,
        on_wait=say_waiting,  # another import of the same campaign, or another warehouse writer
    )
    console.print(
        f"{result.campaign_id}: {len(result.written)} cell(s) written, {len(result.already)} already "
        f"imported, {len(result.deployments)} deployment(s) written -> {result.campaign_dir}",
        highlight=False,
        markup=False,
    )
    if result.ingest is not None:
        report = result.ingest
        counts = ", ".join(
            f"{kind}: " + " ".join(f"{a} {n}" for a, n in sorted(c.items()))
            for kind, c in report.counts().items()
        )
        console.print(f"ingest -> {report.db_path}: {counts or 'nothing'}", highlight=False, markup=False)
        for outcome in report.quarantined + report.errors:
            err_console.print(
                f"quarantined {outcome.source_path}: {outcome.message}", highlight=False, markup=False
            )
    if result.skipped:
        table = Table(title="skipped", title_justify="left")
        table.add_column("file", overflow="fold")
        table.add_column("why", overflow="fold")
        for item in result.skipped:
            table.add_row(str(item.path), ("DAMAGED: " if item.damaged else "") + item.reason)
        console.print(table)
    if not result.importable:
        err_console.print(f"nothing importable found under {results_dir}", highlight=False, markup=False)
    raise typer.Exit(code=result.exit_code)


def register(app: typer.Typer) -> None:
    import_app.command("seed", help=SEED_HELP)(seed)
    app.add_typer(import_app, name="import")
