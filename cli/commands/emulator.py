"""`specgauge emulator`: run the in-repo OpenAI-compatible emulator (the options are emulator/config.py's)."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    @app.command(
        "emulator",
        context_settings={"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": []},
        add_help_option=False,
    )
    def emulator(ctx: typer.Context) -> None:
        """Run a fake vLLM (OpenAI-compatible streaming server with vLLM's /metrics and fault injection)
        for client tests and load-generator benchmarks; never evidence that a feature works.
        `specgauge emulator --help` lists every option (TTFT, step time, speculation, faults)."""
        from emulator.launch import main

        main(list(ctx.args), prog="specgauge emulator")
