"""The `specgauge` command line. Each command is a thin shell over plain functions elsewhere."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from specgauge.prefect_env import configure as _configure_prefect

_configure_prefect()  # before anything imports prefect: the repo's profiles, PREFECT_HOME under var/

app = typer.Typer(
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


# Each area registers its own commands (specgauge/commands/<area>.py exposes register(app)).
COMMAND_MODULES: list[str] = [
    "analysis",
    "blocks",
    "campaign",
    "emulator",
    "gate",
    "metrics",
    "patches",
    "profile",
    "warehouse",
]


def _register_command_modules() -> None:
    import importlib

    for name in COMMAND_MODULES:
        importlib.import_module(f"specgauge.commands.{name}").register(app)


_register_command_modules()


def main() -> None:  # pragma: no cover - console script entry
    app()


if __name__ == "__main__":  # pragma: no cover
    app()
