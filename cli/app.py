"""The `specgauge` command line. Each command is a thin shell over plain functions elsewhere.

One error boundary for every command: the project's errors (specgauge.errors.SpecgaugeError and its
subclasses, the warehouse's included) become one line `error: <message>` on stderr and exit code
EXIT_ERROR, never a traceback. Commands do not catch them themselves; they only choose exit 1 for a
negative answer (a gate that failed, artifacts quarantined, problems found in a file)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from typer.core import TyperGroup

from specgauge.errors import SpecgaugeError
from specgauge.prefect_env import configure as _configure_prefect

_configure_prefect()  # before anything imports prefect: the repo's profiles, PREFECT_HOME under var/

EXIT_ERROR = 2  # the command could not do its job: bad input, a missing artifact, a failed launch, ...


def report_error(exc: SpecgaugeError) -> None:
    """The one way a command reports the project's errors: `error: ` and the message (it names the file,
    field or artifact concerned), unwrapped and without markup so that tools can parse it."""
    from specgauge.redact import redact_text

    sys.stderr.write(f"error: {redact_text(str(exc))}\n")
    sys.stderr.flush()


class ErrorBoundary(TyperGroup):
    """The root command group: every subcommand runs inside its invoke, so one except clause covers all."""

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except SpecgaugeError as exc:
            report_error(exc)
            raise typer.Exit(code=EXIT_ERROR) from None


app = typer.Typer(
    cls=ErrorBoundary,
    name="specgauge",
    help="Measure whether speculative decoding pays for a served model: launch, load, gate, warehouse, report.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
workloads_app = typer.Typer(help="Workload corpora (JSONL): validate them.", no_args_is_help=True)
app.add_typer(workloads_app, name="workloads")

console = Console()
err_console = Console(stderr=True)


@workloads_app.command("validate")
def workloads_validate(
    files: Annotated[list[Path], typer.Argument(help="Workload JSONL files to check.")],
) -> None:
    """Check workload files. Exit 0 when all are valid; otherwise print every problem as FILE:LINE: field: message."""
    from workloads.schema import check_file

    bad = 0
    for path in files:
        prompts, problems = check_file(path)
        for problem in problems:
            typer.echo(str(problem), err=True)  # one problem a line, never wrapped: tools parse this
        if problems:
            bad += 1
        else:
            strata = sorted({p.workload for p in prompts})
            console.print(f"{path}: ok, {len(prompts)} prompts, strata: {', '.join(strata)}", markup=False)
    if bad:
        raise typer.Exit(code=1)


@app.command("reap")
def reap() -> None:
    """Stop deployments that a crashed or killed run left behind (from the deployment ledger)."""
    from blocks import SavedBlocks
    from tasks.launch import reap_leftovers

    done = reap_leftovers(saved=SavedBlocks())
    for entry in done:
        console.print(f"{entry['id']} ({entry['launcher']}): {entry['outcome']}", markup=False)
    if not done:
        console.print("nothing left behind")


# Each area registers its own commands (cli/commands/<area>.py exposes register(app)).
COMMAND_MODULES: list[str] = [
    "analysis",
    "blocks",
    "campaign",
    "decide",
    "drafters",
    "emulator",
    "gate",
    "imports",
    "metrics",
    "patches",
    "profile",
    "simulate",
    "warehouse",
]


def _register_command_modules() -> None:
    import importlib

    for name in COMMAND_MODULES:
        importlib.import_module(f"cli.commands.{name}").register(app)


_register_command_modules()


def main() -> None:  # pragma: no cover - console script entry
    app()


if __name__ == "__main__":  # pragma: no cover
    app()
