"""`specgauge analyze` and `specgauge report`: answer the research questions for a campaign of the warehouse
and print where its report is. Thin shells over analysis.run; the report page's path is always the LAST line
printed, so scripts can take it with `tail -1`. Expected failures (the project's errors) go to the CLI's one
error boundary (cli/app.py): one line on stderr, exit 2.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from cli.commands.warehouse_options import DbOption, say_waiting
from cli.tables import titled_table

console = Console(soft_wrap=True)

ReportsOption = Annotated[
    Path | None,
    typer.Option(
        "--reports-dir",
        help="Where report folders go (<dir>/<campaign_id>/index.html). Default: SPECGAUGE_HOME/reports.",
        file_okay=False,
    ),
]


def _run(campaign_id: str | None, db: Path | None, reports_dir: Path | None):
    from analysis.run import analyze_campaign

    return analyze_campaign(campaign_id, db, reports_dir=reports_dir, on_wait=say_waiting)


def _print_summary(result) -> None:
    decisions = result.results.decisions
    columns = ("variant", "workload", "load", "gain [interval]", "success", "gate", "wins", "reason")
    table = titled_table(f"decisions for {result.campaign_id}", columns)
    for r in decisions.iter_rows(named=True):
        gain = (
            "–"
            if r["estimate"] is None
            else f"{r['estimate']:.3g} "
            + (
                f"[{r['ci_low']:.3g}, {r['ci_high']:.3g}]"
                if r["ci_low"] is not None
                else f"({r['interval']})"
            )
        )
        table.add_row(
            r["variant"],
            r["workload"],
            r["load_label"],
            gain,
            "–" if r["success_rate"] is None else f"{r['success_rate']:.1%}",
            {True: "passed", False: "FAILED"}.get(r["gate_passed"], "none"),
            "yes" if r["wins"] else "no",
            r["reason"],
        )
    console.print(table)
    for note in result.results.notes:
        console.print(f"note: {note}", markup=False, highlight=False)
    rows = ", ".join(f"{t} {n}" for t, n in result.rows.items())
    console.print(
        f"analysis {result.analysis_id}: {rows}; {result.seconds:.1f} s", markup=False, highlight=False
    )


reports_app = typer.Typer(help="Reports: serve them to browsers.", no_args_is_help=True)


@reports_app.command("serve")
def serve_cmd(
    host: Annotated[
        str, typer.Option(help="Address to bind. Another machine's browser needs 0.0.0.0 or this host's.")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port (0: any free port).", min=0, max=65535)] = 4280,
    reports_dir: ReportsOption = None,
) -> None:
    """Serve the reports folder (read-only, nothing outside it) so that the Prefect UI's report links
    open in any browser (foreground; Ctrl-C stops it). Flows link there when SPECGAUGE_REPORTS_URL is
    set (`specgauge prefect worker` sets it to this server's default address)."""
    from analysis.serve import base_url, report_server

    server = report_server(reports_dir, host, port)
    console.print(f"serving {server.RequestHandlerClass.keywords['directory']} at {base_url(server)}")
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


def analyze_cmd(
    campaign_id: Annotated[
        str | None,
        typer.Argument(
            help="Campaign to analyse (see `specgauge sql 'SELECT campaign_id FROM campaigns'`). "
            "Default: the latest campaign in the warehouse."
        ),
    ] = None,
    db: DbOption = None,
    reports_dir: ReportsOption = None,
) -> None:
    """Answer the five research questions for a campaign already in the warehouse.

    Speedups against plain with Student t intervals over repeats (log scale), acceptance fits, depth and break-even,
    n-gram vs draft model, capacity under the SLO, crossover loads, and the decision rule. Results replace
    the campaign's rows in the `analysis_*` tables (one transaction); charts (HTML + PNG) and a
    self-contained report page go to SPECGAUGE_HOME/reports/<campaign_id>/. The last line printed is the
    report page's path.
    """
    result = _run(campaign_id, db, reports_dir)
    _print_summary(result)
    typer.echo(str(result.report))


def report_cmd(
    campaign_id: Annotated[
        str | None, typer.Argument(help="Campaign whose report to show (or use --latest).")
    ] = None,
    latest: Annotated[bool, typer.Option("--latest", help="The latest campaign in the warehouse.")] = False,
    refresh: Annotated[
        bool, typer.Option("--refresh", help="Re-analyse even when the report already exists.")
    ] = False,
    db: DbOption = None,
    reports_dir: ReportsOption = None,
) -> None:
    """Print the path of a campaign's report page (LAST line), analysing the campaign first when it has no
    report yet (or with --refresh). Give a campaign id or --latest."""
    from analysis.data import resolve_campaign_id
    from analysis.run import report_path
    from specgauge.errors import InputError
    from warehouse.db import reader

    if (campaign_id is None) == (not latest):
        raise InputError("give a campaign id or --latest (not both)")
    with reader(db, on_wait=say_waiting) as con:
        resolved = resolve_campaign_id(con, campaign_id)
    path = report_path(resolved, reports_dir)
    if refresh or not path.is_file():
        result = _run(resolved, db, reports_dir)
        _print_summary(result)
        path = result.report
    typer.echo(str(path))


def recommend_cmd(
    campaign_id: Annotated[
        str | None,
        typer.Argument(help="Campaign to recommend from. Default: the latest campaign in the warehouse."),
    ] = None,
    db: DbOption = None,
    workload: Annotated[str | None, typer.Option(help="Only this workload (stratum).")] = None,
    max_batch: Annotated[
        int,
        typer.Option(help="The deployment's max_num_seqs: the last range runs to it.", min=1, max=65536),
    ] = 256,
    as_json: Annotated[bool, typer.Option("--json", help="Print the recommendations as JSON.")] = False,
) -> None:
    """Which depth to run at which load: per drafter and workload, a per-batch-size k schedule from the
    campaign's closed-loop throughput speedups (k 0 = off where speculation stops paying), printed with the
    evidence behind each range and as a ready --speculative-config JSON (vLLM's
    num_speculative_tokens_per_batch_size). Exit 1 when the campaign has nothing to recommend from."""
    import json

    from analysis.data import load_campaign
    from analysis.recommend import recommend
    from analysis.report import fmt_interval
    from warehouse.db import reader

    with reader(db, on_wait=say_waiting) as con:
        data = load_campaign(con, campaign_id)
    found = [r for r in recommend(data, max_batch=max_batch) if workload in (None, r.workload)]
    if as_json:
        typer.echo(json.dumps([r.as_dict() for r in found], indent=2))
    for r in [] if as_json else found:
        columns = ("C", "best k", "speedup", "runner-up", "edge over it", "run k")
        table = titled_table(f"{r.family} on {r.workload} ({data.campaign_id})", columns)
        for c in r.choices:
            edge = "–" if c.edge is None else fmt_interval(c.edge, c.edge_low, c.edge_high, c.edge_interval)
            runner = "–" if c.runner_up_k is None else f"k={c.runner_up_k}"
            run = "off" if c.k == 0 else str(c.k)
            speedup = fmt_interval(c.speedup, c.speedup_low, c.speedup_high, c.speedup_interval)
            table.add_row(str(c.concurrency), str(c.best_k), speedup, runner, edge, run)
        console.print(table)
        console.print(f"schedule [batch_from, batch_to, k]: {r.schedule}", markup=False)
        for note in r.caveats:
            console.print(f"  caveat: {note}", markup=False)
        if r.config is None:
            console.print("speculative config: none (speculation does not pay at any measured load)")
        else:
            console.print(f"--speculative-config '{json.dumps(r.deployable_config())}'", markup=False)
    if not found:
        console.print(f"nothing to recommend from in {data.campaign_id}: no closed-loop speedups")
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.add_typer(reports_app, name="reports")
    app.command("analyze")(analyze_cmd)
    app.command("report")(report_cmd)
    app.command("recommend")(recommend_cmd)
