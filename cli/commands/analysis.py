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
from rich.table import Table

from cli.commands.warehouse_options import DbOption, say_waiting

console = Console(soft_wrap=True)

ReportsOption = Annotated[
    Path | None,
    typer.Option(
        "--reports-dir",
        help="Where report folders go (<dir>/<campaign_id>/index.html). Default: SPECGAUGE_HOME/reports.",
        file_okay=False,
    ),
]


def _run(campaign_id: str | None, db: Path | None, reports_dir: Path | None, resamples: int | None = None):
    from analysis.data import AnalysisSettings
    from analysis.run import analyze_campaign

    settings = AnalysisSettings() if resamples is None else AnalysisSettings(resamples=resamples)
    return analyze_campaign(campaign_id, db, settings=settings, reports_dir=reports_dir, on_wait=say_waiting)


def _print_summary(result) -> None:
    decisions = result.results.decisions
    table = Table(title=f"decisions for {result.campaign_id}", title_justify="left")
    for column in ("variant", "workload", "load", "gain [interval]", "success", "gate", "wins", "reason"):
        table.add_column(column)
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


def register(app: typer.Typer) -> None:
    @app.command("analyze")
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
        resamples: Annotated[
            int | None, typer.Option(help="Bootstrap resamples per interval (default 9999).", min=99)
        ] = None,
    ) -> None:
        """Answer the five research questions for a campaign already in the warehouse.

        Speedups against plain with bootstrap intervals over repeats, acceptance fits, depth and break-even,
        n-gram vs draft model, capacity under the SLO, crossover loads, and the decision rule. Results replace
        the campaign's rows in the `analysis_*` tables (one transaction); charts (HTML + PNG) and a
        self-contained report page go to SPECGAUGE_HOME/reports/<campaign_id>/. The last line printed is the
        report page's path.
        """
        result = _run(campaign_id, db, reports_dir, resamples)
        _print_summary(result)
        typer.echo(str(result.report))

    @app.command("report")
    def report_cmd(
        campaign_id: Annotated[
            str | None, typer.Argument(help="Campaign whose report to show (or use --latest).")
        ] = None,
        latest: Annotated[
            bool, typer.Option("--latest", help="The latest campaign in the warehouse.")
        ] = False,
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
