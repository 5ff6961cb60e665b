"""The command line: one typer app (`app.py`), one module per command group (`commands/`)."""
