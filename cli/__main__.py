"""`python -m cli ...`: the same app as the `specgauge` console script."""

from cli.app import app

app(prog_name="specgauge")
