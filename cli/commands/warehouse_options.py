"""What the command groups that open the warehouse (warehouse, analysis) share: the --db and --lock-timeout
options and the note printed while waiting for another writer."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

_err_console = Console(stderr=True, soft_wrap=True)

DbOption = Annotated[
    Path | None,
    typer.Option(
        "--db",
        help="DuckDB warehouse file. Default: SPECGAUGE_WAREHOUSE, else SPECGAUGE_HOME/warehouse.duckdb.",
        dir_okay=False,
    ),
]
LockTimeout = Annotated[
    float | None,
    typer.Option(
        "--lock-timeout",
        help="Seconds to wait for another writer to finish before giving up (default: wait as long as it takes).",
    ),
]


def say_waiting(message: str) -> None:
    """on_wait for warehouse.db's reader/writer: tell the user on stderr why nothing happens yet."""
    _err_console.print(f"[yellow]{message}[/yellow]", highlight=False)
